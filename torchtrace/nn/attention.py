"""Attention: O = softmax(q k^T * scale + mask) v (F.scaled_dot_product_attention), and MultiheadAttention.

With S = q k^T * scale + mask, P = softmax(S) over the keys, O = P v and G = dL/dO:
    dV = P^T G,   dP = G V^T,   dS = P * (dP - rowsum(dP * P)),   dQ = dS K * scale,   dK = dS^T Q * scale,
    d(float mask) = dS   (the engine sums it back to the mask's broadcast shape).
The backward recomputes P from the saved q and k (through `AttentionWeights`, itself a rule), so every op it
runs has a rule and create_graph=True works. MultiheadAttention is made of tracer ops (F.linear, chunk,
reshape, transpose, cat, the two attention rules below), so its gradients come from their rules.
"""
import math
from typing import Any, Callable, Optional, Tuple

import torch
import torch.nn.functional as F

from torchtrace.autograd.function import Function, register
from torchtrace.nn.linear import Linear
from torchtrace.nn.module import Module
from torchtrace.ops.opmath import opmath

Tensor = torch.Tensor


def default_scale(query: Tensor, scale: Optional[float]) -> float:
    """torch's default scale 1/sqrt(E), E = the query's last dim."""
    return 1 / math.sqrt(query.size(-1)) if scale is None else scale


def mask_bias(attn_mask: Optional[Tensor], is_causal: bool, scores: Tensor) -> Optional[Tensor]:
    """The additive form of sdpa's masks: a bool mask (True = attend) and is_causal become 0 / -inf."""
    allowed = None
    if is_causal:
        length, source = scores.shape[-2:]
        allowed = torch.ones(length, source, dtype=torch.bool, device=scores.device).tril()
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        allowed = attn_mask if allowed is None else allowed & attn_mask
    elif attn_mask is not None:
        return attn_mask
    if allowed is None:
        return None
    return torch.zeros(allowed.shape, dtype=scores.dtype, device=scores.device).masked_fill(~allowed, -math.inf)


def safe_softmax(scores: Tensor) -> Tensor:
    """Softmax over the last dim; a row whose scores are all -inf (fully masked) gives zeros, as torch's sdpa."""
    p = torch.softmax(scores, -1)
    return p.masked_fill((scores == -math.inf).all(-1, keepdim=True), 0.0)


def score_gradients(dp: Tensor, p: Tensor, q: Tensor, k: Tensor, scale: float, needs: Tuple[bool, ...]) -> tuple:
    """From dL/dP to (dL/dq, dL/dk, dL/dmask) through P = softmax(q k^T * scale + mask)."""
    need_q, need_k, need_mask = needs
    dp, p, q, k = opmath(dp, p, q, k)  # (the difference cancels in bfloat16; torch's kernels sum in float32)
    ds = p * (dp - (dp * p).sum(-1, keepdim=True))
    grad_q = ds @ k * scale if need_q else None
    grad_k = ds.transpose(-2, -1) @ q * scale if need_k else None
    return grad_q, grad_k, ds if need_mask else None


def attention_weights(query: Tensor, key: Tensor, attn_mask: Optional[Tensor], is_causal: bool,
                      scale: float, safe: bool = True) -> Tensor:
    """P = softmax(q k^T * scale + mask) over the keys (fully masked rows: zeros, as sdpa; NaN unless `safe`, as
    MultiheadAttention's weights)."""
    scores = query @ key.transpose(-2, -1) * scale
    bias = mask_bias(attn_mask, is_causal, scores)
    scores = scores if bias is None else scores + bias
    return safe_softmax(scores) if safe else torch.softmax(scores, -1)


class AttentionWeights(Function):
    """P = softmax(q k^T * scale + mask)  ->  dS = P * (G - rowsum(G * P)),  dq = dS k * scale,  dk = dS^T q * scale,
    dmask = dS"""

    @staticmethod
    def forward(ctx, query, key, attn_mask=None, is_causal=False, scale=None, safe=True):
        ctx.scale = default_scale(query, scale)
        p = attention_weights(query, key, attn_mask, is_causal, ctx.scale, safe)
        ctx.save_for_backward(query, key, p)
        return p

    @staticmethod
    def backward(ctx, g):
        q, k, p = ctx.saved_tensors
        return score_gradients(g, p, q, k, ctx.scale, ctx.needs_input_grad[:3])


