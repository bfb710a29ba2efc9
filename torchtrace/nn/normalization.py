"""Normalization layers: batch, instance, layer, group and RMS norm, their hand-derived gradients and modules.

All of them standardize x over some dims D (M elements each), then apply an affine map:

    xhat = (x - mean_D x) * invstd,   invstd = 1 / sqrt(var_D x + eps)   (biased variance),   y = w * xhat + b

With dxhat = g * w, the classic backward is

    dx = (1/M) * invstd * (M * dxhat - sum_D dxhat - xhat * sum_D(dxhat * xhat))
       = invstd * (dxhat - mean_D dxhat - xhat * mean_D(dxhat * xhat)),
    dw = sum of g * xhat,   db = sum of g   (over every dim but the parameter's own).

Backward recomputes mean and invstd from the saved input with ops that have rules (instead of saving
forward's intermediates), so a backward recorded with create_graph=True is differentiated again. When no graph
is recorded (first order), layer norm and batch norm (batch statistics on the CPU, or running statistics) run
these formulas by torch's one-pass backward kernels instead, on the mean and invstd their forward's kernel
computed: torch autograd's bits, at its speed.

    batch norm     D = (N, *spatial) per channel C;  eval mode: fixed running stats, y is an affine map of x
    instance norm  D = the spatial dims, per sample and channel;  w, b per channel
    layer norm     D = the trailing normalized_shape dims;  w, b have normalized_shape
    group norm     D = (C / G channels, *spatial) per sample and group;  w, b per channel
    RMS norm       no centring: xhat = x / sqrt(mean_D x^2 + eps),  dx = invrms (dxhat - xhat mean_D(dxhat xhat))
"""
import math
from typing import Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from torchtrace.autograd.function import Function, register
from torchtrace.nn.module import Module
from torchtrace.ops.opmath import opmath


def standardize(x: torch.Tensor, dims: Tuple[int, ...], eps: float) -> Tuple[torch.Tensor, torch.Tensor]:
    """xhat = (x - mean) * invstd over dims, and invstd = 1 / sqrt(biased var + eps), with dims kept."""
    centered = x - x.mean(dims, keepdim=True)
    invstd = torch.rsqrt((centered * centered).mean(dims, keepdim=True) + eps)
    return centered * invstd, invstd


def standardize_backward(dxhat: torch.Tensor, xhat: torch.Tensor, invstd: torch.Tensor,
                         dims: Tuple[int, ...]) -> torch.Tensor:
    """dx = invstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)), means over the standardized dims."""
    return invstd * (dxhat - dxhat.mean(dims, keepdim=True) - xhat * (dxhat * xhat).mean(dims, keepdim=True))


def per_channel(t: Optional[torch.Tensor], x: torch.Tensor) -> Optional[torch.Tensor]:
    """A (C,) tensor shaped (1, C, 1, ...) to broadcast against x of shape (N, C, ...)."""
    return None if t is None else t.reshape((1, -1) + (1,) * (x.dim() - 2))


def all_but_channel(x: torch.Tensor) -> Tuple[int, ...]:
    """Dims (0, 2, 3, ...): everything but the channel dim 1."""
    return (0, *range(2, x.dim()))


def affine_backward(g: torch.Tensor, xhat: torch.Tensor, w: Optional[torch.Tensor], need_w: bool, need_b: bool,
                    channel_dims: Optional[Tuple[int, ...]] = None) -> tuple:
    """(dxhat, dw, db) of y = w * xhat + b: dxhat = g * w, dw = sum g * xhat, db = sum g.

    Per-channel parameters (channel_dims given) are summed here; parameters of the trailing shape
    (layer / RMS norm) get g * xhat and g, which the engine sums back to their shape.
    """
    if channel_dims is None:
        return (g if w is None else g * w), (g * xhat if need_w else None), (g if need_b else None)
    dxhat = g if w is None else g * per_channel(w, g)
    return dxhat, ((g * xhat).sum(channel_dims) if need_w else None), (g.sum(channel_dims) if need_b else None)


