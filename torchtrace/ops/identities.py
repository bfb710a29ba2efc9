"""Ops that are the identity (or constant) on real tensors: conj, conj_physical, resolve_conj, resolve_neg,
real, angle, and fft.fftshift / fft.ifftshift (a roll).

torchtrace has no complex support, so each refuses complex inputs clearly.
"""
import numbers
from typing import Any, Callable, Optional, Sequence, Tuple, Union

import torch

from torchtrace.errors import UnsupportedOperationError
from torchtrace.naming import callable_name
from torchtrace.ops.rule_tables import unary

T = torch.Tensor


def real_only(op: Callable, x: torch.Tensor) -> None:
    """Refuse complex tensors (torchtrace follows no conjugate-Wirtinger convention yet)."""
    if x.is_complex():
        raise UnsupportedOperationError(
            f"{callable_name(op)}: complex tensors are not supported — torchtrace differentiates real tensors only; "
            "keep real and imaginary parts as two real tensors")


def identity(name: str, targets: Sequence[Callable], math_line: str) -> type:
    """y = op(x), the identity on real x: dy/dx = 1."""
    return unary(name, targets, math_line, lambda g, x, y: g, uses=(),
                 check=lambda x: real_only(targets[0], x), inputs=("input",))


identity("Conj", [torch.conj, T.conj], "y = conj x = x on real x  ->  dy/dx = 1")
identity("ConjPhysical", [torch.conj_physical, T.conj_physical], "y = conj x = x on real x  ->  dy/dx = 1")
identity("ResolveConj", [torch.resolve_conj, T.resolve_conj], "y = x (conj bit resolved)  ->  dy/dx = 1")
identity("ResolveNeg", [torch.resolve_neg, T.resolve_neg], "y = x (neg bit resolved)  ->  dy/dx = 1")
identity("Real", [torch.real], "y = Re x = x on real x  ->  dy/dx = 1")


unary("Angle", [torch.angle, T.angle], "y = angle x = pi [x < 0] on real x (NaN stays NaN)  ->  dy/dx = 0 (as torch)",
      lambda g, x, y: torch.zeros_like(g), uses=(), check=lambda x: real_only(torch.angle, x), inputs=("input",))


Dims = Optional[Union[int, Sequence[int]]]


def shifts(shape: Sequence[int], dim: Dims, inverse: bool) -> Tuple[list, list]:
    """fftshift rolls each dim by n // 2, ifftshift by -(n // 2) (= (n + 1) // 2 mod n)."""
    dims = list(range(len(shape))) if dim is None else [dim] if isinstance(dim, numbers.Integral) else list(dim)
    return [-(shape[d] // 2) if inverse else shape[d] // 2 for d in dims], dims


def _unshift(inverse: bool) -> Callable:
    """dx = g rolled back by the shifts of x's shape."""
    def grad(g: torch.Tensor, x: Any, y: Any, dim: Dims) -> torch.Tensor:
        rolled, dims = shifts(x.shape, dim, inverse)
        return torch.roll(g, [-s for s in rolled], dims)

    return grad


unary("FftShift", [torch.fft.fftshift], "y = roll(x, n // 2) over dims  ->  dx = roll(g, -(n // 2))", _unshift(False),
      uses=("x.meta",), options={"dim": None}, check=lambda x: real_only(torch.fft.fftshift, x), inputs=("input",))
unary("IfftShift", [torch.fft.ifftshift], "y = roll(x, -(n // 2)) over dims  ->  dx = roll(g, n // 2)", _unshift(True),
      uses=("x.meta",), options={"dim": None}, check=lambda x: real_only(torch.fft.ifftshift, x), inputs=("input",))
