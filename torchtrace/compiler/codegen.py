"""Writing values and torch callables as Python source that needs only `import torch`."""
import functools
import math
import numbers
import textwrap
from typing import Any, Callable, Dict, Iterator, Optional, Tuple

import torch

from torchtrace.compiler.tracing.symbolic_float import SymbolicFloat
from torchtrace.errors import UnsupportedOperationError
from torchtrace.naming import callable_name

_ROOT = {"torch": torch}
_NAMESPACES = ("torch", "torch.nn.functional", "torch._C._nn", "torch.special", "torch._C._special", "torch.linalg",
               "torch._C._linalg", "torch.fft", "torch._C._fft", "torch._C._VariableFunctions")
_SYMBOLS = {"add": "+", "sub": "-", "mul": "*", "truediv": "/", "floordiv": "//", "mod": "%", "pow": "**",
            "matmul": "@", "and": "&", "or": "|", "xor": "^", "lshift": "<<", "rshift": ">>"}
_BINARY = {f"__{op}__": (symbol, False) for op, symbol in _SYMBOLS.items()}
_BINARY.update({f"__r{op}__": (symbol, True) for op, symbol in _SYMBOLS.items()})
_BINARY.update({f"__{op}__": (symbol, False) for op, symbol in
                (("eq", "=="), ("ne", "!="), ("lt", "<"), ("le", "<="), ("gt", ">"), ("ge", ">="))})


@functools.lru_cache(maxsize=None)
def _resolve(path: str) -> Any:
    """The object a dotted path names (None if it names nothing)."""
    obj: Any = _ROOT
    first, *rest = path.split(".")
    obj = _ROOT.get(first)
    for part in rest:
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def callable_source(func: Callable) -> str:
    """'torch.mul', 'torch.Tensor.add', 'torch.nn.functional.relu': an expression that evaluates to `func`."""
    if isinstance(func, torch._ops.OpOverloadPacket):  # torch.ops.aten.threshold_backward
        return f"torch.ops.{func._qualified_op_name.replace('::', '.')}"
    if isinstance(func, torch._ops.OpOverload):  # torch.ops.aten.threshold_backward.default
        return f"{callable_source(func.overloadpacket)}.{func._overloadname}"
    name = callable_name(func)
    if name.endswith(".__get__"):
        return name
    found = _resolve(name)
    if found is func or found == func:
        return name
    short = getattr(func, "__name__", "")
    for namespace in _NAMESPACES:  # e.g. torch._C._nn.log_sigmoid, which torch.nn.functional calls logsigmoid
        if getattr(_resolve(namespace), short, None) is func:
            return f"{namespace}.{short}"
    raise UnsupportedOperationError(
        f"{name}: tt.compile cannot write this callable as plain torch code — call it outside the compiled "
        "function, or write it with torch operations")


# torch's loss kernels, which the pointwise losses' rules call directly: written as the torch.nn.functional call that
# ends in them (their reduction an enum: 0 'none', 1 'mean', 2 'sum'; then their option)
_LOSS_KERNELS = {torch._C._nn.mse_loss: ("mse_loss", ()), torch._C._nn.l1_loss: ("l1_loss", ()),
                 torch._C._nn.smooth_l1_loss: ("smooth_l1_loss", ("beta",)),
                 torch._C._nn.huber_loss: ("huber_loss", ("delta",))}


def _loss_source(func: Callable, args: tuple, kwargs: Dict[str, Any], tensor_name: Callable) -> Optional[str]:
    """`torch.nn.functional.mse_loss(x, t, reduction='mean')` for `torch._C._nn.mse_loss(x, t, 1)` (same-shaped x and
    t: what F.mse_loss computes then); None for any other call."""
    name, options = _LOSS_KERNELS.get(func, (None, ()))
    if name is None or kwargs or len(args) != 3 + len(options) or type(args[2]) is not int or not 0 <= args[2] <= 2:
        return None
    reduction = ("none", "mean", "sum")[args[2]]
    rendered = [value_source(a, tensor_name) for a in args[:2]] + [f"reduction={reduction!r}"]
    rendered += [f"{option}={value_source(v, tensor_name)}" for option, v in zip(options, args[3:])]
    return f"torch.nn.functional.{name}({', '.join(rendered)})"


def is_property(func: Callable) -> bool:
    return getattr(func, "__name__", "") == "__get__" and hasattr(func, "__self__")


