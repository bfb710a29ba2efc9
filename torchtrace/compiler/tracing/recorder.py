"""The recording mode: every torch call a rule makes on plain tensors becomes a `Statement`; what a straight-line
record cannot hold is refused (`Refusal`), never silently recorded.

Refused: reading a tensor's values into Python (`item`, `tolist`, `bool(t)`, `numpy`, `data_ptr`, ...), an op
whose result's shape depends on values (`nonzero`, `masked_select`, `unique`, a boolean mask, ...), a tensor that is
neither an argument, an incoming gradient nor the result of a recorded call (made behind the mode's back), and a
nested `Function.apply` (another rule's own machinery). Reads of what a tensor *is* (shape, strides, dtype,
device, contiguity) are allowed: each becomes a `read` statement whose value the generated code checks.
"""
import threading
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

import torch
from torch.overrides import TorchFunctionMode

from torchtrace.autograd.function import Function
from torchtrace.compiler.tracing.symbolic_float import Expression, SymbolicFloat, expression_of
from torchtrace.naming import callable_name

# What a tensor is, not what it holds: allowed, recorded as a check
LAYOUT_READS = {"shape", "dtype", "device", "ndim", "layout", "is_cuda", "is_sparse", "size", "dim", "ndimension",
                "numel", "nelement", "stride", "storage_offset", "is_contiguous", "element_size",
                "is_floating_point", "is_complex", "get_device", "__len__", "requires_grad", "is_leaf", "names",
                "is_quantized", "is_meta", "is_nested", "is_mkldnn", "is_conj", "is_neg", "_is_view", "result_type",
                "type", "is_inference", "is_signed"}
IGNORED_READS = {"_version", "grad_fn", "_base"}  # bookkeeping a rule may touch (save_for_backward reads versions)
# Calls that hand a tensor's values to Python, or whose result's shape depends on them (by name: a broad net)
VALUE_READS = {"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "__complex__", "__array__",
               "numpy", "data_ptr", "nonzero", "argwhere", "masked_select", "unique", "unique_consecutive", "_unique",
               "_unique2", "equal", "allclose", "is_nonzero", "bincount", "__repr__", "__str__", "__format__",
               "__contains__", "__reduce_ex__", "untyped_storage", "storage", "__iter__"}
INDEXING = {"__getitem__", "__setitem__", "index", "index_put", "index_put_", "_index_put_impl_"}
RANDOM = ("rand", "bernoulli", "normal", "uniform", "dropout", "multinomial", "exponential", "geometric", "cauchy",
          "poisson", "random", "rrelu")  # in a callable's name: it draws from torch's generator (rrelu: in training)


class _Draws(threading.local):
    count = 0  # recorded calls that drew random numbers, in this thread


DRAWS = _Draws()


def draws_random(func: Callable) -> bool:
    name = short_name(func).lower()
    return any(word in name for word in RANDOM)


class Refusal(Exception):
    """Something a straight-line record cannot hold; `kind` is "reads a value", "unknown tensor" or "nested rule"."""

    def __init__(self, kind: str, what: str) -> None:
        super().__init__(f"{kind}: {what}")
        self.kind, self.what = kind, what


class TensorRef(NamedTuple):
    """A tensor in a statement's arguments, by the name the record gave it."""

    name: str


UNKNOWN = TensorRef("?")  # in a non-strict template: a tensor the record does not know


class Number(NamedTuple):
    """A float in a statement's arguments: its expression (a constant for a plain float)."""

    expression: Expression


class Statement(NamedTuple):
    """One torch call of the rule: `outputs = func(*args, **kwargs)` ("op"), or a layout read whose `value` the
    generated code checks ("read"), in the rule's `phase` ("forward" or "backward")."""

    kind: str
    phase: str
    func: Callable
    args: Any  # the arguments as templates: TensorRef, Number, or the value itself (ints, shapes, dtypes, None...)
    kwargs: Dict[str, Any]
    outputs: Any  # the result as a template of TensorRef (a read: None)
    value: Any = None  # what a read returned


def _name_of(func: Callable) -> str:
    return getattr(func, "__name__", "") or ""


def attribute_name(func: Callable) -> Optional[str]:
    """`shape` for the getter of Tensor.shape (a property read arrives as the descriptor's `__get__`)."""
    owner = getattr(func, "__self__", None)
    return getattr(owner, "__name__", None) if _name_of(func) == "__get__" else None


def short_name(func: Callable) -> str:
    """What the record calls a callable: `torch.mul`, `Tensor.shape`."""
    attribute = attribute_name(func)
    return f"Tensor.{attribute}" if attribute else callable_name(func)


def _tensors(tree: Any) -> List[torch.Tensor]:
    if isinstance(tree, torch.Tensor):
        return [tree]
    if isinstance(tree, (list, tuple)):
        return [t for item in tree for t in _tensors(item)]
    if isinstance(tree, dict):
        return [t for item in tree.values() for t in _tensors(item)]
    return []


