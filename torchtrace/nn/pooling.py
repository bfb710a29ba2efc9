"""Pooling: max, average and adaptive pooling over 1, 2 or 3 spatial dims, their hand-derived gradients, the modules.

    max pool:       y_q = x_i(q), i(q) = argmax over window q (torch's indices)  ->  dx_i = sum_{q: i(q) = i} g_q
                    (a scatter_add of g into each flattened input plane; overlapping windows accumulate)
    avg pool:       y_q = (1/D_q) sum_{k < K} x_pad[s q + k]  ->  dx = conv_transpose(g / D, ones kernel, stride s),
                    cropped to x (a transposed box filter; D: window size, count_include_pad, divisor_override)
    adaptive avg:   y_i = mean of x_j over floor(i in / out) <= j < ceil((i+1) in / out)  ->  dx = A^T g along each dim
    adaptive max:   as max pool, with torch's indices
    fractional max: as max pool, with torch's indices (the random windows are drawn once, in the forward)

Every backward is linear in g and built from ops with rules (scatter_add, conv_transpose, pad, matmul), so
double backward works.
"""
import math
from typing import Any, Sequence

import torch
import torch.nn.functional as F

from torchtrace.autograd.function import Function, register
from torchtrace.nn.conv import CONV_TRANSPOSE, ntuple, pad_argument
from torchtrace.nn.module import Module
from torchtrace.ops.input_in_backward import reading_input


def scatter_to_input(g: torch.Tensor, indices: torch.Tensor, shape: torch.Size, n: int) -> torch.Tensor:
    """dx[..., i] = sum of g[..., q] over the outputs q whose index (into the flattened input plane) is i."""
    plane = torch.zeros((*shape[:-n], math.prod(shape[-n:])), dtype=g.dtype, device=g.device)
    return plane.scatter_add(-1, indices.flatten(-n), g.flatten(-n)).reshape(shape)


def given(stride: Any) -> bool:
    """Did the call give a stride? torch takes None and an empty list for "the kernel's size"; 0 is given (and refused
    by torch's kernel: a window that never moves)."""
    return stride is not None and not (isinstance(stride, (list, tuple)) and len(stride) == 0)


def _channels_last(x: torch.Tensor) -> torch.Tensor:
    """x (N, C, H, W) on the CPU in channels-last layout: torch's max-pool kernel for that layout runs over the
    channels in vector registers, the one for NCHW one window at a time (several times slower, same results)."""
    if x.dim() == 4 and x.device.type == "cpu" and x.is_floating_point() and x.shape[1] > 1 and x.is_contiguous():
        return x.contiguous(memory_format=torch.channels_last)
    return x


