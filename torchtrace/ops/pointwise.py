"""Gradient rules for elementwise math: exp/log, roots, trig, activations, clamp, where, lerp, addcmul/addcdiv."""
import math
from typing import Any, Optional, Tuple

import torch
import torch.nn.functional as F

from torchtrace.autograd.function import Function, register
from torchtrace.ops.aten_forms import smooth_vjp
from torchtrace.ops.rule_tables import binary, reordered, unary

T = torch.Tensor
aten = torch.ops.aten
LN2, LN10 = math.log(2.0), math.log(10.0)

# ---- one line of math per rule ------------------------------------------------------------------------------------

unary("Exp", [torch.exp, T.exp], "y = e^x  ->  dy/dx = y",
      lambda g, x, y: g * y, uses=("y",))
unary("Exp2", [torch.exp2, T.exp2, torch.special.exp2], "y = 2^x  ->  dy/dx = y ln 2",
      lambda g, x, y: g * y * LN2, uses=("y",))
unary("Expm1", [torch.expm1, T.expm1, torch.special.expm1], "y = e^x - 1  ->  dy/dx = y + 1",
      lambda g, x, y: g * (y + 1), uses=("y",))
unary("Log", [torch.log, T.log], "y = ln x  ->  dy/dx = 1/x",
      lambda g, x, y: g / x, uses=("x",))
unary("Log2", [torch.log2, T.log2], "y = log2 x  ->  dy/dx = 1/(x ln 2)",
      lambda g, x, y: g / (x * LN2), uses=("x",))
unary("Log10", [torch.log10, T.log10], "y = log10 x  ->  dy/dx = 1/(x ln 10)",
      lambda g, x, y: g / (x * LN10), uses=("x",))
unary("Log1p", [torch.log1p, T.log1p, torch.special.log1p], "y = ln(1 + x)  ->  dy/dx = 1/(1 + x)",
      lambda g, x, y: g / (x + 1), uses=("x",))
unary("Erf", [torch.erf, T.erf, torch.special.erf], "y = erf x  ->  dy/dx = 2/sqrt(pi) e^(-x^2)",
      lambda g, x, y: g * (2 / math.sqrt(math.pi)) * torch.exp(-x * x), uses=("x",))
unary("Erfc", [torch.erfc, T.erfc, torch.special.erfc], "y = erfc x  ->  dy/dx = -2/sqrt(pi) e^(-x^2)",
      lambda g, x, y: g * (-2 / math.sqrt(math.pi)) * torch.exp(-x * x), uses=("x",))
unary("Sqrt", [torch.sqrt, T.sqrt], "y = sqrt x  ->  dy/dx = 1/(2y)",
      lambda g, x, y: g / (2 * y), uses=("y",))
unary("Rsqrt", [torch.rsqrt, T.rsqrt], "y = x^(-1/2)  ->  dy/dx = -y^3/2",
      lambda g, x, y: g * -0.5 * (y * y * y), uses=("y",))  # halved first, as torch (g y^3 overflows sooner)
unary("Square", [torch.square, T.square], "y = x^2  ->  dy/dx = 2x",
      lambda g, x, y: g * x * 2, uses=("x",))
unary("Abs", [torch.abs, torch.absolute, T.abs, T.absolute, T.__abs__],
      "y = |x|  ->  dy/dx = sgn x = x / |x|   (sign x on real x; on a complex leaf, torch's g * sgn x)",
      lambda g, x, y: g * torch.sgn(x), uses=("x",))
unary("Sin", [torch.sin, T.sin], "y = sin x  ->  dy/dx = cos x",
      lambda g, x, y: g * torch.cos(x), uses=("x",))
unary("Cos", [torch.cos, T.cos], "y = cos x  ->  dy/dx = -sin x",
      lambda g, x, y: -g * torch.sin(x), uses=("x",))
unary("Tan", [torch.tan, T.tan], "y = tan x  ->  dy/dx = 1 + y^2",
      lambda g, x, y: g * (1 + y * y), uses=("y",))
# tanh and sigmoid: g dy/dx by torch's one-pass kernels of that product (tanh_backward: g (1 - y^2); sigmoid_backward:
# g (1 - y) y; in float32 for float16 / bfloat16), as torch's formulas: the same bits, one op instead of three. Their
# own derivatives: the TanhBackward and SigmoidBackward rules below.
unary("Tanh", [torch.tanh, T.tanh, F.tanh], "y = tanh x  ->  dy/dx = 1 - y^2",
      lambda g, x, y: aten.tanh_backward(g, y), uses=("y",))
