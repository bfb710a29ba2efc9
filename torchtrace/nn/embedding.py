"""Embedding: a lookup table. y[k] = W[i_k] for every index i_k; the gradient of W adds up the rows' gradients.

    dW[r] = sum over the positions k with i_k = r of g[k]      (repeated indices accumulate)

computed as zeros(W.shape).index_add(0, i, g). The padding_idx row gets no gradient (its g[k] are zeroed
first); with scale_grad_by_freq each g[k] is divided by how often i_k occurs in the batch. The indices
themselves are integers and get no gradient.

With max_norm, torch first rescales in place, under no_grad, every looked-up row of W whose norm exceeds max_norm
to norm max_norm (torch.embedding_renorm_), then looks up: the rule does the same, and the rescaling, not
recorded, is not differentiated (dW as above, as torch's).
"""
import torch
import torch.nn.functional as F

from torchtrace.autograd.function import Function, register
from torchtrace.errors import UnsupportedOperationError
from torchtrace.nn.module import Module


def refuse_unsupported(sparse) -> None:
    if sparse:
        raise UnsupportedOperationError("torch.nn.functional.embedding: sparse=True is not supported (torchtrace's "
                                        "gradients are dense tensors) — pass sparse=False")


def embedding_forward(ctx, indices, weight, padding_idx, scale_grad_by_freq):
    """Remember what backward needs; padding_idx already checked by torch and made non-negative (None: none)."""
    ctx.padding_idx, ctx.scale_grad_by_freq, ctx.weight_shape = padding_idx, scale_grad_by_freq, weight.shape
    ctx.save_for_backward(indices)


def embedding_backward(ctx, g) -> torch.Tensor:
    """dW = zeros(W.shape).index_add(0, i, rows of g); padding rows zeroed, scale_grad_by_freq divides by counts."""
    (indices,) = ctx.saved_tensors
    index = indices.reshape(-1)
    rows = g.reshape(-1, ctx.weight_shape[1])
    if ctx.padding_idx is not None:
        rows = rows.masked_fill((index == ctx.padding_idx).unsqueeze(1), 0)
    if ctx.scale_grad_by_freq:
        counts = torch.bincount(index, minlength=ctx.weight_shape[0])
        rows = rows / counts[index].unsqueeze(1)
    return g.new_zeros(ctx.weight_shape).index_add(0, index, rows)


@register(F.embedding)  # what nn.Embedding calls
class EmbeddingFunction(Function):
    """y[k] = W[i_k]  ->  dW[r] = sum_{k: i_k = r} g[k]  (0 for r = padding_idx; g[k] / count(i_k) with
    scale_grad_by_freq)"""

    @staticmethod
    def forward(ctx, input, weight, padding_idx=None, max_norm=None, norm_type=2.0, scale_grad_by_freq=False,
                sparse=False):
        refuse_unsupported(sparse)
        y = F.embedding(input, weight, padding_idx, max_norm, norm_type, scale_grad_by_freq, sparse)  # (W renormed)
        embedding_forward(ctx, input, weight, None if padding_idx is None else padding_idx % weight.shape[0],
                          scale_grad_by_freq)
        return y

    @staticmethod
    def backward(ctx, g):
        return None, embedding_backward(ctx, g)


@register(torch.embedding)  # the builtin under F.embedding: weight first, padding_idx < 0 means none
class TorchEmbedding(Function):
    """torch.embedding(W, i, ...): y[k] = W[i_k]  ->  dW[r] = sum_{k: i_k = r} g[k] (0 at padding_idx);
    as F.embedding, with torch.embedding's argument order"""

    @staticmethod
    def forward(ctx, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
        refuse_unsupported(sparse)
        y = torch.embedding(weight, indices, padding_idx, scale_grad_by_freq, sparse)
        embedding_forward(ctx, indices, weight, padding_idx if padding_idx >= 0 else None, scale_grad_by_freq)
        return y

    @staticmethod
    def backward(ctx, g):
        return embedding_backward(ctx, g), None


class Embedding(Module, torch.nn.Embedding):
    """torch.nn.Embedding: num_embeddings rows of size embedding_dim, N(0, 1) init, the padding_idx row zero.

    `Embedding.from_pretrained(weights, freeze=True, padding_idx=None, ...)` works as in torch.
    """
