"""aten-level spellings of layers, routed to the rules of their torch.nn.functional forms:
native_layer_norm, native_group_norm, native_batch_norm, _native_batch_norm_legit, _batch_norm_with_update,
grid_sampler_2d / grid_sampler_3d (F.grid_sample), _upsample_bilinear2d_aa (F.interpolate with antialias).

The native norms return (output, mean, rstd, ...). As in torch, only the output is differentiable, except
native_group_norm, whose mean and rstd also carry gradients (torch's infinitely differentiable backward).
"""

import torch

from torchtrace.autograd.function import Function, register
from torchtrace.errors import UnsupportedOperationError
from torchtrace.nn.normalization import GroupNormFunction, LayerNormFunction, batch_norm_backward, keep_for_backward
from torchtrace.nn.sampling import GridSample
from torchtrace.nn.upsampling import Interpolate
from torchtrace.ops.opmath import opmath

aten = torch.ops.aten


def statistics_not_differentiable(ctx, outputs: tuple) -> tuple:
    """The statistics outputs torch does not differentiate (mean, rstd / invstd, ...) are marked so: tracers without a
    node, constants in a loss, as torch's requires_grad=False outputs."""
    ctx.mark_non_differentiable(*outputs[1:])
    return outputs


@register(torch.native_layer_norm)
class NativeLayerNorm(Function):
    """(y, mean, rstd) = native_layer_norm(x, shape, w, b, eps)  ->  dx = rstd (gw - mean_D(gw) - xhat mean_D(gw xhat)),
    dw = sum g xhat,  db = sum g (as F.layer_norm);  mean, rstd carry no gradient"""

    @staticmethod
    def forward(ctx, input, normalized_shape, weight, bias, eps):
        LayerNormFunction.forward(ctx, input, normalized_shape, weight, bias, eps)
        return statistics_not_differentiable(ctx, torch.native_layer_norm(input, normalized_shape, weight, bias, eps))

    @staticmethod
    def backward(ctx, g, g_mean, g_rstd):
        return (*LayerNormFunction.backward(ctx, g), None)


@register(torch.native_group_norm)
class NativeGroupNorm(Function):
    """(y, mean, rstd) = native_group_norm(x, w, b, ...)  ->  dx = rstd (gw - mean_G(gw) - xhat mean_G(gw xhat))
    + g_mean / M - g_rstd rstd^3 (x - mean) / M, dw and db as F.group_norm;  G = each (sample, group),
    M = the number of elements in one, rstd = (var + eps)^-1/2 (var biased)"""

    @staticmethod
    def forward(ctx, input, weight, bias, N, C, HxW, group, eps):
        GroupNormFunction.forward(ctx, input, group, weight, bias, eps)
        return torch.native_group_norm(input, weight, bias, N, C, HxW, group, eps)

    @staticmethod
    def backward(ctx, g, g_mean, g_rstd):
        flags = ctx.needs_input_grad
        ctx.needs_input_grad = (flags[0], False, flags[1], flags[2])  # F.group_norm's order: x, groups, w, b
        try:
            dx, _, dw, db = GroupNormFunction.backward(ctx, g)
        finally:
            ctx.needs_input_grad = flags
        if ctx.needs_input_grad[0]:
            x, g_mean, g_rstd = opmath(ctx.saved_tensors[0], g_mean, g_rstd)
            grouped = x.reshape(x.shape[0], ctx.groups, -1) if x.numel() else x.reshape(x.shape[0], ctx.groups, 0)
            size = grouped.shape[2]
            centred = grouped - grouped.mean(2, keepdim=True)
            rstd = torch.rsqrt((centred * centred).mean(2, keepdim=True) + ctx.eps)
            extra = g_mean.unsqueeze(2) / size - g_rstd.unsqueeze(2) * rstd ** 3 * centred / size
            dx = dx + extra.reshape(x.shape)
        return dx, dw, db, None, None, None, None, None


class _NativeBatchNorm(Function):
    """(y, mean, invstd) = native_batch_norm(x, w, b, ...)  ->  dx = invstd (gw - mean_B(gw) - xhat mean_B(gw xhat)),
    dw = sum_B g xhat,  db = sum_B g (as F.batch_norm, running statistics in eval);  mean, invstd carry no gradient"""

    op, stats_at, affine_at = staticmethod(torch.native_batch_norm), (3, 4), (0, 1, 2)
    stat_dims = staticmethod(lambda x: (0, *range(2, x.dim())))

    @staticmethod
    def forward(ctx, input, weight, bias, running_mean, running_var, training=None, momentum=None, eps=None):
        if isinstance(running_mean, bool):  # _native_batch_norm_legit.no_stats(x, w, b, training, momentum, eps)
            ctx.n_args = 6
            keep_for_backward(ctx, input, weight, None, None, running_mean, training)
            return statistics_not_differentiable(ctx, ctx._rule.op(input, weight, bias, running_mean, running_var,
                                                                   training))
        ctx.n_args = 8
        keep_for_backward(ctx, input, weight, running_mean, running_var, training, eps)
        return statistics_not_differentiable(ctx, ctx._rule.op(input, weight, bias, running_mean, running_var,
                                                               training, momentum, eps))

    @staticmethod
    def backward(ctx, g, *statistics):
        return (*batch_norm_backward(ctx, g), *(None,) * (ctx.n_args - 3))