def repeat_kv_heads(t: Tensor, heads: int) -> Tensor:
    """enable_gqa: (..., H_kv, S, E) -> (..., heads, S, E), each key/value head serving heads // H_kv query heads."""
    kv_heads = t.size(-3)
    if kv_heads == heads:
        return t
    *batch, _, length, dim = t.shape
    return t.unsqueeze(-3).expand(*batch, kv_heads, heads // kv_heads, length, dim).reshape(*batch, heads, length, dim)


def sum_kv_heads(g: Tensor, kv_heads: int) -> Tensor:
    """The adjoint of repeat_kv_heads: sum the gradients of the query heads that shared one key/value head."""
    *batch, heads, length, dim = g.shape
    if heads == kv_heads:
        return g
    return g.reshape(*batch, kv_heads, heads // kv_heads, length, dim).sum(-3)


@register(F.scaled_dot_product_attention)
class ScaledDotProductAttention(Function):
    """O = (P * D) V, P = softmax(S), S = Q K^T * scale + mask  ->  dV = (P * D)^T G,  dS = P * (dP - rowsum(dP * P)),
    dP = (G V^T) * D,  dQ = dS K * scale,  dK = dS^T Q * scale,  dmask = dS;  D = dropout's kept/(1 - p) (1 without
    dropout)

    With dropout_p > 0 while recording, the mask D is drawn here as torch's math kernel draws it (F.dropout of P's
    shape, on a tensor of ones: D is m / (1 - p) itself) and saved: forward and backward use the same mask. After
    the same seed, that is torch's mask wherever torch runs its math kernel (the CPU, float64 on CUDA). Torch's fused
    CUDA kernels (flash, memory-efficient: float32 and lower on CUDA) consume the RNG stream their own way, so there
    outputs differ from torch's for a given seed; their distribution is the same.
    """

    @staticmethod
    def forward(ctx, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        ctx.is_causal, ctx.scale, ctx.enable_gqa = is_causal, default_scale(query, scale), enable_gqa
        ctx.save_for_backward(query, key, value, *([] if attn_mask is None else [attn_mask]))  # only tensors are saved
        ctx.keep = None
        if dropout_p <= 0:
            return F.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal, scale=scale,
                                                  enable_gqa=enable_gqa)
        if attn_mask is not None and is_causal:  # torch's own checks, which its kernel would make
            raise RuntimeError("_scaled_dot_product_attention: Explicit attn_mask should not be set when "
                               "is_causal=True")
        if dropout_p > 1:
            raise RuntimeError(f"dropout probability has to be between 0 and 1, but got {dropout_p}")
        q, k, v, mask = opmath(query, key, value, attn_mask)  # bfloat16 / float16 in float32, as torch's math kernel
        k_all, v_all = _all_heads(q, k, v, enable_gqa)
        p = attention_weights(q, k_all, mask, is_causal, ctx.scale)
        ctx.keep = F.dropout(torch.ones_like(p), dropout_p, True)  # m / (1 - p); p = 1: zeros, nothing drawn
        return ((p * ctx.keep) @ v_all).to(query.dtype)

    @staticmethod
    def backward(ctx, g):
        q, k, v, mask = (*ctx.saved_tensors, None)[:4]
        q, k, v, mask, g = opmath(q, k, v, mask, g)  # bfloat16 / float16 in float32, as torch's fused kernels
        kv_heads = k.size(-3) if ctx.enable_gqa else None  # grouped-query attention: fewer key/value heads
        k_all, v_all = _all_heads(q, k, v, ctx.enable_gqa)
        p = AttentionWeights.apply(q, k_all, mask, ctx.is_causal, ctx.scale)
        need_q, need_k, need_v, need_mask = ctx.needs_input_grad[:4]
        dropped = p if ctx.keep is None else p * ctx.keep
        grad_v = dropped.transpose(-2, -1) @ g if need_v else None
        dp = g @ v_all.transpose(-2, -1)
        dp = dp if ctx.keep is None else dp * ctx.keep
        grad_q, grad_k, grad_mask = score_gradients(dp, p, q, k_all, ctx.scale, (need_q, need_k, need_mask))
        if kv_heads is not None:
            grad_k, grad_v = (None if d is None else sum_kv_heads(d, kv_heads) for d in (grad_k, grad_v))
        return grad_q, grad_k, grad_v, grad_mask


def _all_heads(query: Tensor, key: Tensor, value: Tensor, enable_gqa: bool) -> Tuple[Tensor, Tensor]:
    """Keys and values for every query head (enable_gqa: each shared by heads // H_kv query heads)."""
    if not enable_gqa:
        return key, value
    return repeat_kv_heads(key, query.size(-3)), repeat_kv_heads(value, query.size(-3))


def additive_mask(mask: Optional[Tensor], name: str, dtype: torch.dtype) -> Optional[Tensor]:
    """MultiheadAttention's masks: a bool mask (True = do not attend) becomes 0 / -inf, a float mask is added."""
    if mask is None or mask.is_floating_point():
        return mask
    if mask.dtype != torch.bool:
        raise AssertionError(f"only bool and floating types of {name} are supported")
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(mask, -math.inf)


def with_extra_key(mask: Optional[Tensor]) -> Optional[Tensor]:
    """A mask for one more key (add_bias_kv / add_zero_attn): a zero column on the right."""
    return None if mask is None else torch.cat([mask, mask.new_zeros(*mask.shape[:-1], 1)], -1)


class MultiheadAttention(Module, torch.nn.MultiheadAttention):
    """torch.nn.MultiheadAttention with tracer parameters (same names, shapes and initialisation), whose forward
    is made of tracer ops: in-projection (F.linear), split into heads, attention (the rules above), out_proj."""

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 add_bias_kv: bool = False, add_zero_attn: bool = False, kdim: Optional[int] = None,
                 vdim: Optional[int] = None, batch_first: bool = False, device: Any = None, dtype: Any = None) -> None:
        super().__init__(embed_dim, num_heads, dropout, bias, add_bias_kv, add_zero_attn, kdim, vdim, batch_first,
                         device, dtype)
        drawn = self.out_proj  # torch's Linear, drawn in torch's order: adopt its parameters without a new draw
        self.out_proj = Linear(embed_dim, embed_dim, bias=bias, device="meta", dtype=dtype)
        self.out_proj.weight, self.out_proj.bias = drawn.weight, drawn.bias

    def forward(self, query: Tensor, key: Tensor, value: Tensor, key_padding_mask: Optional[Tensor] = None,
                need_weights: bool = True, attn_mask: Optional[Tensor] = None, average_attn_weights: bool = True,
                is_causal: bool = False) -> Tuple[Tensor, Optional[Tensor]]:
        batched = query.dim() == 3
        if query.dim() not in (2, 3) or key.dim() != query.dim() or value.dim() != query.dim():
            raise AssertionError(f"query, key and value should all be 2-D (unbatched) or 3-D (batched), got "
                                 f"{query.dim()}-D, {key.dim()}-D and {value.dim()}-D")
        if is_causal and attn_mask is None:
            raise RuntimeError("Need attn_mask if specifying the is_causal hint (it is only a hint: pass the causal "
                               "mask, e.g. from torch.nn.Transformer.generate_square_subsequent_mask)")
        if self.batch_first and batched:
            query, key, value = _once_each(lambda x: x.transpose(1, 0), query, key, value)
        if not batched:
            query, key, value = _once_each(lambda x: x.unsqueeze(1), query, key, value)
            key_padding_mask = None if key_padding_mask is None else key_padding_mask.unsqueeze(0)
        out, weights = self._attend(query, key, value, key_padding_mask, need_weights, attn_mask)
        if weights is not None and average_attn_weights:
            weights = weights.mean(dim=1)
        if not batched:
            return out.squeeze(1), None if weights is None else weights.squeeze(0)
        return (out.transpose(1, 0) if self.batch_first else out), weights

    def _project(self, query: Tensor, key: Tensor, value: Tensor) -> Tuple[Tensor, ...]:
        """q, k, v = the in-projections (one F.linear for self-attention, three otherwise)."""
        if self._qkv_same_embed_dim and query is key and key is value:
            return F.linear(query, self.in_proj_weight, self.in_proj_bias).chunk(3, -1)
        if self._qkv_same_embed_dim:
            weights = self.in_proj_weight.chunk(3)
        else:
            weights = self.q_proj_weight, self.k_proj_weight, self.v_proj_weight
        biases = (None,) * 3 if self.in_proj_bias is None else self.in_proj_bias.chunk(3)
        return tuple(F.linear(x, w, b) for x, w, b in zip((query, key, value), weights, biases))

    def _attend(self, query: Tensor, key: Tensor, value: Tensor, key_padding_mask: Optional[Tensor],
                need_weights: bool, attn_mask: Optional[Tensor]) -> Tuple[Tensor, Optional[Tensor]]:
        """Sequence-first (L, N, E) inputs -> output (L, N, E) and weights (N, heads, L, S) (None unless needed)."""
        length, batch, embed = query.shape
        if embed != self.embed_dim:
            raise AssertionError(f"was expecting embedding dimension of {self.embed_dim}, but got {embed}")
        heads, head_dim = self.num_heads, self.head_dim
        _check_key_value(key, value, self._qkv_same_embed_dim)
        if need_weights:
            _check_mask_dtypes(query.dtype, attn_mask=attn_mask, key_padding_mask=key_padding_mask)
        attn_mask = _three_dim(additive_mask(attn_mask, "attn_mask", query.dtype), batch * heads, length, key.size(0))
        key_padding_mask = additive_mask(key_padding_mask, "key_padding_mask", query.dtype)
        q, k, v = self._project(query, key, value)
        if self.bias_k is not None:
            k, v = torch.cat([k, self.bias_k.repeat(1, batch, 1)]), torch.cat([v, self.bias_v.repeat(1, batch, 1)])
            attn_mask, key_padding_mask = with_extra_key(attn_mask), with_extra_key(key_padding_mask)
        q, k, v = (x.reshape(x.size(0), batch * heads, head_dim).transpose(0, 1) for x in (q, k, v))
        if self.add_zero_attn:
            k, v = (torch.cat([x, x.new_zeros(batch * heads, 1, head_dim)], 1) for x in (k, v))
            attn_mask, key_padding_mask = with_extra_key(attn_mask), with_extra_key(key_padding_mask)
        source = k.size(1)
        if key_padding_mask is not None:
            if key_padding_mask.dim() != 2:
                raise AssertionError(f"expected key_padding_mask to be None or 2-D (1-D for an unbatched query), but "
                                     f"found a {key_padding_mask.dim()}-D tensor instead")
            for i, size in enumerate((batch, source)):  # (torch's words: "padded")
                if key_padding_mask.shape[i] != size:
                    raise AssertionError(f"Expected key_padded_mask.shape[{i}] to be {size}, but got "
                                         f"{key_padding_mask.shape[i]}")
            padding = key_padding_mask.reshape(batch, 1, 1, source).expand(-1, heads, -1, -1)
            padding = padding.reshape(batch * heads, 1, source)
            attn_mask = padding if attn_mask is None else attn_mask + padding
        dropout_p = self.dropout if self.training else 0.0
        weights = None
        if need_weights or dropout_p > 0:  # torch: the weights by softmax (a fully masked row NaN), else sdpa (zeros)
            weights = AttentionWeights.apply(q, k, attn_mask, False, None, not need_weights)
            weights = F.dropout(weights, dropout_p) if dropout_p > 0 else weights
            out = weights @ v
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask)
        out = out.transpose(0, 1).reshape(length * batch, self.embed_dim)
        out = F.linear(out, self.out_proj.weight, self.out_proj.bias).reshape(length, batch, self.embed_dim)
        if not need_weights:
            return out, None
        return out, weights.reshape(batch, heads, length, source)