class MaxPool(Function):
    """y_q = max_{k} x_pad[s q + d k]  ->  dx_i = sum of g_q over the windows q whose maximum is x_i (torch's index)"""

    op = staticmethod(F.max_pool2d_with_indices)  # the torch function that also returns the indices
    dims = 2
    always_indices = False  # F.max_pool2d_with_indices returns (y, indices) whatever return_indices says

    @staticmethod
    def forward(ctx, input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
        source = _channels_last(input) if ctx._rule.dims == 2 else input
        try:
            y, indices = ctx._rule.op(source, kernel_size, stride if given(stride) else None, padding, dilation,
                                      ceil_mode, True)
        except RuntimeError:  # F.max_pool1d's checks have words of their own (the one with indices speaks of 2-d)
            if ctx._rule.dims == 1 and not (return_indices or ctx._rule.always_indices):
                torch.max_pool1d(input, kernel_size, stride if given(stride) else (), padding, dilation, ceil_mode)
            raise
        if source is not input:  # the same values and indices, back in input's layout
            y, indices = y.contiguous(), indices.contiguous()
        return MaxPool.keep(ctx, input, y, indices, return_indices)

    @staticmethod
    def keep(ctx, input, y, indices, return_indices):
        ctx.shape = input.shape
        ctx.save_for_backward(indices, input)  # (input: read by a create_graph backward, as torch's kernel reads it)
        return (y, indices) if return_indices or ctx._rule.always_indices else y

    @staticmethod
    def backward(ctx, g, *_):
        indices, x = ctx.saved_tensors
        return reading_input(scatter_to_input(g, indices, ctx.shape, ctx._rule.dims), x)


class AdaptiveMaxPool(MaxPool):
    """y_q = max of x over the adaptive window q  ->  dx_i = sum of g_q over the windows whose maximum is x_i"""

    @staticmethod
    def forward(ctx, input, output_size, return_indices=False):
        y, indices = ctx._rule.op(input, output_size, True)
        return MaxPool.keep(ctx, input, y, indices, return_indices)


def _window_sizes(out: int, size: int, kernel: int, stride: int, padding: int, include_pad: bool,
                  device: torch.device) -> torch.Tensor:
    """How many elements average pooling divides by, per output position along one dim (torch's rule)."""
    start = torch.arange(out, device=device) * stride - padding
    end = (start + kernel).clamp(max=size + padding)  # a ceil_mode window stops at the padding's end
    if include_pad:
        return end - start
    return end.clamp(max=size) - start.clamp(min=0)


class AvgPool(Function):
    """y_q = (1/D_q) sum_{k < K} x_pad[s q + k]  ->  dx = conv_transpose(g / D, ones(K), stride s), cropped by the
    padding (D_q: the window size, within the padding only if count_include_pad, or divisor_override)"""

    op = staticmethod(F.avg_pool2d)
    dims = 2

    @staticmethod
    def forward(ctx, input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
                divisor_override=None):
        n = ctx._rule.dims
        ctx.kernel = ntuple(kernel_size, n)
        ctx.stride = ntuple(stride, n) if given(stride) else ctx.kernel
        ctx.padding, ctx.include_pad, ctx.divisor = ntuple(padding, n), count_include_pad, divisor_override
        ctx.shape = input.shape
        ctx.save_for_backward(input)  # (read by a create_graph backward only, as torch's kernel reads it)
        extra = () if divisor_override is None else (divisor_override,)  # avg_pool1d has no such parameter
        return ctx._rule.op(input, ctx.kernel, ctx.stride, ctx.padding, ceil_mode, count_include_pad, *extra)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        dx = avg_pool_adjoint(g, ctx.shape, ctx.kernel, ctx.stride, ctx.padding, ctx.include_pad, ctx.divisor)
        return reading_input(dx, x)


def avg_pool_adjoint(g: torch.Tensor, shape: torch.Size, kernel: Sequence[int], stride: Sequence[int],
                     padding: Sequence[int], include_pad: bool = True, divisor: object = None) -> torch.Tensor:
    """dx of average pooling: conv_transpose(g / D, ones(K), stride s), cropped by the padding."""
    n = len(kernel)
    out, size = g.shape[-n:], shape[-n:]
    if divisor is None:
        divisor = torch.ones((), dtype=g.dtype, device=g.device)
        for q, length, k, s, p in zip(out, size, kernel, stride, padding):
            divisor = divisor.unsqueeze(-1) * _window_sizes(q, length, k, s, p, include_pad, g.device)
    box = torch.ones((1, 1, *kernel), dtype=g.dtype, device=g.device)
    spread = CONV_TRANSPOSE[n]((g / divisor).reshape(-1, 1, *out), box, None, tuple(stride))
    crop = [(-p, length + p - full) for p, length, full in zip(padding, size, spread.shape[2:])]
    return F.pad(spread, pad_argument(crop)).reshape(shape)


def _adaptive_matrix(out: int, size: int, like: torch.Tensor) -> torch.Tensor:
    """A[i, j] = 1/|window i| for j in window i = [floor(i size / out), ceil((i + 1) size / out)), else 0."""
    i = torch.arange(out, device=like.device)
    start, end = (i * size) // out, ((i + 1) * size + out - 1) // out
    j = torch.arange(size, device=like.device)
    inside = (j >= start[:, None]) & (j < end[:, None])
    return inside.to(like.dtype) / (end - start)[:, None].to(like.dtype)


class AdaptiveAvgPool(Function):
    """y = A x along each pooled dim, A the averaging matrix  ->  dx = A^T g;
    y_i = mean of x_j over floor(i in / out) <= j < ceil((i+1) in / out), in and out the dim's sizes"""

    op = staticmethod(F.adaptive_avg_pool2d)
    dims = 2

    @staticmethod
    def forward(ctx, input, output_size):
        ctx.shape = input.shape
        ctx.save_for_backward(input)  # (read by a create_graph backward only, as torch's kernel reads it)
        return ctx._rule.op(input, output_size)

    @staticmethod
    def backward(ctx, g):
        for axis in range(-ctx._rule.dims, 0):
            weights = _adaptive_matrix(g.shape[axis], ctx.shape[axis], g)
            g = (g.transpose(axis, -1) @ weights).transpose(axis, -1)
        return reading_input(g, ctx.saved_tensors[0])


def _rules(base: type, name: str, dims: int, op: object, callables: Sequence[object], **extra: object) -> type:
    """The rule of `base` for `dims` spatial dims (forward through `op`), registered for `callables`."""
    body = {"__doc__": base.__doc__, "op": staticmethod(op), "dims": dims, **extra}
    return register(*callables, rule=type(name, (base,), body))


for _n, _pools, _with_indices in [  # dims, the callables returning y, those returning (y, indices)
    (1, [F.max_pool1d, torch.max_pool1d], [F.max_pool1d_with_indices, torch.max_pool1d_with_indices]),
    (2, [F.max_pool2d, torch.max_pool2d], [F.max_pool2d_with_indices]),
    (3, [F.max_pool3d, torch.max_pool3d], [F.max_pool3d_with_indices]),
]:
    _rules(MaxPool, f"MaxPool{_n}d", _n, _with_indices[0], _pools)
    _rules(MaxPool, f"MaxPool{_n}dWithIndices", _n, _with_indices[0], _with_indices, always_indices=True)

for _n, _pool, _with_indices in [
    (1, F.adaptive_max_pool1d, F.adaptive_max_pool1d_with_indices),
    (2, F.adaptive_max_pool2d, F.adaptive_max_pool2d_with_indices),
    (3, F.adaptive_max_pool3d, F.adaptive_max_pool3d_with_indices),
]:
    _rules(AdaptiveMaxPool, f"AdaptiveMaxPool{_n}d", _n, _with_indices, [_pool])
    _rules(AdaptiveMaxPool, f"AdaptiveMaxPool{_n}dWithIndices", _n, _with_indices, [_with_indices], always_indices=True)

class FractionalMaxPool(MaxPool):
    """y_q = max of x over the pseudo-random window q  ->  dx_i = sum of g_q over the windows whose maximum is x_i
    (the windows are drawn once, in the forward, from torch's RNG or the samples given; backward reuses them)"""

    draws_random = True  # (inside torch's Python, unseen by tt.compile's tracing: its generator is set back after)

    @staticmethod
    def forward(ctx, input, kernel_size, output_size=None, output_ratio=None, return_indices=False,
                _random_samples=None):
        y, indices = ctx._rule.op(input, kernel_size, output_size, output_ratio, True, _random_samples)
        return MaxPool.keep(ctx, input, y, indices, return_indices)


for _n, _pool, _with_indices in [(2, F.fractional_max_pool2d, F.fractional_max_pool2d_with_indices),
                                 (3, F.fractional_max_pool3d, F.fractional_max_pool3d_with_indices)]:
    _rules(FractionalMaxPool, f"FractionalMaxPool{_n}d", _n, _with_indices, [_pool])
    _rules(FractionalMaxPool, f"FractionalMaxPool{_n}dWithIndices", _n, _with_indices, [_with_indices],
           always_indices=True)

# F.avg_pool1d is torch.avg_pool1d, F.adaptive_avg_pool1d is torch.adaptive_avg_pool1d
for _n, _avg, _adaptive in [(1, F.avg_pool1d, F.adaptive_avg_pool1d), (2, F.avg_pool2d, F.adaptive_avg_pool2d),
                            (3, F.avg_pool3d, F.adaptive_avg_pool3d)]:
    _rules(AvgPool, f"AvgPool{_n}d", _n, _avg, [_avg])
    _rules(AdaptiveAvgPool, f"AdaptiveAvgPool{_n}d", _n, _adaptive, [_adaptive])


class MaxPool1d(Module, torch.nn.MaxPool1d):
    """torch.nn.MaxPool1d, recorded by torchtrace's max-pool rule."""


class MaxPool2d(Module, torch.nn.MaxPool2d):
    """torch.nn.MaxPool2d, recorded by torchtrace's max-pool rule."""


class MaxPool3d(Module, torch.nn.MaxPool3d):
    """torch.nn.MaxPool3d, recorded by torchtrace's max-pool rule."""


class AvgPool1d(Module, torch.nn.AvgPool1d):
    """torch.nn.AvgPool1d, recorded by torchtrace's average-pool rule."""


class AvgPool2d(Module, torch.nn.AvgPool2d):
    """torch.nn.AvgPool2d, recorded by torchtrace's average-pool rule."""


class AvgPool3d(Module, torch.nn.AvgPool3d):
    """torch.nn.AvgPool3d, recorded by torchtrace's average-pool rule."""


class AdaptiveAvgPool1d(Module, torch.nn.AdaptiveAvgPool1d):
    """torch.nn.AdaptiveAvgPool1d, recorded by torchtrace's adaptive average-pool rule."""


class AdaptiveAvgPool2d(Module, torch.nn.AdaptiveAvgPool2d):
    """torch.nn.AdaptiveAvgPool2d, recorded by torchtrace's adaptive average-pool rule."""


class AdaptiveAvgPool3d(Module, torch.nn.AdaptiveAvgPool3d):
    """torch.nn.AdaptiveAvgPool3d, recorded by torchtrace's adaptive average-pool rule."""


class AdaptiveMaxPool1d(Module, torch.nn.AdaptiveMaxPool1d):
    """torch.nn.AdaptiveMaxPool1d, recorded by torchtrace's adaptive max-pool rule."""


class AdaptiveMaxPool2d(Module, torch.nn.AdaptiveMaxPool2d):
    """torch.nn.AdaptiveMaxPool2d, recorded by torchtrace's adaptive max-pool rule."""


class AdaptiveMaxPool3d(Module, torch.nn.AdaptiveMaxPool3d):
    """torch.nn.AdaptiveMaxPool3d, recorded by torchtrace's adaptive max-pool rule."""


class FractionalMaxPool2d(Module, torch.nn.FractionalMaxPool2d):
    """torch.nn.FractionalMaxPool2d, recorded by torchtrace's fractional max-pool rule."""


class FractionalMaxPool3d(Module, torch.nn.FractionalMaxPool3d):
    """torch.nn.FractionalMaxPool3d, recorded by torchtrace's fractional max-pool rule."""
