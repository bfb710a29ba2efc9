"""Gradient rules for special functions: the gamma family, Bessel I0/I1, the normal distribution (ndtr, ndtri,
log_ndtr), erfinv/erfcx, the incomplete gamma functions, log-sum-exp of two, logit, xlogy/xlog1py and entropy.

Each derivative is written with ops that have rules of their own (digamma -> polygamma(1), i0 -> i1, i0e -> i1e,
...), so create_graph=True gives second derivatives wherever torch has them. Edge conventions follow torch's
derivatives.yaml: i1'(0) = 1/2, xlogy's d/dx is 0 where x = 0 and y <= 0, logit's gradient is NaN outside [0, 1]
(0 outside [eps, 1 - eps] when eps is given).
"""
import math
from typing import Any, Callable

import torch

from torchtrace.autograd.function import Function, register
from torchtrace.ops.rule_tables import binary, reordered, unary

T = torch.Tensor
S = torch.special
SQRT_PI, SQRT_2PI = math.sqrt(math.pi), math.sqrt(2 * math.pi)

# ---- normal distribution, error functions --------------------------------------------------------------------------

unary("Erfinv", [torch.erfinv, T.erfinv, S.erfinv], "y = erfinv x  ->  dy/dx = sqrt(pi)/2 e^(y^2)",
      lambda g, x, y: 0.5 * SQRT_PI * torch.exp(y * y) * g, uses=("y",))
unary("Erfcx", [S.erfcx], "y = e^(x^2) erfc x  ->  dy/dx = 2 x y - 2/sqrt(pi)",
      lambda g, x, y: (2.0 * x * y - 2.0 / SQRT_PI) * g, uses=("x", "y"))
unary("Ndtr", [S.ndtr], "y = Phi(x)  ->  dy/dx = e^(-x^2/2)/sqrt(2 pi)",
      lambda g, x, y: g * torch.exp(-x * x * 0.5) / SQRT_2PI, uses=("x",))
unary("Ndtri", [S.ndtri], "y = Phi^-1(x)  ->  dy/dx = sqrt(2 pi) e^(y^2/2)",
      lambda g, x, y: g * SQRT_2PI * torch.exp(y * y / 2), uses=("y",))
unary("LogNdtr", [S.log_ndtr], "y = ln Phi(x)  ->  dy/dx = e^(-y - x^2/2)/sqrt(2 pi)",
      lambda g, x, y: g / SQRT_2PI * torch.exp(-(y + x * x / 2)), uses=("x", "y"))

# ---- gamma family ---------------------------------------------------------------------------------------------------

unary("Lgamma", [torch.lgamma, T.lgamma, S.gammaln], "y = ln|Gamma(x)|  ->  dy/dx = digamma x",
      lambda g, x, y: g * torch.digamma(x), uses=("x",))
unary("Digamma", [torch.digamma, T.digamma, S.digamma, S.psi], "y = digamma x  ->  dy/dx = polygamma(1, x)",
      lambda g, x, y: g * torch.polygamma(1, x), uses=("x",))


@register(torch.polygamma, S.polygamma)
class Polygamma(Function):
    """y = polygamma(n, x)  ->  dy/dx = polygamma(n + 1, x)"""

    @staticmethod
    def forward(ctx, n, input):
        ctx.n = n
        ctx.save_for_backward(input)
        return torch.polygamma(n, input)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return None, g * torch.polygamma(ctx.n + 1, x)


reordered("TensorPolygamma", Polygamma, [T.polygamma], (1, 0), "y = x.polygamma(n)  ->  dy/dx = polygamma(n + 1, x)")


class IncompleteGamma(Function):
    """y = gammainc(a, x) = (1/Gamma(a)) int_0^x t^(a-1) e^-t dt  ->  dy/dx = x^(a-1) e^-x / Gamma(a)
    (gammaincc = 1 - gammainc: the opposite); d/da is not implemented (nor in torch's derivatives.yaml)."""

    sign = 1.0

    @staticmethod
    def forward(ctx, input, other):
        ctx.save_for_backward(input, other)
        return ctx._rule.op(input, other)

    @staticmethod
    def backward(ctx, g):
        a, x = ctx.saved_tensors
        if ctx.needs_input_grad[0]:
            raise RuntimeError(f"the derivative of {ctx._rule.op.__name__} with respect to its first argument (a) is "
                               "not implemented (nor in torch): pass a.detach()")
        return None, g * ctx._rule.sign * torch.exp((a - 1) * torch.log(x) - x - torch.lgamma(a))


register(torch.igamma, T.igamma, S.gammainc, rule=type("Igamma", (IncompleteGamma,), {
    "__doc__": IncompleteGamma.__doc__, "op": staticmethod(torch.igamma)}))
register(torch.igammac, T.igammac, S.gammaincc, rule=type("Igammac", (IncompleteGamma,), {
    "__doc__": IncompleteGamma.__doc__, "op": staticmethod(torch.igammac), "sign": -1.0}))