def _check_key_value(key: Tensor, value: Tensor, same_embed_dim: bool) -> None:
    """torch's: key and value of one shape (with kdim / vdim: of one length and batch)."""
    if not same_embed_dim and key.shape[:2] != value.shape[:2]:
        raise AssertionError(f"key's sequence and batch dims {key.shape[:2]} do not match value's {value.shape[:2]}")
    if same_embed_dim and key.shape != value.shape:
        raise AssertionError(f"key shape {key.shape} does not match value shape {value.shape}")


def _check_mask_dtypes(dtype: torch.dtype, **masks: Optional[Tensor]) -> None:
    """torch's: a float mask of another dtype than the query's is refused where the weights are computed (its baddbmm);
    without them (need_weights=False: scaled_dot_product_attention) it is promoted."""
    for name, mask in masks.items():
        if mask is not None and mask.is_floating_point() and mask.dtype != dtype:
            raise RuntimeError(f"a float {name} must have the query's dtype: got {mask.dtype} for a {dtype} query "
                               f"(pass {name}.to({dtype}), or a bool mask)")


def _once_each(fn: Callable[[Tensor], Tensor], *xs: Tensor) -> Tuple[Tensor, ...]:
    """fn applied to each distinct input once, so `query is key is value` stays true for self-attention."""
    done: dict = {}
    for x in xs:
        if id(x) not in done:
            done[id(x)] = fn(x)
    return tuple(done[id(x)] for x in xs)


def _three_dim(mask: Optional[Tensor], batch_heads: int, length: int, source: int) -> Optional[Tensor]:
    """attn_mask as (1 or N * heads, L, S), checked like torch's."""
    if mask is None:
        return None
    if mask.dim() == 2:
        if tuple(mask.shape) != (length, source):
            raise RuntimeError(f"The shape of the 2D attn_mask is {mask.shape}, but should be {(length, source)}.")
        return mask.unsqueeze(0)
    if mask.dim() == 3:
        if tuple(mask.shape) != (batch_heads, length, source):
            raise RuntimeError(f"The shape of the 3D attn_mask is {mask.shape}, but should be "
                               f"{(batch_heads, length, source)}.")
        return mask
    raise RuntimeError(f"attn_mask's dimension {mask.dim()} is not supported")