def plain_numbers(tree: Any) -> Any:
    """The same arguments with every symbolic float as its plain value (what torch itself is called with)."""
    if isinstance(tree, SymbolicFloat):
        return float.__float__(tree)
    if type(tree) in (list, tuple):
        return type(tree)(plain_numbers(item) for item in tree)
    if isinstance(tree, dict):
        return {k: plain_numbers(v) for k, v in tree.items()}
    return tree


class RuleRecorder(TorchFunctionMode):
    """Records the torch calls of a rule on plain tensors. Declare the arguments and incoming gradients first
    (`declare`); set `phase` before each half; read `statements` after."""

    def __init__(self) -> None:
        super().__init__()
        self.statements: List[Statement] = []
        self.phase = "forward"
        self.refusals: List[Refusal] = []  # every refusal raised, even one the rule caught and went past
        self._names: Dict[int, str] = {}
        self._alive: List[Any] = []  # every named object stays alive, so no id is reused while recording
        self._count = 0

    def declare(self, t: torch.Tensor, name: str) -> str:
        """Name a tensor the rule receives (an argument `x0`, an incoming gradient `g0`); its first name stays."""
        self._alive.append(t)
        return self._names.setdefault(id(t), name)

    def metas(self) -> Dict[str, Tuple[torch.Size, torch.dtype]]:
        """The shape and dtype of every tensor the record named, as they are now."""
        return {self._names[id(t)]: (t.shape, t.dtype) for t in self._alive if isinstance(t, torch.Tensor)}

    def template(self, tree: Any, strict: bool = True) -> Any:
        """The arguments or results as the record holds them; a tensor it does not know is refused (UNKNOWN when not
        `strict`)."""
        if isinstance(tree, torch.Tensor):
            name = self._names.get(id(tree))
            if name is None and not strict:
                return UNKNOWN
            if name is None:
                self.refuse("unknown tensor", f"a {tuple(tree.shape)} tensor that is neither an argument, an "
                            "incoming gradient nor the result of a recorded call (made behind the recording)")
            return TensorRef(name)
        if isinstance(tree, float) and not isinstance(tree, bool):
            return Number(expression_of(tree))
        if isinstance(tree, list):
            return [self.template(item, strict) for item in tree]
        if isinstance(tree, tuple) and not isinstance(tree, torch.Size):  # return_types: a tuple; named tuples too,
            items = tuple(self.template(item, strict) for item in tree)  # but in a Context's (not strict) template
            return type(tree)(*items) if not strict and hasattr(tree, "_asdict") else items
        if isinstance(tree, dict):
            return {k: self.template(v, strict) for k, v in tree.items()}
        return tree

    def refuse(self, kind: str, what: str) -> None:
        refusal = Refusal(kind, what)
        self.refusals.append(refusal)
        raise refusal

    def _check_call(self, func: Callable, args: tuple, kwargs: dict) -> None:
        owner = getattr(func, "__self__", None)
        if isinstance(owner, type) and issubclass(owner, Function):
            self.refuse("nested rule", f"{owner.__name__}.apply")
        name = _name_of(func)
        if name in VALUE_READS or (name == "where" and len(args) + len(kwargs) == 1) or (
                name == "repeat_interleave" and len(_tensors((args[1:], kwargs))) > 0):
            self.refuse("reads a value", short_name(func))
        if name in INDEXING and any(t.dtype in (torch.bool, torch.uint8) for t in _tensors((args[1:], kwargs))):
            self.refuse("reads a value", f"{short_name(func)} with a boolean mask")

    def _name_outputs(self, out: Any) -> Any:
        if isinstance(out, torch.Tensor):
            self._count += 1
            name = f"t{self._count}"
            self._alive.append(out)
            self._names[id(out)] = name
            return TensorRef(name)
        if isinstance(out, (list, tuple)):
            return tuple(self._name_outputs(item) for item in out)
        return None

    def __torch_function__(self, func: Callable, types: Any, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
        kwargs = kwargs or {}
        self._check_call(func, args, kwargs)
        if draws_random(func):
            DRAWS.count += 1
        arg_template, kwarg_template = self.template(args), self.template(kwargs)
        out = func(*plain_numbers(args), **plain_numbers(kwargs))
        name = attribute_name(func) or _name_of(func)
        if name in IGNORED_READS:
            return out
        if out is None or _tensors(out):
            self.statements.append(Statement("op", self.phase, func, arg_template, kwarg_template,
                                             self._name_outputs(out)))
        elif name in LAYOUT_READS:
            self.statements.append(Statement("read", self.phase, func, arg_template, kwarg_template, None, out))
        else:
            self.refuse("reads a value", f"{short_name(func)} returned a {type(out).__name__}")
        return out
