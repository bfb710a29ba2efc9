"""Ops that are the identity (or constant) on real tensors: conj, conj_physical, resolve_conj, resolve_neg,
real, angle, and fft.fftshift / fft.ifftshift (a roll).

torchtrace has no complex support, so each refuses complex inputs clearly.
"""
from typing import Any, Callable, Optional, Sequence, Tuple, Union

import torch

from torchtrace.autograd.function import Function, register
from torchtrace.errors import UnsupportedOperationError
from torchtrace.naming import callable_name
from torchtrace.ops.rule_tables import make_rule

T = torch.Tensor


def real_only(op: Callable, x: torch.Tensor) -> None:
    """Refuse complex tensors (torchtrace follows no conjugate-Wirtinger convention yet)."""
    if x.is_complex():
        raise UnsupportedOperationError(
            f"{callable_name(op)}: complex tensors are not supported — torchtrace differentiates real tensors only; "
            "keep real and imaginary parts as two real tensors")


def identity(name: str, targets: Sequence[Callable], math_line: str) -> type:
    """y = op(x), the identity on real x: dy/dx = 1."""
    op = targets[0]

    def forward(ctx: Any, input: torch.Tensor) -> torch.Tensor:
        real_only(op, input)
        return op(input)

    return make_rule(name, math_line, forward, lambda ctx, g: g, targets)


identity("Conj", [torch.conj, T.conj], "y = conj x = x on real x  ->  dy/dx = 1")
identity("ConjPhysical", [torch.conj_physical, T.conj_physical], "y = conj x = x on real x  ->  dy/dx = 1")
identity("ResolveConj", [torch.resolve_conj, T.resolve_conj], "y = x (conj bit resolved)  ->  dy/dx = 1")
identity("ResolveNeg", [torch.resolve_neg, T.resolve_neg], "y = x (neg bit resolved)  ->  dy/dx = 1")
identity("Real", [torch.real], "y = Re x = x on real x  ->  dy/dx = 1")


@register(torch.angle, T.angle)
class Angle(Function):
    """y = angle x = pi [x < 0] on real x (NaN stays NaN)  ->  dy/dx = 0 (as torch)"""

    @staticmethod
    def forward(ctx, input):
        real_only(torch.angle, input)
        return torch.angle(input)

    @staticmethod
    def backward(ctx, g):
        return torch.zeros_like(g)


Dims = Optional[Union[int, Sequence[int]]]


def shifts(x: torch.Tensor, dim: Dims, inverse: bool) -> Tuple[list, list]:
    """fftshift rolls each dim by n // 2, ifftshift by -(n // 2) (= (n + 1) // 2 mod n)."""
    dims = list(range(x.dim())) if dim is None else [dim] if isinstance(dim, int) else list(dim)
    return [-(x.shape[d] // 2) if inverse else x.shape[d] // 2 for d in dims], dims


@register(torch.fft.fftshift)
class FftShift(Function):
    """y = roll(x, n // 2) over dims  ->  dL/dx = roll(g, -(n // 2))"""

    inverse = False
    op = staticmethod(torch.fft.fftshift)

    @staticmethod
    def forward(ctx, input, dim=None):
        real_only(ctx._rule.op, input)
        ctx.shifts, ctx.dims = shifts(input, dim, ctx._rule.inverse)
        return torch.roll(input, ctx.shifts, ctx.dims)

    @staticmethod
    def backward(ctx, g):
        return torch.roll(g, [-s for s in ctx.shifts], ctx.dims)


@register(torch.fft.ifftshift)
class IfftShift(FftShift):
    """y = roll(x, -(n // 2)) over dims  ->  dL/dx = roll(g, n // 2)"""

    inverse = True
    op = staticmethod(torch.fft.ifftshift)
