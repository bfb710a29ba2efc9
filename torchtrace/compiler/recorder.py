"""Record one run as straight-line code: every torch call becomes a line, every value read by Python a guard.

Two TorchFunctionModes do the recording. `UserCalls` sees the calls the user's function makes (on
tracers, and factories that take no tracer). When such a call records a Node, the node's rule is
run again on plain tensors under `RuleCalls`, which writes down the torch calls the rule itself makes:
its forward now, its backward later (`Program.backward`). So the code is the rules' own code, op by op.
"""
import functools
import itertools
import linecache
import os
import sys
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from torch.overrides import TorchFunctionMode

from torchtrace.autograd.engine import topological_order
from torchtrace.autograd.function import INPLACE, Function
from torchtrace.autograd.node import Context, Node, gradient_for, leaf_accumulator
from torchtrace.autograd.plain import plain_torch
from torchtrace.compiler.codegen import call_source, index_source, is_property, plain_form, value_source
from torchtrace.compiler.constants import Constants
from torchtrace.compiler.memory import COMMUTATIVE, INPLACE_FORMS, Notes, suits
from torchtrace.compiler.reads import is_metadata, shape_follows_values, writable
from torchtrace.errors import UnsupportedOperationError
from torchtrace.naming import callable_name

T = torch.Tensor
# how the guard on a data read is written where a shorter form than the call itself exists
DATA_READS = {T.item: "{}.item()", T.tolist: "{}.tolist()", T.__bool__: "bool({})", T.__int__: "int({})",
              T.__float__: "float({})", T.__index__: "int({})", T.is_nonzero: "bool({})",
              T.__complex__: "complex({})"}
REFUSED = {T.numpy: "it leaves torch, so the compiled code could not follow the values",
           T.data_ptr: "a storage address is not a value the compiled code can replay",
           T.__setstate__: "", T.__reduce_ex__: ""}
_PACKAGE_DIRS = (os.path.dirname(torch.__file__), os.path.dirname(os.path.dirname(__file__)))