def spatial_dims(x: torch.Tensor) -> Tuple[int, ...]:
    """Dims (2, 3, ...): what instance norm standardizes over, per sample and channel."""
    return tuple(range(2, x.dim()))


def keep_for_backward(ctx, x, weight, running_mean, running_var, batch_stats: bool, eps: float) -> None:
    """Batch / instance norm: save the input and weight, and copies of the running stats that eval mode uses
    (copies, as a later training step updates them in place); no batch statistics kept yet (ctx.stats: see
    normalize_keeping_stats). Refuses running stats that require grad."""
    if any(ctx.needs_input_grad[i] for i in ctx._rule.stats_at):
        raise RuntimeError(f"{ctx._rule.op.__name__} is not differentiable with respect to running_mean / running_var: "
                           "they are statistics, not inputs. Pass them detached (tracers without requires_grad).")
    ctx.batch_stats, ctx.eps, ctx.dims, ctx.stats = batch_stats, eps, ctx._rule.stat_dims(x), None
    use_running = not batch_stats and running_mean is not None and running_var is not None
    ctx.save_for_backward(x, weight, *((running_mean.clone(), running_var.clone()) if use_running else ()))


def normalize_keeping_stats(ctx, x, weight, bias, running_mean, running_var, momentum, eps) -> Optional[torch.Tensor]:
    """Batch norm with batch statistics on the CPU, as torch.batch_norm runs it there (torch.native_batch_norm: the same
    numbers, the running statistics updated the same way), keeping the batch's mean and invstd it computed for the
    first-order backward (ctx.stats, as torch's autograd keeps them). None where that is not the call: eval mode,
    instance norm's dims, another device (whose torch.batch_norm may take another kernel), one value per channel
    (F.batch_norm raises, as called) and none (torch's kernel refuses an empty input that torch.batch_norm accepts)."""
    if not ctx.batch_stats or x.device.type != "cpu" or ctx.dims != all_but_channel(x) or \
            math.prod(x.shape[:1] + x.shape[2:]) <= 1:
        return None
    y, mean, invstd = torch.native_batch_norm(x, weight, bias, running_mean, running_var, True, momentum, eps)
    ctx.stats = (mean, invstd)
    return y


def batch_norm_backward(ctx, g) -> tuple:
    """(dx, dw, db) with batch statistics (standardized over ctx.dims) or fixed running statistics. A float16 or
    bfloat16 input (autocast runs batch norm in the input's dtype, with float32 parameters) is computed in float32, as
    torch's kernel does: dw and db are sums over the whole batch, and their terms rounded to 8 bits would lose them."""
    x, w, *running = ctx.saved_tensors
    need_x, need_w, need_b = (ctx.needs_input_grad[i] for i in ctx._rule.affine_at)
    if not torch.is_grad_enabled() and ctx.dims == all_but_channel(x) and (ctx.batch_stats or running) and x.numel():
        return _batch_norm_kernel(ctx, g, x, w, running, [need_x, need_w, need_b])
    if x.dtype in (torch.float16, torch.bfloat16):
        x, g = x.float(), g.float()
    if ctx.batch_stats:
        xhat, invstd = standardize(x, ctx.dims, ctx.eps)
    else:
        invstd = torch.rsqrt(per_channel(running[1], x) + ctx.eps)
        xhat = (x - per_channel(running[0], x)) * invstd
    dxhat, dw, db = affine_backward(g, xhat, w, need_w, need_b, all_but_channel(x))
    if not need_x:
        return None, dw, db
    return (standardize_backward(dxhat, xhat, invstd, ctx.dims) if ctx.batch_stats else dxhat * invstd), dw, db