@register(torch.mvlgamma, T.mvlgamma, S.multigammaln)
class Mvlgamma(Function):
    """y = ln Gamma_p(x) = c + sum_j ln Gamma(x - j/2)  ->  dy/dx = sum_{j<p} digamma(x - j/2)"""

    @staticmethod
    def forward(ctx, input, p):
        ctx.p = p
        ctx.save_for_backward(input)
        return torch.mvlgamma(input, p)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        p = ctx.p  # offsets -(p-1)/2, ..., -1/2, +0.0 as torch's arange: x = -0.0 meets digamma at +0.0 (-inf)
        return g * sum(torch.digamma(x + (i * 0.5 - (p - 1) / 2)) for i in range(p)), None


# ---- modified Bessel functions of the first kind --------------------------------------------------------------------

def _tiny_safe(x: torch.Tensor) -> tuple:
    """(|x| > eps, x with the tiny entries replaced by eps): I1'(x) and I1e'(x) divide by x, with limit 1/2 at 0."""
    eps = torch.finfo(x.dtype).eps
    not_tiny = x.abs() > eps
    return not_tiny, torch.where(not_tiny, x, eps)


def _i1_grad(g: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    not_tiny, safe = _tiny_safe(x)
    return g * torch.where(not_tiny, S.i0(safe) - y * safe.reciprocal(), 0.5)


def _i1e_grad(g: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    not_tiny, safe = _tiny_safe(x)
    return g * torch.where(not_tiny, S.i0e(safe) - y * (torch.sgn(safe) + safe.reciprocal()), 0.5)


unary("I0", [torch.i0, T.i0, S.i0], "y = I0(x)  ->  dy/dx = I1(x)",
      lambda g, x, y: g * S.i1(x), uses=("x",))
unary("I0e", [S.i0e], "y = e^-|x| I0(x)  ->  dy/dx = i1e(x) - sgn(x) y",
      lambda g, x, y: g * (S.i1e(x) - torch.sgn(x) * y), uses=("x", "y"))
unary("I1", [S.i1], "y = I1(x)  ->  dy/dx = I0(x) - y/x   (1/2 where |x| <= eps)", _i1_grad, uses=("x", "y"))
unary("I1e", [S.i1e], "y = e^-|x| I1(x)  ->  dy/dx = i0e(x) - y (sgn x + 1/x)   (1/2 where |x| <= eps)",
      _i1e_grad, uses=("x", "y"))

# ---- logs of sums, logit, entropy ---------------------------------------------------------------------------------

binary("Logaddexp", [torch.logaddexp, T.logaddexp],
       "z = ln(e^a + e^b)  ->  dz/da = 1/(1 + e^(b-a)), dz/db = 1/(1 + e^(a-b))",
       lambda g, a, b, z: g / (1 + torch.exp(b - a)),
       lambda g, a, b, z: g / (1 + torch.exp(a - b)), uses=(("a", "b"), ("a", "b")))
binary("Logaddexp2", [torch.logaddexp2, T.logaddexp2],
       "z = log2(2^a + 2^b)  ->  dz/da = 1/(1 + 2^(b-a)), dz/db = 1/(1 + 2^(a-b))",
       lambda g, a, b, z: g / (1 + torch.pow(2, b - a)),
       lambda g, a, b, z: g / (1 + torch.pow(2, a - b)), uses=(("a", "b"), ("a", "b")))
unary("Entr", [S.entr], "y = -x ln x  ->  dy/dx = -(1 + ln x)",
      lambda g, x, y: g * -(1 + torch.log(x)), uses=("x",))


@register(torch.logit, T.logit, S.logit)
class Logit(Function):
    """y = ln(x/(1 - x)), x clamped to [eps, 1 - eps]  ->  dy/dx = 1/(x (1 - x)) inside, 0 outside (NaN w/o eps)"""

    @staticmethod
    def forward(ctx, input, eps=None):
        ctx.eps = eps
        ctx.save_for_backward(input)
        return torch.logit(input, eps)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        low = 0.0 if ctx.eps is None else ctx.eps
        outside = 0.0 if ctx.eps is not None else math.nan
        return torch.where((x < low) | (x > 1 - low), outside, g / (x * (1 - x))), None


def _x_log_grad(g: torch.Tensor, a: Any, b: Any, log_fn: Callable, pole: float) -> torch.Tensor:
    """d/da of a log_fn(b) = log_fn(b), set to 0 where a == 0 and b is at or beyond the log's pole (as torch)."""
    return torch.where((a == 0) & (b <= pole), 0.0, log_fn(g, b))


binary("Xlogy", [torch.xlogy, T.xlogy, S.xlogy], "z = a ln b  ->  dz/da = ln b (0 where a = 0, b <= 0), dz/db = a/b",
       lambda g, a, b, z: _x_log_grad(g, a, b, torch.xlogy, 0.0),
       lambda g, a, b, z: g * a / b, uses=(("a", "b"), ("a", "b")))
binary("Xlog1py", [S.xlog1py], "z = a ln(1 + b)  ->  dz/da = ln(1 + b) (0 where a = 0, b <= -1), dz/db = a/(1 + b)",
       lambda g, a, b, z: _x_log_grad(g, a, b, S.xlog1py, -1.0),
       lambda g, a, b, z: g * a / (b + 1), uses=(("a", "b"), ("a", "b")))