def user_line() -> str:
    """'file.py:12  if x.sum() > 0:' — the innermost frame outside torch and torchtrace."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIRS):
        frame = frame.f_back
    if frame is None:
        return "<unknown>"
    where = f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"
    text = linecache.getline(frame.f_code.co_filename, frame.f_lineno).split("  #")[0].strip()
    return f"{where}  {text}" if text else where


def plain(t: torch.Tensor) -> torch.Tensor:
    with plain_torch():
        return torch.Tensor.as_subclass(t, torch.Tensor)


def tensors_in(value: Any) -> List[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in tensors_in(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in tensors_in(v)]
    return []


class Guard:
    """A value Python read from a tensor: the code is valid only while it reads the same."""

    def __init__(self, expression: str, value: Any, where: str):
        self.expression, self.value, self.where = expression, value, where


class Program:
    """Names, forward lines and backward lines of one recorded run."""

    def __init__(self, params: Dict[int, str]):
        self.names: Dict[int, str] = {}  # id(tensor) -> its name in the code
        self.keep: List[Any] = []  # every named object stays alive, so no id is reused during the trace
        self.lines: Dict[str, List[str]] = {"forward": [], "backward": []}
        self.section = "forward"
        self.known_params = params  # id(parameter or buffer) -> its dotted name
        self.captured: List[Tuple[str, torch.Tensor]] = []  # (name, tensor) reached but not passed as an input
        self.inputs: List[Tuple[str, torch.Tensor]] = []
        self.boundary: Dict[Tuple[int, int], str] = {}  # (id(node or AccumulateGrad), nr) of an input -> its name
        self.nodes: Dict[int, Tuple[Node, Context]] = {}  # id(node) -> (node, the context of its recorded rerun)
        self.node_names: Dict[Tuple[int, int], str] = {}
        self.node_values: Dict[Tuple[int, int], torch.Tensor] = {}
        self.guards: List[Guard] = []
        self.defined_forward: set = set()
        self.saved: List[str] = []  # forward names the backward reads
        self.random = False  # the code draws random numbers (so a failed guard restores the generator first)
        self.draws: List[Tuple[torch.Tensor, torch.Tensor]] = []  # generator state around each call that moved it
        self.buffers: Dict[Tuple[int, int], Any] = {}  # after record_backward: the gradient reaching each input
        self.counter = {"t": itertools.count(1), "g": itertools.count(1)}
        self.device_names: Dict[torch.device, str] = {}
        self.notes = {"forward": Notes(), "backward": Notes()}  # for memory.optimise: del and in-place rewrites
        self.plain_lines: Dict[str, Dict[int, str]] = {"forward": {}, "backward": {}}  # line -> its chain-rule form
        self.module_outputs: List[Tuple[str, torch.Tensor]] = []  # (module path, the value it returned)
        self.constants = Constants()  # Python numbers of the arithmetic, made into tensors once
        self.by_memory: Dict[tuple, str] = {}  # where a named value's data lies -> its name (x.detach() is x)
        self.optimizer_state: Dict[int, Tuple[torch.Tensor, str]] = {}  # id(state tensor) -> (its parameter, key)
        self.entry_grads: Dict[Any, torch.Tensor] = {}  # where a leaf's .grad lies when the call starts -> the leaf
        self.grad_inputs: List[torch.Tensor] = []  # the leaves whose entry .grad the code reads
        self.state_changed: set = set()  # names of tensors from outside the function that the code changes in place
        self.refusal: Optional[str] = None  # why the recorded code could not be replayed (None: it can)

    # names ---------------------------------------------------------------------------------------
    def bind(self, t: torch.Tensor, name: str) -> None:
        self.names[id(t)] = name
        self.keep.append(t)

    def fresh(self) -> str:
        prefix = "t" if self.section == "forward" else "g"
        return f"{prefix}{next(self.counter[prefix])}"

    def add_input(self, name: str, t: torch.Tensor) -> None:
        self.inputs.append((name, t))
        self.bind(t, name)
        self.defined_forward.add(name)
        self.device_names.setdefault(t.device, f"{name}.device")
        self._note_boundary(t, name)
        self._note_memory(t, name)

    def _note_memory(self, t: torch.Tensor, name: str) -> None:
        key = storage_key(t)
        if key is not None:
            self.by_memory.setdefault(key, name)

    def _note_boundary(self, t: torch.Tensor, name: str) -> None:
        """Where gradients of this input go in the eager graph: its grad_fn, or its AccumulateGrad."""
        node = getattr(t, "_tt_node", None)
        if node is not None:
            self.boundary[(id(node), t._tt_nr)] = name
        elif getattr(t, "_tt_requires_grad", False) or (type(t) is torch.Tensor and t.requires_grad):
            acc = leaf_accumulator(t)
            self.keep.append(acc)
            self.boundary[(id(acc), 0)] = name

    def tensor_name(self, t: torch.Tensor) -> str:
        """Its name; a tensor never seen is a parameter, buffer or captured tensor, passed by identity."""
        name = self.names.get(id(t))
        if name is None and getattr(t, "_tt_node", None) is not None:  # a copy the core made (x before x.add_(1))
            name = self.node_names.get((id(t._tt_node), t._tt_nr))
            if name is not None:
                self.bind(t, name)
        if name is None:  # another object for a value the code computes (x.detach(), x.data, x.as_subclass(...))
            name = self.by_memory.get(storage_key(t))
            if name is not None:
                self.bind(t, name)
        if name is None:
            leaf = self.entry_grads.get(storage_key(t))
            if leaf is not None:  # a leaf's .grad, read in place: later calls need it in the same memory
                self.grad_inputs.append(leaf)
            grad_of = f"{self.known_params[id(leaf)]}.grad" if id(leaf) in self.known_params else None
            label = (self.known_params.get(id(t)) or self._state_label(t) or grad_of
                     or f"captured{len(self.captured)}")
            name = f'params["{label}"]'
            self.captured.append((label, t))
            self.bind(t, name)
            self._note_memory(t, name)
            self._note_boundary(t, name)
        if self.section == "backward" and name in self.defined_forward and name not in self.saved:
            self.saved.append(name)
        return name

    def _state_label(self, t: torch.Tensor) -> Optional[str]:
        """'0.weight.momentum_buffer': an optimizer's state tensor, named after its parameter (None if unnamed)."""
        param, key = self.optimizer_state.get(id(t), (None, ""))
        label = self.known_params.get(id(param))
        taken = {name for name, _ in self.captured}
        return f"{label}.{key}" if label is not None and f"{label}.{key}" not in taken else None

    def note_entry_grad(self, leaf: torch.Tensor, grad: torch.Tensor) -> None:
        """`grad` is leaf's .grad when the call starts: the code reads it as params["<leaf's label>.grad"]."""
        key = storage_key(grad)
        if key is not None:
            self.entry_grads[key] = leaf

    def is_external(self, t: torch.Tensor) -> bool:
        """An input or a captured tensor (not computed inside the function)?"""
        name = self.names.get(id(t))
        return name is None or name.startswith("params[") or any(n == name for n, _ in self.inputs)

    def device_name(self, device: torch.device) -> Optional[str]:
        """`x.device` for the device of input x (so no device is baked into the code)."""
        name = self.device_names.get(device)
        owner = name[:-len(".device")] if name else None
        if owner and self.section == "backward" and owner not in self.saved:
            self.saved.append(owner)  # the backward reads x.device: x travels with the saved tensors
        return name

    # lines ---------------------------------------------------------------------------------------
    def emit(self, line: str) -> None:
        self.lines[self.section].append(line)

    def record_call(self, func: Callable, args: tuple, kwargs: dict, out: Any, where: str = "") -> None:
        """One torch call that ran: a line binding its tensor results, a guard, or nothing (metadata)."""
        if func in REFUSED:
            raise UnsupportedOperationError(
                f"{callable_name(func)}: tt.compile cannot record it — {REFUSED[func] or 'not a tensor operation'}; "
                "call it outside the compiled function")
        results = tensors_in(out)
        if not results and not is_metadata(func) and not _mutates(func) and func is not T.__setitem__ and (
                tensors_in(args) or tensors_in(kwargs)):
            self._guard_read(func, args, kwargs, out, where)
            return
        if func is T.__setitem__:  # x[i] = v changes x: a statement of its own
            target, index, value = (value_source(a, self.tensor_name, self.device_name) for a in args[:3])
            self.emit(f"{target}[{index_source(args[1], self.tensor_name)}] = {value}")
            return
        if not results:
            if _mutates(func) and args and isinstance(args[0], torch.Tensor):
                self.emit(call_source(func, args, kwargs, self.tensor_name, self.device_name))  # in place
                self._note_state_change(args[0])
            return  # metadata (shape, dtype, dim, ...): fixed by the guards on the inputs
        args = self.constants.hoist(func, args, kwargs, self.bind)
        source = call_source(func, args, kwargs, self.tensor_name, self.device_name)
        if len(results) == 1 and out is results[0] and not is_property(func) and args and out is args[0]:
            if _mutates(func):  # in place: the same tensor keeps its name
                self.emit(source)
                self._note_state_change(args[0])
            return  # x.to(x.dtype), x.contiguous(): the call returned its argument (shapes, dtypes are guards)
        if (func in _SAME_WHEN_SHAPE_KEPT or (func is T.detach and not torch.is_grad_enabled())) and _same_view(
                args[0], out):  # under no_grad (an optimizer's update), x.detach() is x to the code
            self.bind(out, self.tensor_name(args[0]))  # x.reshape(x.shape): a view with x's shape and strides is x
            return
        index = len(self.lines[self.section])
        if isinstance(out, torch.Tensor):
            target = self._define(out)
        else:
            if any(isinstance(o, (list, tuple)) for o in out):
                raise UnsupportedOperationError(f"{callable_name(func)}: tt.compile cannot unpack a nested result")
            target = ", ".join(self._define(o) if isinstance(o, torch.Tensor) else "_" for o in out)
            target += "," if len(out) == 1 else ""
        self.emit(f"{target} = {source}")
        plain_source = plain_form(func, args, kwargs, self.tensor_name)
        if plain_source is not None:
            self.plain_lines[self.section][index] = f"{target} = {plain_source}"
        self._note(func, args, kwargs, out, results, index)
        if shape_follows_values(func, args, kwargs, results):
            for t in results:  # the shape depends on the values: the code after it is valid for this shape only
                name = self.tensor_name(t)
                self.guards.append(Guard(f"{name}.shape", tuple(t.shape), where))
                self.emit(f"if {name}.shape != {tuple(t.shape)!r}:")
                reason = f"{where[:60] or callable_name(func)} gave {name}.shape == {tuple(t.shape)}"
                self.emit(f"    raise GuardFailed({reason!r})")

    def _note_state_change(self, t: torch.Tensor) -> None:
        if self.is_external(t):
            self.state_changed.add(self.tensor_name(t))

    def _guard_read(self, func: Callable, args: tuple, kwargs: dict, out: Any, where: str) -> None:
        """Python read a value computed from tensor data: the code is valid only while the same call reads the same."""
        read = [self.tensor_name(t) for t in tensors_in(args) + tensors_in(kwargs)]
        if self.refusal is None and any(name in self.state_changed for name in read):
            self.refusal = (f"{where or 'a rule'} reads the value of a tensor the call itself changed in place (a step "
                            "count, as Adam's), which differs on every call")
        if not writable(out):
            raise UnsupportedOperationError(
                f"{where or 'a rule'}: {callable_name(func)} hands Python a {type(out).__name__} computed from "
                "tensor values, which tt.compile cannot check on later calls — do this outside the compiled function")
        pattern = DATA_READS.get(func)
        expression = (pattern.format(self.tensor_name(args[0])) if pattern and len(args) == 1 and not kwargs
                      else call_source(func, args, kwargs, self.tensor_name, self.device_name))
        self.guards.append(Guard(expression, out, where))
        reason = f"{where[:60] or 'a rule'} read {expression} == {out!r}"
        self.emit(f"if {expression} != {value_source(out, self.tensor_name)}:")
        self.emit(f"    raise GuardFailed({reason!r})")

    def _note(self, func: Callable, args: tuple, kwargs: dict, out: Any, results: List[torch.Tensor],
              index: int) -> None:
        """What memory.optimise needs of line `index`: the storage of its results, and its in-place forms."""
        notes = self.notes[self.section]
        arguments = tensors_in(args) + tensors_in(kwargs)
        for t in results:
            notes.define(self.tensor_name(t), index, t, func, arguments, self.tensor_name)
        if (not isinstance(out, torch.Tensor) or func not in INPLACE_FORMS or "out" in kwargs
                or any(isinstance(v, torch.device) for v in (*args, *kwargs.values()))):
            return
        options = []
        for pos in (0, 1) if func in COMMUTATIVE and len(args) == 2 and not kwargs else (0,):
            if pos < len(args) and suits(args[pos], out):
                rest = args[:pos] + args[pos + 1:]
                names = {id(t): self.tensor_name(t) for t in arguments}  # as this line named them (and no more)
                source = functools.partial(call_source, getattr(T, INPLACE_FORMS[func]), (args[pos], *rest), kwargs,
                                           lambda t, names=names: names[id(t)])  # written only if it is used
                others = [names[id(t)] for t in tensors_in(rest) + tensors_in(kwargs)]
                options.append((names[id(args[pos])], source, others))
        if options:
            notes.inplace[index] = (self.lines[self.section][index], options)

    def _define(self, t: torch.Tensor) -> str:
        name = self.fresh()
        self.bind(t, name)
        self._note_memory(t, name)
        if self.section == "forward":
            self.defined_forward.add(name)
        return name