def _batch_norm_kernel(ctx, g: torch.Tensor, x: torch.Tensor, w: Optional[torch.Tensor], running: list,
                       needs: list) -> tuple:
    """batch_norm_backward's first order (no graph recorded) by torch's one-pass kernel of the same formulas: on the
    batch's mean and invstd (those the forward's kernel computed, ctx.stats; else recomputed from x), or on the
    running statistics in eval mode. Several times faster than the dozen elementwise ops on a conv's activations;
    equal to them up to rounding (torch autograd's bits where the forward kept its statistics). Not for an empty
    input: the kernel divides by its size (the formulas above give an empty dx and zero dw, db)."""
    if ctx.batch_stats:
        mean, invstd = ctx.stats or _batch_stats(x, w, ctx.dims, ctx.eps)
        return torch.ops.aten.native_batch_norm_backward(g, x, w, None, None, mean, invstd, True, ctx.eps, needs)
    return torch.ops.aten.native_batch_norm_backward(g, x, w, running[0], running[1], None, None, False, ctx.eps,
                                                     needs)


def _batch_stats(x: torch.Tensor, w: Optional[torch.Tensor], dims: Tuple[int, ...],
                 eps: float) -> Tuple[torch.Tensor, torch.Tensor]:
    """The batch's mean and invstd over dims, computed in float32 for float16 / bfloat16 and kept in the dtype torch's
    kernel keeps them in: the weight's (float32 beside a half-precision input under autocast), else the input's."""
    var, mean = torch.var_mean(opmath(x)[0], dims, correction=0)
    dtype = x.dtype if w is None else w.dtype
    return mean.to(dtype), torch.rsqrt(var + eps).to(dtype)


@register(F.batch_norm)  # what nn.BatchNorm1d/2d/3d call
class BatchNormFunction(Function):
    """y = w xhat + b, xhat = (x - mean_B x) invstd  ->  dx = invstd (gw - mean_B(gw) - xhat mean_B(gw xhat)),
    dw = sum_B g xhat,  db = sum_B g;  training: B = N and spatial dims per channel, invstd = 1 / sqrt(var_B x + eps);
    eval: y = w (x - running_mean) / sqrt(running_var + eps) + b  ->  dx = g w / sqrt(running_var + eps)"""

    op, stat_dims = staticmethod(F.batch_norm), staticmethod(all_but_channel)
    stats_at, affine_at = (1, 2), (0, 3, 4)  # where running_mean/var and input/weight/bias are in forward

    @staticmethod
    def forward(ctx, input, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1,
                eps=1e-5):
        keep_for_backward(ctx, input, weight, running_mean, running_var, training, eps)
        y = normalize_keeping_stats(ctx, input, weight, bias, running_mean, running_var, momentum, eps)
        return ctx._rule.op(input, running_mean, running_var, weight, bias, training, momentum, eps) if y is None else y

    @staticmethod
    def backward(ctx, g):
        dx, dw, db = batch_norm_backward(ctx, g)
        return dx, None, None, dw, db


@register(F.instance_norm)  # what nn.InstanceNorm1d/2d/3d call
class InstanceNormFunction(BatchNormFunction):
    """y = w xhat + b, xhat = (x - mean_S x) invstd  ->  dx = invstd (gw - mean_S(gw) - xhat mean_S(gw xhat)),
    dw = sum g xhat,  db = sum g (over the batch and S);  S = the spatial dims per sample and channel,
    invstd = 1 / sqrt(var_S x + eps); without use_input_stats the eval-mode batch norm with running statistics"""

    op, stat_dims = staticmethod(F.instance_norm), staticmethod(spatial_dims)

    @staticmethod
    def forward(ctx, input, running_mean=None, running_var=None, weight=None, bias=None, use_input_stats=True,
                momentum=0.1, eps=1e-5):
        return BatchNormFunction.forward(ctx, input, running_mean, running_var, weight, bias, use_input_stats,
                                         momentum, eps)


