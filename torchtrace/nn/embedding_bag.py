"""EmbeddingBag: the rows of W picked by each bag of indices, summed, averaged or max-reduced, without the
intermediate (len, D) tensor. With b(k) the bag of position k, i_k its index, w_k its per-sample weight
(1 when none) and padding_idx entries left out:

    sum:   y[b] = sum_{k in b} w_k W[i_k]   ->  dW[r] = sum_{k: i_k = r} w_k g[b(k)],   dw_k = g[b(k)] . W[i_k]
    mean:  y[b] = (1/n_b) sum_{k in b} W[i_k]  ->  dW[r] = sum_{k: i_k = r} g[b(k)] / n_b(k)
    max:   y[b, d] = W[m_bd, d] (m_bd: the first entry of bag b holding the maximum)  ->  dW[m_bd, d] += g[b, d]
           (empty bags send nothing; torch's own max_indices output can name a row that is not the maximum, so
           the winners are found again here from y)

scale_grad_by_freq divides each contribution to dW[r] by how often r occurs in the input, as F.embedding does
and as torch documents. (torch's embedding_bag kernel on CPU divides by the wrong counts: see the tests.)
With max_norm, the looked-up rows of W are first rescaled in place to norm at most max_norm, under no_grad, as
torch does (not differentiated).
"""
import torch
import torch.nn.functional as F

from torchtrace.autograd.function import Function, register
from torchtrace.errors import UnsupportedOperationError
from torchtrace.nn.module import Module

_MODES = {"sum": 0, "mean": 1, "max": 2}


def _refuse(input: torch.Tensor, weight: torch.Tensor, sparse: bool) -> None:
    if weight.dtype == torch.long and input.is_floating_point():
        raise UnsupportedOperationError(
            "torch.nn.functional.embedding_bag: the deprecated argument order (weight, input) is not supported "
            "— call embedding_bag(input, weight, ...)")
    if sparse:
        raise UnsupportedOperationError(
            "torch.nn.functional.embedding_bag: sparse=True is not supported (torchtrace's gradients are dense) "
            "— pass sparse=False")


def _max_rows(index: torch.Tensor, bag: torch.Tensor, kept: torch.Tensor, weight: torch.Tensor,
              y: torch.Tensor) -> torch.Tensor:
    """(rows, filled) of shape (2, B, D): the row of the first entry of each bag equal to the bag's maximum in
    each column, and whether the bag has one (empty or padding-only bags do not)."""
    n, columns = index.shape[0], weight.shape[1]
    position = torch.arange(n, device=index.device).unsqueeze(1).expand(n, columns)
    hit = (weight[index] == y[bag]) & (kept > 0).unsqueeze(1)
    first = torch.full(y.shape, n, dtype=torch.long, device=index.device).scatter_reduce(
        0, bag.unsqueeze(1).expand(n, columns), torch.where(hit, position, n), "amin")
    filled = first < n
    rows = index[first.clamp(max=max(n - 1, 0))] if n else torch.zeros_like(first)
    return torch.stack([rows * filled, filled.long()])


@register(F.embedding_bag)  # what nn.EmbeddingBag calls
class EmbeddingBagFunction(Function):
    """y[b] = sum / mean / max over k in bag b of w_k W[i_k]  ->  dW[r] = sum_{k: i_k = r} w_k g[b(k)] (/ n_b for
    mean; max: g[b, d] to row m_bd),  dw_k = g[b(k)] . W[i_k]"""

    @staticmethod
    def forward(ctx, input, weight, offsets=None, max_norm=None, norm_type=2, scale_grad_by_freq=False,
                mode="mean", sparse=False, per_sample_weights=None, include_last_offset=False, padding_idx=None):
        _refuse(input, weight, sparse)
        y = F.embedding_bag(input, weight, offsets, max_norm, norm_type, scale_grad_by_freq, mode, sparse,
                            per_sample_weights, include_last_offset, padding_idx)
        if input.dim() == 2:  # a batch of equal bags, as F.embedding_bag rewrites it
            offsets = torch.arange(0, input.numel(), input.shape[1], device=input.device)
            include_last_offset = False
        index = input.reshape(-1)
        pad = -1 if padding_idx is None else padding_idx % weight.shape[0]
        bag = torch.embedding_bag(weight, index, offsets, False, _MODES[mode], False, None, include_last_offset,
                                  pad)[1]
        ctx.mode, ctx.shape, ctx.freq = mode, weight.shape, scale_grad_by_freq
        kept = (index != pad).to(weight.dtype)
        if mode == "mean":
            counts = torch.zeros(y.shape[0], dtype=weight.dtype, device=weight.device).index_add(0, bag, kept)
            kept = kept / counts.clamp(min=1)[bag]
        winners = _max_rows(index, bag, kept, weight, y) if mode == "max" else None
        psw = per_sample_weights  # saved as the input itself, so create_graph links dW to it; W only for dpsw
        needs_weight = psw is not None and ctx.needs_input_grad[8]
        ctx.save_for_backward(index, bag, kept, winners, weight if needs_weight else None, psw)
        return y

    @staticmethod
    def backward(ctx, g):
        index, bag, kept, winners, weight, psw_input = ctx.saved_tensors
        psw = psw_input.reshape(-1) if psw_input is not None else None
        grad_w = grad_psw = None
        if ctx.needs_input_grad[1]:
            if ctx.mode == "max":
                rows, filled = winners[0], winners[1].to(g.dtype)
                grad_w = g.new_zeros(ctx.shape).scatter_add(0, rows, g * filled)
            else:
                scale = kept if psw is None else kept * psw
                if ctx.freq:
                    scale = scale / torch.bincount(index, minlength=ctx.shape[0])[index]
                grad_w = g.new_zeros(ctx.shape).index_add(0, index, g[bag] * scale.unsqueeze(1))
        if psw is not None and ctx.needs_input_grad[8]:
            grad_psw = ((g[bag] * weight[index]).sum(1) * kept).reshape(psw_input.shape)
        return None, grad_w, None, None, None, None, None, None, grad_psw


class EmbeddingBag(Module, torch.nn.EmbeddingBag):
    """torch.nn.EmbeddingBag (`EmbeddingBag.from_pretrained(...)` too), recorded by torchtrace's embedding-bag rule."""