unary("Sigmoid", [torch.sigmoid, T.sigmoid, torch.special.expit, F.sigmoid], "y = 1/(1 + e^-x)  ->  dy/dx = y (1 - y)",
      lambda g, x, y: aten.sigmoid_backward(g, y), uses=("y",))


def _tanh_curvature(y: torch.Tensor) -> torch.Tensor:
    """d(1 - y^2)/dy = -2y"""
    return y * -2


def _sigmoid_curvature(y: torch.Tensor) -> torch.Tensor:
    """d((1 - y) y)/dy = 1 - 2y"""
    return 1 - 2 * y


smooth_vjp("TanhBackward", aten.tanh_backward, "r = h (1 - y^2) (tanh's VJP at its output y)  ->  dh = g (1 - y^2);  "
           "dy = -2 g h y", _tanh_curvature)
smooth_vjp("SigmoidBackward", aten.sigmoid_backward, "r = h (1 - y) y (sigmoid's VJP at its output y)  ->  "
           "dh = g (1 - y) y;  dy = g h (1 - 2y)", _sigmoid_curvature)


def _flat(g: torch.Tensor, x: Any, y: Any) -> torch.Tensor:
    """Piecewise-constant functions have derivative 0 (almost everywhere)."""
    return torch.zeros_like(g)


for _name, _targets in {
    "Sign": [torch.sign, T.sign],
    "Floor": [torch.floor, T.floor],
    "Ceil": [torch.ceil, T.ceil],
    "Round": [torch.round, T.round, torch.special.round],
    "Trunc": [torch.trunc, torch.fix, T.trunc, T.fix],
}.items():
    unary(_name, _targets, f"y = {_name.lower()} x  ->  dy/dx = 0", _flat, uses=())


def _max_grad(g: torch.Tensor, tie: torch.Tensor, loses: torch.Tensor) -> torch.Tensor:
    """Gradient of one operand of max/min: all of g where it wins, half of g on a tie (as torch)."""
    return torch.where(tie, g / 2, torch.where(loses, 0.0, g))


binary("Maximum", [torch.maximum, T.maximum], "z = max(a, b)  ->  dz/da = [a > b] + [a = b]/2, dz/db likewise",
       lambda g, a, b, z: _max_grad(g, a == b, a < b),
       lambda g, a, b, z: _max_grad(g, a == b, b < a), uses=(("a", "b"), ("a", "b")))
binary("Minimum", [torch.minimum, T.minimum], "z = min(a, b)  ->  dz/da = [a < b] + [a = b]/2, dz/db likewise",
       lambda g, a, b, z: _max_grad(g, a == b, a > b),
       lambda g, a, b, z: _max_grad(g, a == b, b > a), uses=(("a", "b"), ("a", "b")))
def _atan2_scale(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """1/(a^2 + b^2), set to 0 where it overflows (at the origin, a^2 + b^2 = 0): torch's gradient there is 0."""
    recip = 1 / (a * a + b * b)
    return torch.where(recip.isinf(), 0.0, recip)


binary("Atan2", [torch.atan2, torch.arctan2, T.atan2, T.arctan2],
       "z = atan2(a, b)  ->  dz/da = b/(a^2 + b^2), dz/db = -a/(a^2 + b^2)   (0 at the origin, as torch)",
       lambda g, a, b, z: g * b * _atan2_scale(a, b),
       lambda g, a, b, z: g * -a * _atan2_scale(a, b), uses=(("a", "b"), ("a", "b")))


# ---- rules with options, several tensor arguments or a different argument order --------------------------------------


@register(torch.relu, T.relu, F.relu)
class Relu(Function):
    """y = max(x, 0)  ->  dy/dx = [not y <= 0]   (NaN passes g, as torch; F.relu's inplace= is ignored)

    g where y > 0, else 0, by torch's masked kernel threshold_backward (torch.where is ~20x slower on CPU)."""

    @staticmethod
    def forward(ctx, input, inplace=False):
        y = torch.relu(input)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return torch.ops.aten.threshold_backward(g, y, 0)


def _clamp_grads(g: torch.Tensor, x: torch.Tensor, low: Any, high: Any, need_low: bool,
                 need_high: bool) -> Tuple[torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor]]:
    """(dz/dx, dz/dmin, dz/dmax) of z = clamp(x, min, max), with torch's conventions: x keeps the gradient where
    min <= x <= max, min gets it where x < min < max, max where x > max or max < min (a crossed range gives max)."""
    if low is None:
        inside = x <= high
    elif high is None:
        inside = x >= low
    else:
        inside = (x >= low) & (x <= high)
    grad_low = grad_high = None
    if need_low:
        grad_low = torch.where(x < low if high is None else (x < low) & (low < high), g, 0.0)
    if need_high:
        grad_high = torch.where(x > high if low is None else (x > high) | (high < low), g, 0.0)
    return torch.where(inside, g, 0.0), grad_low, grad_high