def batch_norm_twin(name: str, op: object, with_update: bool = False) -> type:
    """A native batch norm spelling; _batch_norm_with_update has no `training` argument (always batch stats)."""
    members = {"op": staticmethod(op), "__doc__": _NativeBatchNorm.__doc__,
               "name": "torch.ops.aten._batch_norm_with_update" if with_update else f"torch.{op.__name__}"}
    if with_update:
        members["forward"] = staticmethod(_with_update_forward)
    return type(name, (_NativeBatchNorm,), members)


def _with_update_forward(ctx, input, weight, bias, running_mean, running_var, momentum, eps):
    ctx.n_args = 7
    keep_for_backward(ctx, input, weight, running_mean, running_var, True, eps)
    return statistics_not_differentiable(ctx, aten._batch_norm_with_update(input, weight, bias, running_mean,
                                                                           running_var, momentum, eps))


register(torch.native_batch_norm, rule=batch_norm_twin("NativeBatchNorm", torch.native_batch_norm))
register(torch._native_batch_norm_legit, rule=batch_norm_twin("NativeBatchNormLegit", torch._native_batch_norm_legit))
register(aten._batch_norm_with_update, aten._batch_norm_with_update.default,
         rule=batch_norm_twin("BatchNormWithUpdate", aten._batch_norm_with_update, True))

INTERPOLATION = {0: "bilinear", 1: "nearest", 2: "bicubic"}
DEFAULT_FORM = object()  # _upsample_bilinear2d_aa called without scale_factors: its .default overload
PADDING = {0: "zeros", 1: "border", 2: "reflection"}


@register(torch.grid_sampler_2d, torch.grid_sampler_3d, torch.grid_sampler)
class GridSampler(Function):
    """y = F.grid_sample(x, grid) (modes as codes)  ->  dx = scatter_add of w_t g at p_t,
    dgrid_k = (dc_k/dgrid_k) sum_{c,t} g x[p_t] dw_t/dc_k  (as F.grid_sample);  c = the grid point in pixels,
    p_t = its corners, w_t = their interpolation weights"""

    @staticmethod
    def forward(ctx, input, grid, interpolation_mode, padding_mode, align_corners):
        mode = INTERPOLATION.get(interpolation_mode, interpolation_mode)
        GridSample.forward(ctx, input, grid, mode, PADDING.get(padding_mode, padding_mode), align_corners)
        return torch.grid_sampler(input, grid, interpolation_mode, padding_mode, align_corners)

    @staticmethod
    def backward(ctx, g):
        return (*GridSample.backward(ctx, g), None, None, None)


@register(aten._upsample_bilinear2d_aa, aten._upsample_bilinear2d_aa.vec)
class UpsampleBilinearAA(Function):
    """y = x x_1 A_1 x_2 A_2 (antialiased bilinear weights A_d, as F.interpolate)  ->  dx = g x_1 A_1^T x_2 A_2^T"""

    @staticmethod
    def forward(ctx, input, output_size, align_corners, *rest, scale_factors=DEFAULT_FORM, scales_h=None,
                scales_w=None):
        if scale_factors is DEFAULT_FORM and len(rest) == 1:  # the .vec form: (scale_factors) by position or keyword
            scale_factors = rest[0]
        if scale_factors is DEFAULT_FORM:  # the .default form: (scales_h, scales_w) by position or keyword
            scales_h, scales_w = (*rest, None, None)[:2] if rest else (scales_h, scales_w)
            return UpsampleBilinearAADefault.forward(ctx, input, output_size, align_corners, scales_h, scales_w)
        size = list(output_size) if output_size is not None else None
        return Interpolate.forward(ctx, input, size, None if size else scale_factors, "bilinear", align_corners,
                                   None, True)

    @staticmethod
    def backward(ctx, g):
        return Interpolate.backward(ctx, g), None, None, None


@register(aten._upsample_bilinear2d_aa.default)
class UpsampleBilinearAADefault(Function):
    """y = x x_1 A_1 x_2 A_2 (antialiased bilinear weights A_d, as F.interpolate)  ->  dx = g x_1 A_1^T x_2 A_2^T"""

    @staticmethod
    def forward(ctx, input, output_size, align_corners, scales_h=None, scales_w=None):
        if scales_h is not None or scales_w is not None:
            raise UnsupportedOperationError(
                "torch.ops.aten._upsample_bilinear2d_aa.default: scales_h / scales_w are not supported — use "
                "torch.nn.functional.interpolate(mode='bilinear', antialias=True)")
        return Interpolate.forward(ctx, input, list(output_size), None, "bilinear", align_corners, None, True)

    @staticmethod
    def backward(ctx, g):
        return Interpolate.backward(ctx, g), None, None, None, None