def value_source(value: Any, tensor_name: Callable[[torch.Tensor], str], device_name: Optional[Callable] = None) -> str:
    """Python source for an argument: tensors by name, numbers, dtypes, devices, slices, nested sequences."""
    if isinstance(value, torch.Tensor):
        return tensor_name(value)
    if value is None or isinstance(value, (bool, str)):
        return repr(value)
    if isinstance(value, SymbolicFloat):  # a number of the call (lower.py): its name, or the arithmetic made of it
        return value.expression.render()
    if isinstance(value, numbers.Integral):
        return repr(int(value))
    if isinstance(value, numbers.Real):
        number = float(value)
        return repr(number) if math.isfinite(number) else f"float('{number}')"
    if isinstance(value, complex):
        return repr(value)
    if isinstance(value, (torch.dtype, torch.layout, torch.memory_format)):
        return str(value)
    if isinstance(value, torch.device):
        return (device_name(value) if device_name else None) or f"torch.device({str(value)!r})"
    if isinstance(value, slice):
        parts = (value.start, value.stop, value.step)
        return f"slice({', '.join(value_source(p, tensor_name, device_name) for p in parts)})"
    if value is Ellipsis:
        return "..."
    if isinstance(value, (list, tuple)):
        items = [value_source(v, tensor_name, device_name) for v in value]
        if isinstance(value, list):
            return f"[{', '.join(items)}]"
        return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k!r}: {value_source(v, tensor_name, device_name)}" for k, v in value.items()) + "}"
    raise UnsupportedOperationError(
        f"tt.compile: an argument of type {type(value).__name__} ({value!r:.60}) cannot be written into the generated "
        "code — pass tensors, numbers, dtypes or devices, or call this outside the compiled function")


def call_source(func: Callable, args: tuple, kwargs: Dict[str, Any], tensor_name: Callable,
                device_name: Optional[Callable] = None) -> str:
    """`torch.mul(t1, t2)`, `t1.sum(dim=0)`, `t1.T`: one call as source."""
    if is_property(func):
        return f"{value_source(args[0], tensor_name)}.{func.__self__.__name__}"
    source = callable_source(func)
    name = source.rpartition(".")[2] if source.startswith("torch.Tensor.") else ""
    if name in _BINARY and len(args) == 2 and not kwargs:
        left, right = (value_source(a, tensor_name, device_name) for a in args)
        symbol, reflected = _BINARY[name]
        return f"{right} {symbol} {left}" if reflected else f"{left} {symbol} {right}"
    if name in ("__neg__", "__invert__") and len(args) == 1:
        return ("-" if name == "__neg__" else "~") + value_source(args[0], tensor_name)
    loss = _loss_source(func, args, kwargs, tensor_name)
    if loss is not None:
        return loss
    if func is torch.Tensor.__getitem__ and not kwargs and len(args) == 2:
        return f"{value_source(args[0], tensor_name)}[{index_source(args[1], tensor_name)}]"
    rendered = [value_source(a, tensor_name, device_name) for a in args]
    rendered += [f"{k}={value_source(v, tensor_name, device_name)}" for k, v in kwargs.items()]
    method = source.rpartition(".")[2]
    if (source.startswith("torch.Tensor.") and not method.startswith("__") and args
            and isinstance(args[0], torch.Tensor)):
        return f"{rendered[0]}.{method}({', '.join(rendered[1:])})"
    return f"{source}({', '.join(rendered)})"


def _gelu_reading(g: str, x: str, approximate: str = "none") -> str:
    """g (Phi(x) + x phi(x)); the tanh form: g (1/2 (1 + t) + 1/2 x (1 - t^2) u'), t = tanh u."""
    if approximate == "tanh":
        b, k = math.sqrt(2 / math.pi), 0.044715
        t = f"torch.tanh({b!r} * ({x} + {k!r} * {x} ** 3))"
        return f"{g} * (0.5 * (1 + {t}) + 0.5 * {x} * (1 - {t} ** 2) * {b!r} * (1 + {3 * k!r} * {x} * {x}))"
    return (f"{g} * (0.5 * (1 + torch.erf({x} * {math.sqrt(0.5)!r})) + {x} * torch.exp({x} * {x} * -0.5) * "
            f"{1 / math.sqrt(2 * math.pi)!r})")