@register(torch.batch_norm)  # the builtin under F.batch_norm, with its own argument order
class TorchBatchNorm(Function):
    """torch.batch_norm(x, w, b, ...): y = w xhat + b  ->  dx = invstd (gw - mean_B(gw) - xhat mean_B(gw xhat)),
    dw = sum_B g xhat, db = sum_B g (as F.batch_norm, with its arguments in torch.batch_norm's order)"""

    op, stat_dims = staticmethod(torch.batch_norm), staticmethod(all_but_channel)
    stats_at, affine_at = (3, 4), (0, 1, 2)

    @staticmethod
    def forward(ctx, input, weight, bias, running_mean, running_var, training, momentum, eps, cudnn_enabled=True):
        keep_for_backward(ctx, input, weight, running_mean, running_var, training, eps)
        y = normalize_keeping_stats(ctx, input, weight, bias, running_mean, running_var, momentum, eps)
        return y if y is not None else ctx._rule.op(input, weight, bias, running_mean, running_var, training, momentum,
                                                    eps, cudnn_enabled)

    @staticmethod
    def backward(ctx, g):
        return batch_norm_backward(ctx, g)


@register(torch.instance_norm)
class TorchInstanceNorm(TorchBatchNorm):
    """torch.instance_norm(x, w, b, ...): y = w xhat + b  ->  dx = invstd (gw - mean_S(gw) - xhat mean_S(gw xhat)),
    dw = sum g xhat, db = sum g (as F.instance_norm, with its arguments in torch.instance_norm's order)"""

    op, stat_dims = staticmethod(torch.instance_norm), staticmethod(spatial_dims)


def normalized_dims(x: torch.Tensor, normalized_shape: Sequence[int]) -> Tuple[int, ...]:
    """The trailing dims that layer_norm / rms_norm normalize over."""
    return tuple(range(x.dim() - len(normalized_shape), x.dim()))


@register(F.layer_norm, torch.layer_norm)
class LayerNormFunction(Function):
    """y = w xhat + b, xhat = (x - mean_D x) invstd  ->  dx = invstd (gw - mean_D(gw) - xhat mean_D(gw xhat)),
    dw = sum g xhat,  db = sum g (over the leading dims);  D = the trailing dims, invstd = 1 / sqrt(var_D x + eps)"""

    @staticmethod
    def forward(ctx, input, normalized_shape, weight=None, bias=None, eps=1e-5, cudnn_enable=True):
        ctx.dims, ctx.eps, ctx.shape = normalized_dims(input, normalized_shape), eps, list(normalized_shape)
        y, mean, invstd = torch.native_layer_norm(input, ctx.shape, weight, bias, eps)  # F.layer_norm's
        ctx.save_for_backward(input, weight, mean, invstd, bias)  # (the bias as torch saves it: its kernel reads it)
        return y

    @staticmethod
    def backward(ctx, g):
        x, w, mean, invstd, b = ctx.saved_tensors
        need_x, _, need_w, need_b = ctx.needs_input_grad[:4]
        if not torch.is_grad_enabled():  # first order: the formula above on the forward's statistics, by torch's
            # one-pass kernel of it (as torch's formula: its bits, and a fourth of the time of the dozen ops below)
            dx, dw, db = torch.ops.aten.native_layer_norm_backward(g, x, ctx.shape, mean, invstd, w, b,
                                                                   [need_x, need_w, need_b])
            return dx, None, dw, db
        xhat, invstd = standardize(x, ctx.dims, ctx.eps)  # create_graph: mean and invstd recomputed from x (ops with
        # rules), so that they are differentiated too
        dxhat, dw, db = affine_backward(g, xhat, w, need_w, need_b)
        dx = standardize_backward(dxhat, xhat, invstd, ctx.dims) if need_x else None
        return dx, None, dw, db