def _same_data(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal elements, a NaN equal to a NaN (a saved NaN is not a change)."""
    if a.is_floating_point() or a.is_complex():
        return bool(torch.all((a == b) | (a.isnan() & b.isnan())))
    return torch.equal(a, b)


def storage_key(t: torch.Tensor) -> Optional[tuple]:
    """Where t's elements lie: equal for two tensor objects that show the same data the same way."""
    with plain_torch():
        if t.layout != torch.strided or t.numel() == 0:
            return None
        return t.untyped_storage().data_ptr(), t.storage_offset(), t.shape, t.stride(), t.dtype, t.device


def _mutates(func: Callable) -> bool:
    """x.add_(y), x += y: calls that change their first argument."""
    name = getattr(func, "__name__", "")
    return (name.endswith("_") and not name.endswith("__")) or name in _INPLACE_OPERATORS


_INPLACE_OPERATORS = {f"__i{op}__" for op in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "and", "or",
                                              "xor", "lshift", "rshift", "matmul")}


_SAME_WHEN_SHAPE_KEPT = {T.reshape, T.view, T.expand, T.flatten, T.sum_to_size, T.expand_as, T.view_as,
                         T.reshape_as}


def _same_view(source: Any, out: Any) -> bool:
    return (isinstance(source, torch.Tensor) and isinstance(out, torch.Tensor) and out.shape == source.shape
            and out.stride() == source.stride() and out.data_ptr() == source.data_ptr()
            and out.dtype == source.dtype)



