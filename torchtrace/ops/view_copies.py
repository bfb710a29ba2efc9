"""The `*_copy` twins of view ops (torch.view_copy, permute_copy, ...): the view's rule, with a copied result.

A copy twin computes the same elements as its view, only in fresh memory, so its gradient is the view's: each
twin reuses the view's rule (its forward, then a copy; its backward unchanged). as_strided and its twins live in
strided.py (memory positions, not shapes).
"""
from typing import Any, Callable, Sequence

import torch

from torchtrace.autograd.dispatch import NON_DIFFERENTIABLE
from torchtrace.autograd.function import RULES
from torchtrace.ops.rule_tables import make_rule
from torchtrace.ops.shape import part_of

T = torch.Tensor


def _copied(out: Any) -> Any:
    if isinstance(out, torch.Tensor):
        return out.clone(memory_format=torch.contiguous_format)
    return type(out)(o.clone(memory_format=torch.contiguous_format) for o in out)


def copy_twin(view: Callable, targets: Sequence[Callable]) -> type:
    """Register `targets` to the rule of `view`, with the forward's result copied out of x's memory."""
    rule = RULES[view]

    def forward(ctx: Any, x: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        return _copied(rule.forward(ctx, x, *args, **kwargs))

    return make_rule(rule.__name__ + "Copy", f"{rule.__doc__} (a copy, not a view)", forward, rule.backward, targets)


for _view, _copies in [
    (T.view, [torch.view_copy]),
    (torch.permute, [torch.permute_copy]),
    (T.expand, [torch.expand_copy]),
    (torch.diagonal, [torch.diagonal_copy]),
    (torch.select, [torch.select_copy]),
    (torch.squeeze, [torch.squeeze_copy]),
    (torch.unsqueeze, [torch.unsqueeze_copy]),
    (torch.t, [torch.t_copy]),
    (torch.transpose, [torch.transpose_copy]),
    (torch.unbind, [torch.unbind_copy]),
    (T.split, [torch.split_copy]),
    (torch.split_with_sizes, [torch.split_with_sizes_copy]),
    (T.unfold, [torch.unfold_copy]),
    (torch.narrow, [torch.narrow_copy, T.narrow_copy]),
    (torch.clone, [torch.alias_copy]),
]:
    copy_twin(_view, _copies)

part_of("SliceCopy", [torch.slice_copy], torch.slice_scatter).__module__ = __name__
NON_DIFFERENTIABLE.add(torch.detach_copy)  # like detach: the copy carries no gradient
