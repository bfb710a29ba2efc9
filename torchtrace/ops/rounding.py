"""Gradient rules for remainders and the floating-point representation: frac, fmod, remainder (%), fmax/fmin,
copysign, ldexp, frexp, float_power, nan_to_num, sgn, positive.

Most of these are piecewise linear, so their gradients are 1, 0 or the integer quotient; the edges
(ties, NaN operands, x = 0, non-finite values) follow torch's derivatives.yaml.
"""
import math
from typing import Any, Callable, Sequence

import torch

from torchtrace.autograd.function import Function, register
from torchtrace.errors import UnsupportedOperationError
from torchtrace.ops.arithmetic import _pow_grad_base, _pow_grad_exponent
from torchtrace.ops.rule_tables import binary, reflected, unary

T = torch.Tensor


def slope_one(name: str, targets: Sequence[Callable], math_line: str) -> type:
    """y = op(x) with dy/dx = 1: nothing is saved (so a later in-place change of x is no error, as in torch)."""
    return unary(name, targets, math_line, lambda g, x, y: g, uses=())


slope_one("Frac", [torch.frac, T.frac], "y = x - trunc x  ->  dy/dx = 1")
slope_one("Positive", [torch.positive, T.positive], "y = +x  ->  dy/dx = 1")
unary("NanToNum", [torch.nan_to_num, T.nan_to_num], "y = x with NaN/inf replaced  ->  dy/dx = [x is finite]",
      lambda g, x, y: g * torch.isfinite(x), uses=("x",))


def _real_sign_only(x: torch.Tensor) -> None:
    if x.is_complex():
        raise UnsupportedOperationError("torch.sgn: complex inputs are not supported — use it on real tensors, "
                                        "or write x / x.abs() for the complex sign")


unary("Sgn", [torch.sgn, T.sgn], "y = sgn x (real x: -1, 0 or 1)  ->  dy/dx = 0", lambda g, x, y: torch.zeros_like(g),
      uses=(), check=_real_sign_only, inputs=("input",))


def _quotient_grad(rounding_mode: str) -> Callable:
    """d/db of a - b q(a/b) = -q(a/b), q the rounded quotient (trunc for fmod, floor for remainder)."""
    return lambda g, a, b, z: -g * torch.div(a, b, rounding_mode=rounding_mode)


binary("Fmod", [torch.fmod, T.fmod], "z = a - b trunc(a/b)  ->  dz/da = 1, dz/db = -trunc(a/b)",
       lambda g, a, b, z: g, _quotient_grad("trunc"), uses=((), ("a", "b")))
Remainder = binary("Remainder", [torch.remainder, T.remainder, T.__mod__],
                   "z = a - b floor(a/b)  ->  dz/da = 1, dz/db = -floor(a/b)",
                   lambda g, a, b, z: g, _quotient_grad("floor"), uses=((), ("a", "b")))
reflected("Rremainder", Remainder, [T.__rmod__])

binary("Fmax", [torch.fmax, T.fmax], "z = fmax(a, b) (NaN loses)  ->  dz/da = [a >= b or b is NaN], dz/db = the rest",
       lambda g, a, b, z: torch.where((a >= b) | torch.isnan(b), g, 0.0),
       lambda g, a, b, z: torch.where((a >= b) | torch.isnan(b), 0.0, g), uses=(("a", "b"), ("a", "b")))
binary("Fmin", [torch.fmin, T.fmin], "z = fmin(a, b) (NaN loses)  ->  dz/da = [a <= b or b is NaN], dz/db = the rest",
       lambda g, a, b, z: torch.where((a <= b) | torch.isnan(b), g, 0.0),
       lambda g, a, b, z: torch.where((a <= b) | torch.isnan(b), 0.0, g), uses=(("a", "b"), ("a", "b")))
binary("Copysign", [torch.copysign, T.copysign], "z = |a| sign(b)  ->  dz/da = z/a (0 at a = 0), dz/db = 0",
       lambda g, a, b, z: g * torch.where(a == 0, 0.0, z / a),
       lambda g, a, b, z: torch.zeros_like(b), uses=(("a", "z"), ("b",)))
# 2.0 ** b in floating point: torch's own rule takes pow(2, b) in b's integer dtype, so 2^-2 becomes 0 there.
binary("Ldexp", [torch.ldexp, T.ldexp], "z = a 2^b  ->  dz/da = 2^b, dz/db = z ln 2",
       lambda g, a, b, z: g * torch.pow(2.0, b),
       lambda g, a, b, z: g * z * math.log(2.0), uses=(("b",), ("z",)))


def _as_double(v: Any) -> Any:
    return v.double() if isinstance(v, torch.Tensor) else v


@register(torch.float_power, T.float_power)
class FloatPower(Function):
    """z = a^b computed in float64  ->  dz/da = b a^(b-1), dz/db = a^b ln a   (pow's conventions, in float64)"""

    @staticmethod
    def forward(ctx, input, exponent):
        z = torch.float_power(input, exponent)
        ctx.save_for_backward(input, exponent, z)
        return z

    @staticmethod
    def backward(ctx, g):
        a, b, z = ctx.saved_tensors
        a, b = _as_double(a), _as_double(b)
        need_a, need_b = ctx.needs_input_grad[:2]
        return (_pow_grad_base(g, a, b, z) if need_a else None), (_pow_grad_exponent(g, a, b, z) if need_b else None)


@register(torch.frexp, T.frexp)
class Frexp(Function):
    """(m, e) = frexp x, x = m 2^e with e an integer  ->  dm/dx = 2^-e (e carries no gradient)"""

    @staticmethod
    def forward(ctx, input):
        result = torch.frexp(input)  # a named tuple (mantissa, exponent)
        ctx.save_for_backward(result.exponent)
        return result

    @staticmethod
    def backward(ctx, g_mantissa, g_exponent=None):
        (exponent,) = ctx.saved_tensors
        return g_mantissa / torch.exp2(exponent)