_READINGS = {  # aten VJP kernel -> its chain-rule reading, from the sources of its arguments
    "threshold_backward": lambda g, y, threshold: f"torch.where({y} <= {threshold}, 0.0, {g})",
    "tanh_backward": lambda g, y: f"{g} * (1 - {y} * {y})",
    "sigmoid_backward": lambda g, y: f"{g} * (1 - {y}) * {y}",
    "gelu_backward": _gelu_reading,
    "silu_backward": lambda g, x: f"{g} * torch.sigmoid({x}) * (1 + {x} * (1 - torch.sigmoid({x})))",
}


def plain_form(func: Callable, args: tuple, kwargs: Dict[str, Any], tensor_name: Callable) -> Optional[str]:
    """The chain-rule reading of an aten-internal kernel a rule calls for speed (None if it has none).

    threshold_backward(g, y, c) is g where y > c and 0 elsewhere (a NaN in y passes g): torch.where(y <= c, 0.0, g);
    tanh_backward(g, y) is g (1 - y^2), sigmoid_backward(g, y) g (1 - y) y, gelu_backward(g, x) g (Phi(x) + x phi(x)),
    silu_backward(g, x) g s (1 + x (1 - s)), s = sigmoid(x).
    """
    if isinstance(func, torch._ops.OpOverload):
        func = func.overloadpacket
    if not isinstance(func, torch._ops.OpOverloadPacket) or func.__name__ not in _READINGS or \
            getattr(torch.ops.aten, func.__name__, None) is not func:
        return None
    strings = {k: v for k, v in kwargs.items() if isinstance(v, str)}  # (gelu_backward's approximate=)
    if len(strings) != len(kwargs):
        return None
    return _READINGS[func.__name__](*(value_source(a, tensor_name) for a in args), **strings)


def index_source(index: Any, tensor_name: Callable) -> str:
    """x[1:, None, ..., idx]: an index as subscript source."""
    if isinstance(index, tuple):
        return ", ".join(index_source(i, tensor_name) for i in index) + ("," if len(index) == 1 else "") or "()"
    if isinstance(index, slice):
        start, stop, step = (value_source(p, tensor_name) if p is not None else "" for p in
                             (index.start, index.stop, index.step))
        return f"{start}:{stop}" + (f":{step}" if step else "")
    return value_source(index, tensor_name)


WIDTH = 116


def _depths(text: str, start: int = 0) -> Iterator[Tuple[int, str, int]]:
    """(index, character, bracket depth after it) for each character outside strings, from `start`."""
    depth, quote = 0, ""
    for i in range(start, len(text)):
        ch = text[i]
        if quote:
            quote = "" if ch == quote and text[i - 1] != "\\" else quote
            continue
        if ch in "'\"":
            quote = ch
            continue
        depth += (ch in "([{") - (ch in ")]}")
        yield i, ch, depth


def _top_level_commas(text: str) -> list:
    """Split `text` at commas outside brackets and strings."""
    parts, start = [], 0
    for i, ch, depth in _depths(text):
        if ch == "," and depth == 0:
            parts.append(text[start:i + 1].strip())
            start = i + 1
    tail = text[start:].strip()
    return parts + ([tail] if tail else [])


def fit(line: str, indent: str) -> list:
    """One generated line as lines of at most WIDTH characters: comments wrapped, long calls broken at commas."""
    if len(indent) + len(line) <= WIDTH:
        return [indent + line]
    if line.startswith("#"):
        return [indent + "# " + part for part in textwrap.wrap(line[1:].strip(), WIDTH - len(indent) - 2)]
    code, _, comment = line.partition("  # ")
    lines = [] if not comment else fit("# " + comment, indent)
    groups = []  # the longest bracketed group at depth 0 is the one to break
    position = code.find("(")
    while position >= 0:
        end = _matching(code, position)
        if end < 0:
            break
        groups.append((end - position, position, end))
        position = code.find("(", end)
    _, opening, closing = max(groups, default=(0, -1, -1))
    if closing < 0:
        return lines + [indent + code]
    head, inner, tail = code[:opening + 1], code[opening + 1:closing], code[closing + 1:]
    inner_indent = indent + "    "
    out, current = [indent + head], inner_indent
    for part in _top_level_commas(inner):
        if current.strip() and len(current) + len(part) + 1 > WIDTH:
            out.append(current.rstrip())
            current = inner_indent
        current += part + " "
    out.append(current.rstrip() + ")" + tail)
    return lines + out


def _matching(text: str, opening: int) -> int:
    """Index of the bracket closing text[opening] (-1 if none)."""
    return next((i for i, ch, depth in _depths(text, opening) if ch in ")]}" and depth == 0), -1)
