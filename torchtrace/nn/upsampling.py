"""Interpolation (F.interpolate, F.upsample*, nn.Upsample): a linear map, separable along the spatial dims.

Every mode (nearest, nearest-exact, linear, bilinear, bicubic, trilinear, area, with or without antialias)
computes each output as a fixed weighted sum of inputs, one spatial dim after the other:

    y = x  x_1 A_1  x_2 A_2 ...   (A_d: an out_d x in_d matrix applied along spatial dim d)
    ->  dx = g  x_1 A_1^T  x_2 A_2^T ...

A_d's columns are the images of the unit vectors: they are read off by interpolating the identity matrix
along dim d alone, with the same size / scale_factor / align_corners / antialias as the call (size 1 and
scale 1 along the other dims, which interpolation leaves unchanged). So A_d holds exactly torch's weights:
its source-index rounding (nearest vs nearest-exact), its clamped cubic taps, its area windows.
"""
from typing import Any, List, Optional, Sequence

import torch
import torch.nn.functional as F

from torchtrace.autograd.function import Function, register
from torchtrace.nn.module import Module
from torchtrace.ops.input_in_backward import reading_input


def _per_dim(value: Any, n: int) -> Optional[List[Any]]:
    if value is None:
        return None
    return list(value) * (n if len(value) == 1 else 1) if isinstance(value, (list, tuple)) else [value] * n


def interpolation_matrix(dim: int, size_in: int, size_out: int, n: int, scale: Optional[Sequence[float]],
                         options: dict, like: torch.Tensor) -> torch.Tensor:
    """A (size_out x size_in) with y = A x along spatial dim `dim` of n, read off by interpolating unit vectors.

    The other dims have size 2 and scale 1 (left unchanged); size 1 would do, but torch's antialiased kernels
    mishandle a dim of size 1 (they return a constant), so the probe avoids it.
    """
    shape = [size_in if d == dim else 2 for d in range(n)]
    unit = [size_in if d == dim else 1 for d in range(n)]
    probe = torch.eye(size_in, dtype=like.dtype, device=like.device).reshape(size_in, 1, *unit).expand(
        size_in, 1, *shape)
    if scale is None:
        out = F.interpolate(probe, size=[size_out if d == dim else 2 for d in range(n)], **options)
    else:
        out = F.interpolate(probe, scale_factor=[scale[dim] if d == dim else 1.0 for d in range(n)], **options)
    return out[(slice(None), 0, *[slice(None) if d == dim else 0 for d in range(n)])].transpose(0, 1)


@register(F.interpolate)  # F.upsample, F.upsample_nearest, F.upsample_bilinear and nn.Upsample call it
class Interpolate(Function):
    """y = x x_1 A_1 x_2 A_2 ... (A_d: torch's interpolation weights along dim d)  ->  dx = g x_1 A_1^T x_2 A_2^T ..."""

    @staticmethod
    def forward(ctx, input, size=None, scale_factor=None, mode="nearest", align_corners=None,
                recompute_scale_factor=None, antialias=False):
        y = F.interpolate(input, size, scale_factor, mode, align_corners, recompute_scale_factor, antialias)
        n = input.dim() - 2
        ctx.in_shape = input.shape
        ctx.scale = _per_dim(scale_factor, n) if size is None else None
        ctx.options = {"mode": mode, "align_corners": align_corners, "recompute_scale_factor": recompute_scale_factor,
                       "antialias": antialias}
        if mode == "area":  # torch runs adaptive_avg_pool, whose backward kernel reads the input: so does a
            ctx.save_for_backward(input)  # create_graph backward here (input_in_backward.py)
        return y

    @staticmethod
    def backward(ctx, g):
        n = g.dim() - 2
        for d in range(n):
            axis = 2 + d
            matrix = interpolation_matrix(d, ctx.in_shape[axis], g.shape[axis], n, ctx.scale, ctx.options, g)
            g = (g.transpose(axis, -1) @ matrix).transpose(axis, -1)
        return reading_input(g, ctx.saved_tensors[0]) if ctx.options["mode"] == "area" else g


class Upsample(Module, torch.nn.Upsample):
    """torch.nn.Upsample, recorded by torchtrace's interpolation rule."""


class UpsamplingNearest2d(Module, torch.nn.UpsamplingNearest2d):
    """torch.nn.UpsamplingNearest2d, recorded by torchtrace's interpolation rule."""


class UpsamplingBilinear2d(Module, torch.nn.UpsamplingBilinear2d):
    """torch.nn.UpsamplingBilinear2d (align_corners=True), recorded by torchtrace's interpolation rule."""
