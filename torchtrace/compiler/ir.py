"""The recorded program as objects: a Statement per recorded torch call, Blocks of them in a trie, one Program.

A Statement says what one torch call that records a gradient was: the callable, its structural arguments by
value (shapes, dims, dtypes, flags: `key`; a Python float is a number slot, read on every call), where each
tensor argument came from (`sources`: value j, made by an earlier statement, or leaf slot L, any other tensor,
bound to an object on each call), which of them required a gradient, and the shape and dtype of each result.
Values are numbered along a path of the trie in the order statements make them; leaf slots in the order they
are first read. A Block is a straight run of statements; where a later call went another way (a branch of
the user's Python, a new shape), the block ends and its `children` start with the differing statements.
"""
import types
from typing import Any, Callable, List, Optional, Tuple

import torch

REPLAY, PASS, EAGER = "replay", "pass", "eager"  # the kinds of statement (see Statement)
TENSOR = object()  # a tensor argument's place in a key
NUMBER = object()  # a Python float's place in a key: a number slot, read on every call
_SIMPLE = (bool, int, str, type(None))  # kept in a key as (type, value)
_BOUND = (types.MethodWrapperType, types.MethodType)  # Tensor.T.__get__, Cls.apply: a new object on every access


def same_func(a: Callable, b: Callable) -> bool:
    """Is b the callable a is? By identity, or by what it is where each access makes a new object: a property's
    getter (`x.T` hands over `Tensor.T.__get__`, a new method-wrapper of the same descriptor each time) and a
    classmethod bound to its class (`Cls.apply`) compare equal by their descriptor or function and owner."""
    return a is b or (type(a) is type(b) and type(a) in _BOUND and a == b)


def describe(args: tuple, kwargs: dict) -> Tuple[tuple, List[torch.Tensor]]:
    """(key, tensors) of a call's arguments: tensors and floats are slots (a float is read on every call), the rest
    is kept by value."""
    key: List[Any] = []
    tensors: List[torch.Tensor] = []
    for value in args:
        _describe(value, key, tensors)
    for name, value in kwargs.items():
        key.append(name)
        _describe(value, key, tensors)
    return tuple(key), tensors


def _describe(value: Any, key: list, tensors: list) -> None:
    kind = type(value)
    if isinstance(value, torch.Tensor):
        key.append(TENSOR)
        tensors.append(value)
    elif kind is float:
        key.append(NUMBER)
    elif kind is bool or kind is int or value is None or kind is str:
        key.append((kind, value))
    elif kind is list or kind is tuple:
        key.append((kind, len(value)))
        for item in value:
            _describe(item, key, tensors)
    elif kind is slice:
        key.append(slice)
        for part in (value.start, value.stop, value.step):
            _describe(part, key, tensors)
    elif isinstance(value, (torch.dtype, torch.device, torch.layout, torch.memory_format, torch.Size)) \
            or value is Ellipsis:
        key.append(value)
    else:  # another object (a generator, an enum): its type is the structure, the object itself is read each call
        key.append(kind)


class Statement:
    """One recorded torch call (see the module docstring).

    kind: REPLAY (a rule's forward, run on plain tensors inside the program's node), PASS (a call that hands back
    its input: x.contiguous() of a contiguous x) or EAGER (an in-place change, a Function.apply, a call that records
    more than one node: run by the eager engine, its results read by later statements as values).
    """

    __slots__ = ("func", "kind", "rule", "key", "sources", "needs", "mask", "torch_leaf", "edges", "results",
                 "first_value", "new_slots", "module", "line", "slot_names", "example", "checks", "plan",
                 "numbers", "code", "generated", "traced_forward", "replay")

    def __init__(self, func: Callable, kind: str, key: tuple, sources: tuple, needs: tuple):
        self.func, self.kind, self.key, self.sources, self.needs = func, kind, key, sources, needs
        # (key entry, source, requires_grad) per positional argument, when the key has one entry for each (a tensor, a
        # float, or a bool/int/str/None by value): such a call is checked argument by argument, without describing it
        facts = iter(zip(sources, needs))
        self.checks = tuple((k, *next(facts)) if k is TENSOR else (k, 0, False) for k in key) if all(
            k is TENSOR or k is NUMBER or (type(k) is tuple and k[0] in _SIMPLE) for k in key) else None
        self.numbers = tuple(i for i, k in enumerate(key) if k is NUMBER)  # where its floats are (by position when
        # `checks` is set): the step keeps them, its generated backward reads them
        self.code: Any = None  # a REPLAY's backward as generated code (step_code.StepCode), or why it stays its rule
        self.generated: Optional[dict] = None  # the generated backwards of nodes that begin here (segment_code.py)
        self.traced_forward: Optional[Callable] = None  # its rule's forward as traced (step_code.py), for replay
        self.plan: Any = None  # (targets, local, new edges, first value): where its gradients go (replay.py)
        # a REPLAY with checks and a plan: its replay as generated code (statement_replay.py), for the common call
        self.replay: Optional[Callable] = None
        self.rule: Optional[type] = None
        self.mask = 0  # bit i: argument i needs a gradient (the rule's ctx.needs_input_grad)
        self.torch_leaf = False  # an argument is a plain tensor with torch's requires_grad (torch's grad mode goes off)
        self.edges: tuple = ()  # (Edge(position, shape, dtype), source) per argument needing a gradient
        self.results: tuple = ()  # (shape, dtype) of each tensor result
        self.first_value = 0  # the number of the first value this statement makes
        self.new_slots: dict = {}  # leaf slots first read here: {slot: (shape, dtype, device)}
        self.module = ""  # dotted path of the module it ran in ("" outside modules)
        self.line = ""  # 'file.py:12  h = x @ w' of the user's code
        self.slot_names: dict = {}  # slot -> a name for new leaf slots (an argument's or a parameter's name)
        self.example: Any = None  # for rendering: (args, kwargs, out) of the recording call, plain and detached

    def same_call(self, func: Callable, key: tuple) -> bool:
        return same_func(self.func, func) and self.key == key

    def describe(self) -> str:
        name = getattr(self.func, "__qualname__", getattr(self.func, "__name__", repr(self.func)))
        return f"{name}" + (f" [{self.module}]" if self.module else "") + (f" at {self.line}" if self.line else "")