@register(torch.clamp, torch.clip, T.clamp, T.clip)
class Clamp(Function):
    """z = min(max(x, lo), hi)  ->  dz/dx = [lo <= x <= hi], dz/dlo = [x < lo < hi], dz/dhi = [x > hi or hi < lo]"""

    @staticmethod
    def forward(ctx, input, min=None, max=None):
        ctx.save_for_backward(input, min, max)
        return torch.clamp(input, min, max)

    @staticmethod
    def backward(ctx, g):
        x, low, high = ctx.saved_tensors
        return _clamp_grads(g, x, low, high, *ctx.needs_input_grad[1:3])


binary("ClampMin", [torch.clamp_min, T.clamp_min], "z = max(x, lo)  ->  dz/dx = [x >= lo], dz/dlo = [x < lo]",
       lambda g, a, b, z: _clamp_grads(g, a, b, None, False, False)[0],
       lambda g, a, b, z: _clamp_grads(g, a, b, None, True, False)[1], uses=(("a", "b"), ("a", "b")),
       inputs=("input", "min"))
binary("ClampMax", [torch.clamp_max, T.clamp_max], "z = min(x, hi)  ->  dz/dx = [x <= hi], dz/dhi = [x > hi]",
       lambda g, a, b, z: _clamp_grads(g, a, None, b, False, False)[0],
       lambda g, a, b, z: _clamp_grads(g, a, None, b, False, True)[2], uses=(("a", "b"), ("a", "b")),
       inputs=("input", "max"))


@register(torch.where)
class Where(Function):
    """z = where(c, x, y)  ->  dz/dx = [c], dz/dy = [not c]   (the one-argument where(c) has no gradient)"""

    @staticmethod
    def forward(ctx, condition, input, other):
        ctx.save_for_backward(condition)
        return torch.where(condition, input, other)

    @staticmethod
    def backward(ctx, g):
        (c,) = ctx.saved_tensors
        need = ctx.needs_input_grad
        return None, torch.where(c, g, 0.0) if need[1] else None, torch.where(c, 0.0, g) if need[2] else None


reordered("TensorWhere", Where, [T.where], (1, 0, 2), "z = x.where(c, y)  ->  dz/dx = [c], dz/dy = [not c]")


@register(torch.lerp, T.lerp)
class Lerp(Function):
    """z = a + w (b - a)  ->  dz/da = 1 - w, dz/db = w, dz/dw = b - a"""

    @staticmethod
    def forward(ctx, input, end, weight):
        need_weight = ctx.needs_input_grad[2]  # saved: only what the needed gradients read (as torch)
        ctx.save_for_backward(input if need_weight else None, end if need_weight else None, weight)
        return torch.lerp(input, end, weight)

    @staticmethod
    def backward(ctx, g):
        start, end, weight = ctx.saved_tensors
        need = ctx.needs_input_grad
        return (g * (1 - weight) if need[0] else None, g * weight if need[1] else None,
                g * (end - start) if need[2] else None)


@register(torch.addcmul, T.addcmul)
class Addcmul(Function):
    """z = x + v t1 t2  ->  dz/dx = 1, dz/dt1 = v t2, dz/dt2 = v t1"""

    op = staticmethod(torch.addcmul)

    divides = False  # Addcdiv: t2 is read for both gradients

    @staticmethod
    def forward(ctx, input, tensor1, tensor2, value=1):
        ctx.value = value
        need = ctx.needs_input_grad  # only what a gradient reads, as torch (x.addcmul_(x, c): x is changed, not read)
        ctx.save_for_backward(tensor1 if need[2] else None, tensor2 if need[1] or (need[2] and ctx._rule.divides)
                              else None)
        return ctx._rule.op(input, tensor1, tensor2, value=value)

    @staticmethod
    def backward(ctx, g):
        t1, t2 = ctx.saved_tensors
        need = ctx.needs_input_grad
        scaled = g * ctx.value
        return g, scaled * t2 if need[1] else None, scaled * t1 if need[2] else None


@register(torch.addcdiv, T.addcdiv)
class Addcdiv(Addcmul):
    """z = x + v t1 / t2  ->  dz/dx = 1, dz/dt1 = v / t2, dz/dt2 = -v t1 / t2^2"""

    op = staticmethod(torch.addcdiv)
    divides = True

    @staticmethod
    def backward(ctx, g):
        t1, t2 = ctx.saved_tensors
        need = ctx.needs_input_grad
        scaled = g * ctx.value / t2
        return g, scaled if need[1] else None, -scaled * t1 / t2 if need[2] else None
