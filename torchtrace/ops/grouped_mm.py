"""torch._grouped_mm (a mixture-of-experts kernel: one matmul per group, as Mixtral's experts run it).

Groups are cut by `offs`, the cumulative end of each group along the dim it splits (s_i = offs[i-1], e_i = offs[i]):
    2-D x 3-D: y[s:e]     = A[s:e] B_i            ->  dA[s:e] = g[s:e] B_i^T,    dB_i = A[s:e]^T g[s:e]
    3-D x 2-D: y[:, s:e]  = A_i B[:, s:e]         ->  dA_i = g[:, s:e] B[:, s:e]^T,  dB[:, s:e] = A_i^T g[:, s:e]
    2-D x 2-D: y_i        = A[:, s:e] B[s:e]      ->  dA[:, s:e] = g_i B[s:e]^T,  dB[s:e] = A[:, s:e]^T g_i
    3-D x 3-D: y_i = A_i B_i (no offs)            ->  dA = g B^T, dB = A^T g
Rows (or columns) past the last offset belong to no group (torch leaves them unset): their gradient is 0.
"""
from typing import Any, List, Optional, Tuple

import torch

from torchtrace.autograd.function import Function, register
from torchtrace.errors import UnsupportedOperationError

Tensor = torch.Tensor


def _mT(t: Tensor) -> Tensor:
    return t.transpose(-1, -2)


def _joined(pieces: List[Tensor], dim: int, size: int) -> Tensor:
    """The pieces of the groups concatenated along dim, zeros after the last group up to `size`."""
    covered = sum(p.shape[dim] for p in pieces)
    if covered < size:
        shape = list(pieces[0].shape)
        shape[dim] = size - covered
        pieces = [*pieces, pieces[0].new_zeros(shape)]
    return torch.cat(pieces, dim)


# (A's dims, B's dims) -> (dA, dB) as functions of (A, B, g, [(i, (s_i, e_i)), ...]), the table in the docstring
GRADIENTS = {
    (2, 3): (lambda a, b, g, groups: _joined([g[s:e] @ _mT(b[i]) for i, (s, e) in groups], 0, a.shape[0]),
             lambda a, b, g, groups: torch.stack([_mT(a[s:e]) @ g[s:e] for _, (s, e) in groups])),
    (3, 2): (lambda a, b, g, groups: torch.stack([g[:, s:e] @ _mT(b[:, s:e]) for _, (s, e) in groups]),
             lambda a, b, g, groups: _joined([_mT(a[i]) @ g[:, s:e] for i, (s, e) in groups], 1, b.shape[1])),
    (2, 2): (lambda a, b, g, groups: _joined([g[i] @ _mT(b[s:e]) for i, (s, e) in groups], 1, a.shape[1]),
             lambda a, b, g, groups: _joined([_mT(a[:, s:e]) @ g[i] for i, (s, e) in groups], 0, b.shape[0])),
}


@register(torch._grouped_mm)
class GroupedMm(Function):
    """y = one matmul per group of A and B (cut by offs)  ->  each group's dA = g B^T, dB = A^T g (module docstring)"""

    @staticmethod
    def forward(ctx: Any, input: Tensor, mat2: Tensor, offs: Optional[Tensor] = None, bias: Optional[Tensor] = None,
                out_dtype: Optional[torch.dtype] = None) -> Tensor:
        if bias is not None or out_dtype is not None:
            raise UnsupportedOperationError("torch._grouped_mm: bias= and out_dtype= have no gradient rule in "
                                            "torchtrace — add the bias after the call, and cast the result")
        ctx.save_for_backward(input, mat2)
        ctx.bounds = None if offs is None else [int(e) for e in offs.tolist()]
        return torch._grouped_mm(input, mat2, offs=offs)

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> Tuple[Optional[Tensor], Optional[Tensor], None, None, None]:
        a, b = ctx.saved_tensors
        need_a, need_b = ctx.needs_input_grad[:2]
        if ctx.bounds is None:  # 3-D x 3-D: a batched matmul
            return (g @ _mT(b) if need_a else None), (_mT(a) @ g if need_b else None), None, None, None
        groups = list(enumerate(zip([0, *ctx.bounds[:-1]], ctx.bounds)))
        grad_a, grad_b = GRADIENTS[min(a.dim(), 3), min(b.dim(), 3)]
        return (grad_a(a, b, g, groups) if need_a else None), (grad_b(a, b, g, groups) if need_b else None), None, \
            None, None
