"""F.linear_cross_entropy: cross_entropy(linear(x, W, b), target) in one call (torch may chunk it; the gradient is
the same). The backward recomputes the logits with F.linear, so create_graph=True links second derivatives."""
from types import SimpleNamespace
from typing import Optional

import torch
import torch.nn.functional as F

from torchtrace.autograd.function import Function, register
from torchtrace.nn.ctc import FirstDerivativeOnly
from torchtrace.nn.loss import CrossEntropy, _refuse_grad


@register(F.linear_cross_entropy)
class LinearCrossEntropy(Function):
    """l = cross_entropy(z, t), z = x W^T + b  ->  dz = cross_entropy's gradient (softmax z - target coefficients,
    scaled),  dx = dz W,  dW = dz^T x,  db = sum_n dz,  dt = cross_entropy's target gradient (probability targets)"""

    @staticmethod
    def forward(ctx, input, linear_weight, target, linear_bias=None, weight=None, reduction="mean", ignore_index=None,
                label_smoothing=0.0, options=None):
        _refuse_grad(ctx, 4, "linear_cross_entropy", "weight")
        ctx.reduction, ctx.smoothing, ctx.chunked = reduction, label_smoothing, options is not None
        ctx.ignore_index = -100 if ignore_index is None else ignore_index
        ctx.save_for_backward(input, linear_weight, target, linear_bias, weight)
        return F.linear_cross_entropy(input, linear_weight, target, linear_bias=linear_bias, weight=weight,
                                      reduction=reduction, ignore_index=ignore_index,
                                      label_smoothing=label_smoothing, options=options)

    @staticmethod
    def backward(ctx, g):
        if not (ctx.chunked and torch.is_grad_enabled()):
            return gradients(ctx, g)
        with torch.no_grad():  # torch's chunked path computes its gradients in forward: they have no derivative
            grads = gradients(ctx, g)
        return tuple(None if d is None else FirstDerivativeOnly.apply(d, ctx.saved_tensors[0], g, CHUNKED_SECOND)
                     for d in grads)


CHUNKED_SECOND = ("torch.nn.functional.linear_cross_entropy: with options= (torch's chunked path) the gradient cannot "
                  "be differentiated again (torch's is a constant) — call it without options=, or write "
                  "F.cross_entropy(F.linear(...), target), for second derivatives")


def linear(x: torch.Tensor, w: torch.Tensor, b: Optional[torch.Tensor]) -> torch.Tensor:
    """z = x W^T + b for W of shape (C, d_1, ..., features): z has shape (*batch, C, d_1, ...)."""
    if w.dim() == 2:
        return F.linear(x, w, b)
    z = (x @ w.reshape(-1, w.shape[-1]).mT).reshape(*x.shape[:-1], *w.shape[:-1])
    return z if b is None else z + b


def gradients(ctx, g) -> tuple:
    """(dx, dW, dtarget, db, None, ...) through the recomputed logits."""
    x, w, target, b, class_weight = ctx.saved_tensors
    need_x, need_w, need_t, need_b = ctx.needs_input_grad[:4]
    logits = linear(x, w, b)
    as_ce = SimpleNamespace(saved_tensors=(logits, target, class_weight), needs_input_grad=(True, need_t),
                            reduction=ctx.reduction, ignore_index=ctx.ignore_index, smoothing=ctx.smoothing)
    dz, dt = CrossEntropy.backward(as_ce, g)
    features = w.shape[-1]
    rows = dz.reshape(-1, w.numel() // features)  # one row per sample, one column per output (class, d_1, ...)
    dx = (rows @ w.reshape(-1, features)).reshape(x.shape) if need_x else None
    dw = (rows.mT @ x.reshape(-1, features)).reshape(w.shape) if need_w else None
    db = rows.sum(0).reshape(w.shape[:-1]) if need_b else None
    return dx, dw, dt, db, None, None, None, None, None