def call_noting_draws(program: Program, func: Callable, args: tuple, kwargs: dict) -> Any:
    """func(*args, **kwargs), noting the generator's state before and after if the call moved it.

    The replayed code draws exactly what the recorded calls drew only if the generator moved by these calls
    alone; effects.py compares the chain of states with the ones around the whole traced call.
    """
    before = torch.get_rng_state()
    out = func(*args, **kwargs)
    after = torch.get_rng_state()
    if not torch.equal(before, after):
        program.draws.append((before, after))
        program.random = True
    return out


class RuleCalls(TorchFunctionMode):
    """Write down every torch call made inside a rule (on plain tensors) as a line of the program."""

    def __init__(self, program: Program):
        super().__init__()
        self.program = program

    def __torch_function__(self, func: Callable, types: Any, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
        kwargs = kwargs or {}
        owner = getattr(func, "__self__", None)
        if isinstance(owner, type) and issubclass(owner, Function):  # a rule that calls another rule's apply
            with self:
                return owner.forward(Context(owner), *args, **kwargs)
        out = func(*args, **kwargs)
        self.program.record_call(func, args, kwargs, out)
        return out


def _rng_state() -> tuple:
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    return torch.get_rng_state(), cuda


def _set_rng_state(state: tuple) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state_all(state[1])


class UserCalls(TorchFunctionMode):
    """The calls of the user's function: each records its rule's forward, or (recording nothing) itself."""

    def __init__(self, program: Program, module_path: Callable[[], str]):
        super().__init__()
        self.program, self.module_path = program, module_path
        self.recorded = 0
        self.calling: Tuple[Any, dict] = (None, {})
        self.viewed: set = set()  # ids of tensors a view was taken of
        self.paused = False  # the call cannot be replayed: it runs eagerly, nothing more is recorded
        self.backward: Any = None  # step.InStepBackward: the backward passes the call runs inside

    def sharesmemory(self, t: torch.Tensor) -> bool:
        """Is t a view, or was a view taken of it?"""
        return getattr(t, "_tt_view", False) or id(t) in self.viewed

    def on_node(self, node: Node, args: tuple, kwargs: dict, result: Any) -> None:
        """A Node was recorded: run its rule again on plain tensors, writing down the calls it makes."""
        if self.paused:
            return
        program = self.program
        if node.autocast:
            raise UnsupportedOperationError(f"{callable_name(node.func) if node.func else node.rule.__name__}: "
                                            "tt.compile does not record ops under torch.autocast — compile outside it")
        self.recorded += 1
        label = node.rule.__name__ + (f"  [{self.module_path()}]" if self.module_path() else "")
        calling, options = self.calling
        if calling in INPLACE or (calling is node.func and options.get("inplace")):
            label += f"  ({callable_name(calling)}{'(inplace=True)' if calling is node.func else ''}: in place, "
            label += "recorded as its out-of-place twin)"
        ctx = Context(node.rule, node.edges)
        outs = self.rerun(node.rule, ctx, args, kwargs, result, label)
        program.nodes[id(node)] = (node, ctx)
        program.keep.append(node)
        for nr, raw in enumerate(outs):
            if isinstance(raw, torch.Tensor):
                program.node_names[(id(node), nr)] = program.tensor_name(raw)
                program.node_values[(id(node), nr)] = raw

    def rerun(self, rule: type, ctx: Context, args: tuple, kwargs: dict, result: Any, label: str) -> tuple:
        """rule.forward again on plain aliases of args, under RuleCalls; eager's results take the new names.

        The rerun must leave no trace: the random generator and every tensor it changes in place
        (BatchNorm's running statistics) are put back as they were.
        """
        program, aliases = self.program, {}

        def alias(value: Any) -> Any:
            if isinstance(value, torch.Tensor):
                name = program.tensor_name(value)
                a = aliases.get(id(value))
                if a is None:
                    a = aliases[id(value)] = plain(value).detach()
                    program.bind(a, name)
                return a
            if isinstance(value, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in value):
                return type(value)(alias(v) for v in value) if not hasattr(value, "_fields") else value
            return value

        plain_args = tuple(alias(a) for a in args)
        plain_kwargs = {k: alias(v) for k, v in kwargs.items()}
        program.emit(f"# {label}")
        state = _rng_state()
        before = [(a, a._version, a.clone()) for a in aliases.values()]
        with RuleCalls(program):  # grad mode as in eager: a rule may ask torch.is_grad_enabled()
            out = rule.forward(ctx, *plain_args, **plain_kwargs)
        _set_rng_state(state)
        for a, version, data in before:  # kernels such as batch_norm write running stats without a version bump
            if a._version != version or not _same_data(a, data):
                with torch.no_grad():
                    a.copy_(data)
        outs = out if isinstance(out, (list, tuple)) else (out,)
        linked = result if isinstance(result, (list, tuple)) else (result,)
        for raw, t in zip(outs, linked):
            if isinstance(raw, torch.Tensor) and isinstance(t, torch.Tensor):
                program.bind(t, program.tensor_name(raw))
        return outs

    def __torch_function__(self, func: Callable, types: Any, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
        kwargs = kwargs or {}
        if self.paused or self.backward.refused is not None or self.backward.engine_call():
            return func(*args, **kwargs)
        before = self.recorded
        self.calling = func, kwargs
        target = args[0] if args and isinstance(args[0], torch.Tensor) else None
        outside = target is not None and self.program.is_external(target)
        where = user_line()
        out = call_noting_draws(self.program, func, args, kwargs)
        for t in tensors_in(out):
            if getattr(t, "_tt_view", False):
                self.viewed.add(id(t._tt_base))
        owner = getattr(func, "__self__", None)
        if self.recorded == before and isinstance(owner, type) and issubclass(owner, Function):
            self.rerun(owner, Context(owner), args, kwargs, out, owner.__name__)  # Function.apply that recorded nothing
            return out
        if self.recorded == before:
            path = self.module_path()
            lines = self.program.lines["forward"]
            count = len(lines)
            self.program.record_call(func, args, kwargs, out, where)
            if path and len(lines) == count + 1:
                lines[-1] += f"  # {path}"
            return out
        calling, options = self.calling
        if outside and (calling in INPLACE or options.get("inplace")):
            raise UnsupportedOperationError(
                f"{callable_name(func)}: tt.compile cannot change an input of the compiled function in place (the "
                "caller's tensor would keep its old value) — use the out-of-place form, or do it before the call")
        if (calling in INPLACE or options.get("inplace")) and target is not None and self.sharesmemory(target):
            raise UnsupportedOperationError(
                f"{callable_name(func)}: tt.compile records in-place ops out of place, so a change made through a "
                "view, or to a tensor a view was taken of, would not reach the other — use the out-of-place form "
                "(e.g. y = y * 2 before taking views), or run this function eagerly")
        for t in tensors_in(out) + tensors_in(args):  # an in-place call: the tensor now holds the node's output
            node = getattr(t, "_tt_node", None)
            name = self.program.node_names.get((id(node), t._tt_nr)) if node is not None else None
            if name is not None:
                self.program.bind(t, name)
        return out


def accumulate(buffers: Dict[Tuple[int, int], Any], key: Tuple[int, int], g: torch.Tensor) -> None:
    buffers[key] = g if buffers.get(key) is None else torch.add(buffers[key], g)


def record_backward(program: Program, outputs: List[torch.Tensor]) -> List[str]:
    """Run every recorded rule's backward on plain tensors in reverse order, writing down its calls.

    The walk is the engine's (engine.py: _walk, _send): unbroadcast with sum_to_size, cast to the
    input's dtype, sum what meets in one place. Returns the names of the output gradients it takes.
    """
    program.section = "backward"
    buffers = program.buffers
    grad_names = []
    roots = []
    for i, t in enumerate(outputs):
        node = getattr(t, "_tt_node", None)
        name = f"grad{i}"
        grad_names.append(name)
        if node is not None:
            key = (id(node), t._tt_nr)
        elif getattr(t, "_tt_requires_grad", False) or (type(t) is torch.Tensor and t.requires_grad):
            key = (id(leaf_accumulator(t)), 0)  # an input returned as it is: its gradient passes straight through
        else:
            continue
        g = torch.ones_like(plain(t))
        program.bind(g, name)
        with RuleCalls(program):
            accumulate(buffers, key, g)
        if node is not None and id(node) in program.nodes:
            roots.append(node)
    run_rules(program, roots, buffers)
    return grad_names


def run_rules(program: Program, roots: List[Node], buffers: Dict[Tuple[int, int], Any]) -> List[Node]:
    """The engine's walk from `roots` over recorded nodes, each rule's backward written down as lines; the gradient
    reaching each leaf is left in `buffers` under (id(its AccumulateGrad), 0). Returns the nodes visited."""
    visited = []
    for node in topological_order(roots):
        entry = program.nodes.get(id(node))
        if entry is None:
            continue
        node, ctx = entry
        if node.hooks or node.retained:
            raise UnsupportedOperationError(
                f"{node.name}: tt.compile does not record register_hook / retain_grad on tensors inside the "
                "compiled function — register them outside it")
        visited.append(node)
        grads = [buffers.pop((id(node), nr), None) for nr in range(node.n_outputs)]
        if all(g is None for g in grads):
            continue
        doc = (node.rule.__doc__ or "").strip().splitlines()
        program.emit(f"# {node.rule.__name__}: {doc[0].strip()}" if doc else f"# {node.rule.__name__}")
        with torch.no_grad(), RuleCalls(program):  # the engine runs backward with grad mode off
            if node.n_outputs > 1:
                grads = [torch.zeros_like(program.node_values[(id(node), nr)])
                         if g is None and (id(node), nr) in program.node_values else g for nr, g in enumerate(grads)]
            result = node.rule.backward(ctx, *grads)
            result = result if isinstance(result, tuple) else (result,)
            for edge in node.edges:
                g = gradient_for(edge, result)
                if g is None:
                    continue
                if g.shape != edge.shape:
                    g = g.sum_to_size(edge.shape)
                if g.dtype != edge.dtype:
                    g = g.to(edge.dtype)
                target = edge.node
                accumulate(buffers, (id(target), edge.output_nr), g)
    return visited
