"""Callables refused on purpose, each with the reason and what to write instead (README Limitations).

Most reach __torch_function__ whole (Python composites with their own override check), and a rule for
them would have to re-derive what their pieces already differentiate, or a randomized algorithm's path.
A refusal is registered (so the error names the reason) but marked `refused`: it is not counted or listed
as a supported op (ops/listing.py).
"""
from typing import Callable

import torch
import torch.nn.functional as F

from torchtrace.autograd.function import Function, register
from torchtrace.errors import UnsupportedOperationError
from torchtrace.naming import callable_name


def refusal(op: Callable, reason: str, *spellings: Callable, name: str = "") -> type:
    """A rule for `op` (and its other `spellings`) that refuses whenever an input requires a gradient (without
    one, torch runs it as usual)."""
    message = f"{callable_name(op)}: {reason}"

    def forward(ctx, *args, **kwargs):
        raise UnsupportedOperationError(message)

    members = {"__doc__": f"refused: {reason}", "forward": staticmethod(forward), "refused": True,
               "backward": staticmethod(lambda ctx, *grads: None)}
    return register(op, *spellings, rule=type(name or f"Refused_{op.__name__}", (Function,), members))


refusal(F.multi_head_attention_forward,
        "the functional form has no gradient rule — use tt.nn.MultiheadAttention (same parameters and outputs; its "
        "forward is made of linear / scaled_dot_product_attention rules), or F.scaled_dot_product_attention")
refusal(torch.svd_lowrank,
        "gradients through the randomized low-rank SVD are not supported (they would follow the random projection) "
        "— use torch.linalg.svd(A, full_matrices=False) and keep the first q singular triplets")
refusal(torch.pca_lowrank,
        "gradients through the randomized low-rank PCA are not supported (they would follow the random projection) "
        "— centre A and use torch.linalg.svd(A, full_matrices=False), keeping the first q triplets")
refusal(torch.as_strided_scatter,
        "not differentiable in torchtrace — torch 2.13's own gradient for its input fails torch's gradcheck (it "
        "keeps the gradient inside the view instead of outside), so there is no reference to match; write the "
        "values with y = x.clone(); y.as_strided(...).copy_(src) instead",
        torch.Tensor.as_strided_scatter, name="AsStridedScatter")


def forward_only(op: Callable, *spellings: Callable) -> type:
    """A rule for `op`, which torch computes but does not differentiate either: the forward runs, and its floating
    results need a gradient, as torch's do; a backward that reaches it raises, as torch's does ("derivative for ...
    is not implemented"). So code that only watches such a value (a histogram for a log) runs as in torch."""
    reason = ("torch has no derivative for it either, so backward cannot pass it — detach its input when it only "
              "watches values (torch.histogram(h.detach(), bins)), or keep its result out of the loss")
    message = f"{callable_name(op)}: {reason}"

    def backward(ctx, *grads):
        raise UnsupportedOperationError(message)

    def forward(ctx, *args, **kwargs):
        return op(*args, **kwargs)

    members = {"__doc__": f"refused: {reason}", "forward": staticmethod(forward), "refused": True,
               "backward": staticmethod(backward)}
    return register(op, *spellings, rule=type(f"NotDifferentiable_{op.__name__}", (Function,), members))


forward_only(torch.floor_divide, torch.Tensor.floor_divide, torch.Tensor.__floordiv__)  # (derivatives.yaml: none)
forward_only(torch.Tensor.__rfloordiv__)  # `2 // x`: its own forward (the operands arrive swapped)
forward_only(torch.histogram, torch.Tensor.histogram)
forward_only(torch.histogramdd)
forward_only(torch.bincount, torch.Tensor.bincount)
forward_only(torch.unique, torch.Tensor.unique)  # its integer inverse and counts carry no gradient: usable freely
forward_only(torch.unique_consecutive, torch.Tensor.unique_consecutive)