@register(F.group_norm, torch.group_norm)
class GroupNormFunction(Function):
    """y = w xhat + b, xhat = (x - mean_G x) invstd  ->  dx = invstd (gw - mean_G(gw) - xhat mean_G(gw xhat)),
    dw = sum_(N, spatial) g xhat,  db = sum g;  G = each sample's group of C/G channels and the spatial dims,
    N = the batch size, C = the number of channels"""

    @staticmethod
    def forward(ctx, input, num_groups, weight=None, bias=None, eps=1e-5, cudnn_enabled=True):
        ctx.groups, ctx.eps = num_groups, eps
        ctx.save_for_backward(input, weight)
        return F.group_norm(input, num_groups, weight, bias, eps)

    @staticmethod
    def backward(ctx, g):
        x, w, g = opmath(*ctx.saved_tensors, g)  # (centred squares of float16 overflow past 256)
        need_x, _, need_w, need_b = ctx.needs_input_grad[:4]
        grouped = (x.shape[0], ctx.groups, x[0].numel() // ctx.groups if x.shape[0] else 0)  # no -1: empty batches
        xhat_grouped, invstd = standardize(x.reshape(grouped), (2,), ctx.eps)
        xhat = xhat_grouped.reshape(x.shape)
        dxhat, dw, db = affine_backward(g, xhat, w, need_w, need_b, all_but_channel(x))
        if not need_x:
            return None, None, dw, db
        return standardize_backward(dxhat.reshape(grouped), xhat_grouped, invstd, (2,)).reshape(x.shape), None, dw, db


@register(F.rms_norm, torch.rms_norm)
class RMSNormFunction(Function):
    """y = w x / sqrt(mean_D x^2 + eps) over the trailing dims D  ->  dx = invrms (g w - xhat mean_D(g w xhat)),
    dw = sum g xhat (over leading dims)"""

    @staticmethod
    def forward(ctx, input, normalized_shape, weight=None, eps=None):
        ctx.dims = normalized_dims(input, normalized_shape)
        ctx.eps = torch.finfo(input.dtype if input.element_size() >= 4 else torch.float32).eps if eps is None else eps
        ctx.save_for_backward(input, weight)
        return F.rms_norm(input, normalized_shape, weight, eps)

    @staticmethod
    def backward(ctx, g):
        x, w, g = opmath(*ctx.saved_tensors, g)  # (x^2 of float16 overflows past 256)
        need_x, _, need_w = ctx.needs_input_grad[:3]
        invrms = torch.rsqrt((x * x).mean(ctx.dims, keepdim=True) + ctx.eps)
        xhat = x * invrms
        dxhat, dw, _ = affine_backward(g, xhat, w, need_w, False)
        dx = invrms * (dxhat - xhat * (dxhat * xhat).mean(ctx.dims, keepdim=True)) if need_x else None
        return dx, None, dw


class BatchNorm1d(Module, torch.nn.BatchNorm1d):
    """torch.nn.BatchNorm1d on (N, C) or (N, C, L): running_mean / running_var / num_batches_tracked buffers,
    momentum (None: cumulative average), train() uses batch statistics, eval() the running ones."""


class BatchNorm2d(Module, torch.nn.BatchNorm2d):
    """torch.nn.BatchNorm2d on (N, C, H, W), per channel."""


class BatchNorm3d(Module, torch.nn.BatchNorm3d):
    """torch.nn.BatchNorm3d on (N, C, D, H, W), per channel."""


class InstanceNorm1d(Module, torch.nn.InstanceNorm1d):
    """torch.nn.InstanceNorm1d on (N, C, L) or (C, L): per sample and channel; affine and running stats optional."""


class InstanceNorm2d(Module, torch.nn.InstanceNorm2d):
    """torch.nn.InstanceNorm2d on (N, C, H, W) or (C, H, W)."""


class InstanceNorm3d(Module, torch.nn.InstanceNorm3d):
    """torch.nn.InstanceNorm3d on (N, C, D, H, W) or (C, D, H, W)."""


class LayerNorm(Module, torch.nn.LayerNorm):
    """torch.nn.LayerNorm: standardize over the trailing normalized_shape dims, elementwise affine."""


class GroupNorm(Module, torch.nn.GroupNorm):
    """torch.nn.GroupNorm: standardize over groups of channels, per-channel affine."""


class RMSNorm(Module, torch.nn.RMSNorm):
    """torch.nn.RMSNorm: x / sqrt(mean x^2 + eps) over the trailing dims, elementwise scale."""