class Block:
    """A straight run of statements, then the blocks a later call took instead of going on (a trie node)."""

    __slots__ = ("statements", "children", "ended", "outputs", "eager_after")

    def __init__(self, statements: Optional[List[Statement]] = None):
        self.statements: List[Statement] = statements or []
        self.children: List["Block"] = []
        self.ended = False  # a call ended after this block's last statement
        self.outputs: List[int] = []  # the values the call that ended here returned
        # a call went on eagerly after this block's last statement (an observer of every recorded op, such as
        # torch.utils.checkpoint's discovery run, began there): a call that reaches it and matches no child does too
        self.eager_after = False

    def split(self, at: int) -> None:
        """Statements from `at` on (and the children) move into one child: a new branch can start at `at`."""
        rest = Block(self.statements[at:])
        rest.children, rest.ended, rest.outputs, rest.eager_after = (
            self.children, self.ended, self.outputs, self.eager_after)
        self.statements, self.children, self.ended, self.outputs = self.statements[:at], [rest], False, []
        self.eager_after = False


class Program:
    """The trie of every path the compiled function's calls took."""

    def __init__(self, title: str):
        self.title = title
        self.inputs: List[str] = []  # the names of the function's tensor arguments, in its order
        self.root = Block()

    def blocks(self) -> List[Block]:
        found, stack = [], [self.root]
        while stack:
            block = stack.pop()
            found.append(block)
            stack.extend(reversed(block.children))
        return found

    def paths(self) -> List[List[Statement]]:
        """Every root-to-end path, as statements (the straight-line programs of the trie)."""
        return [path for path, _ in self.paths_with_outputs()]

    def paths_with_outputs(self) -> List[Tuple[List[Statement], List[int]]]:
        out: List[Tuple[List[Statement], List[int]]] = []
        stack: List[Tuple[Block, List[Statement]]] = [(self.root, [])]
        while stack:
            block, before = stack.pop()
            here = before + block.statements
            if block.ended or not block.children:
                out.append((here, block.outputs))
            stack.extend((child, here) for child in reversed(block.children))
        return out

    def attach(self, block: Block, at: int, statements: List[Statement], outputs: List[int],
               eager_after: bool = False) -> None:
        """A call left the trie at (block, at) and went on with `statements`: they become a branch there. With
        `eager_after` the call went on eagerly after them (it did not end there)."""
        if block is self.root and not block.statements and not block.children and not block.eager_after:
            block.statements.extend(statements)
        else:
            if at < len(block.statements):
                block.split(at)
            if statements:
                child = Block(statements)
                block.children.append(child)
                block = child
        if eager_after:
            block.eager_after = True
        else:
            block.ended, block.outputs = True, outputs


class Value:
    """A tensor of the generated code: named by the naming pass (`h_fc1`, `d_fc1_weight`, `t3`) from its hint."""

    __slots__ = ("hint", "name", "kind", "meta")

    def __init__(self, hint: str = "", kind: str = "t", meta: Optional[tuple] = None):
        self.hint, self.kind = hint, kind  # kind: "t" forward value, "g" gradient, "input", "param", "grad_out"
        self.name = hint
        self.meta = meta  # (shape, dtype) of the tensor it stands for, the same on every call of its path


class Op:
    """One line of generated code: `targets = func(*args, **kwargs)` (tensors in args stand for their Values),
    or a comment (func None)."""

    __slots__ = ("targets", "func", "args", "kwargs", "comment", "unpack")

    def __init__(self, targets: List[Optional[Value]], func: Optional[Callable], args: tuple = (),
                 kwargs: Optional[dict] = None, comment: str = "", unpack: bool = False):
        self.targets, self.func, self.args, self.kwargs, self.comment = targets, func, args, kwargs or {}, comment
        self.unpack = unpack  # the call returns a sequence: `a, b = ...` (`a, = ...` for one)


class Listing:
    """One path of the program lowered to code: forward and backward lines over Values."""

    def __init__(self) -> None:
        self.inputs: List[Value] = []  # the function's tensor arguments, in order
        self.params: List[Value] = []  # other leaves read: parameters, buffers, captured tensors
        self.forward: List[Op] = []
        self.backward: List[Op] = []
        self.outputs: List[Value] = []
        self.saved: List[Value] = []  # forward values the backward reads
        self.grad_outputs: List[Value] = []
        self.gradients: List[Tuple[Value, Optional[Value]]] = []  # (leaf, its gradient) for inputs, then params
        self.of: dict = {}  # id(plain tensor) -> Value, for rendering the tensors held by the ops
        self.values: dict = {}  # value number of the path -> its Value
        self.slots: dict = {}  # leaf slot of the path -> its Value
        self.numbers: List[Tuple[float, str, bool]] = []  # the path's plain numbers read anew on every call (f0, f1,
        # ...): (value when recorded, the call that took it, whether the code holds for that value only)
