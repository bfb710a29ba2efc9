"""Convolutions: conv1d/2d/3d and conv_transpose1d/2d/3d, their hand-derived gradients, and the modules.

For one spatial dimension (the others behave the same), with stride s, padding p, dilation d, kernel size K:

    conv:            y[n, o, q] = b[o] + sum_{c in group(o), k} w[o, c, k] x_pad[n, c, s q + d k]
    conv_transpose:  the adjoint of that map: y = conv_transpose(x, w) is the gradient of conv with respect to
                     its input, so each rule's backward is the other rule's forward.

Both weight gradients are a correlation of the signal with the upstream gradient, computed as a convolution
with roles swapped (`_correlate`): the batch becomes the channel axis, stride and dilation trade places.
Every backward recorded with create_graph=True uses only ops with rules (conv, conv_transpose, pad, reshape,
transpose, sum), so it is differentiated again: double backward works for free. A first-order backward (no graph
recorded) runs the same formulas by torch's convolution_backward kernels: torch autograd's bits, at its speed.
"""
from typing import Any, Callable, Dict, List, Sequence, Tuple, Union

import torch
import torch.nn.functional as F

from torchtrace.autograd.function import Function, register
from torchtrace.nn.module import Module

IntOrTuple = Union[int, Sequence[int]]
CONV = {1: torch.conv1d, 2: torch.conv2d, 3: torch.conv3d}
CONV_TRANSPOSE = {1: torch.conv_transpose1d, 2: torch.conv_transpose2d, 3: torch.conv_transpose3d}


def ntuple(value: IntOrTuple, n: int) -> Tuple[int, ...]:
    """3 -> (3, 3) for n = 2; a sequence of length 1 is repeated, as torch does."""
    if not isinstance(value, (list, tuple)):
        return (int(value),) * n
    value = tuple(int(v) for v in value)
    return value * n if len(value) == 1 else value


def pad_argument(pairs: Sequence[Tuple[int, int]]) -> List[int]:
    """[(lo, hi) per spatial dim, first to last] -> F.pad's flat list, which starts at the last dim."""
    return [side for lo_hi in reversed(pairs) for side in lo_hi]


def padding_pairs(padding: Union[str, IntOrTuple], kernel: Sequence[int], dilation: Sequence[int]) -> list:
    """(lo, hi) zero padding per spatial dim. 'same' pads d (K - 1) in all, the odd one on the high side (torch)."""
    if padding == "valid":
        return [(0, 0)] * len(kernel)
    if padding == "same":
        total = [d * (k - 1) for k, d in zip(kernel, dilation)]
        return [(t // 2, t - t // 2) for t in total]
    if isinstance(padding, str):
        raise ValueError(f"torchtrace conv: invalid padding string {padding!r}; use 'same', 'valid' or numbers")
    return [(p, p) for p in ntuple(padding, len(kernel))]


def bias_grad(g: torch.Tensor) -> torch.Tensor:
    """db[o] = sum of g over every dim but the channel dim (dim 1)."""
    return g.sum([0, *range(2, g.dim())])


def _correlate(signal: torch.Tensor, source: torch.Tensor, groups: int, stride: Sequence[int],
               padding: Sequence[int], dilation: Sequence[int], kernel: Sequence[int]) -> torch.Tensor:
    """r[j, i, k] = sum_{n, q} source[n, j, q] signal_pad[n, group(j) Cg + i, s q + d k]  (shape J x Cg x K).

    That is a convolution whose batch is signal's channels (Cg per group) and whose channels are the G groups
    times the batch; the kernel is `source` with batch and channels swapped; stride and dilation trade places.
    Its spatial size can exceed K by the positions no window reached: those are cut off.
    """
    n_batch, channels, *size = signal.shape
    per_group = channels // groups
    if n_batch == 0:  # an empty batch: no term in the sum
        return torch.zeros((source.shape[1], per_group, *kernel), dtype=source.dtype, device=source.device)
    planes = signal.reshape(n_batch, groups, per_group, *size).transpose(0, 2).reshape(per_group, -1, *size)
    out = CONV[len(kernel)](planes, source.transpose(0, 1), None, tuple(dilation), tuple(padding), tuple(stride),
                            groups)
    if tuple(out.shape[2:]) != tuple(kernel):
        out = out[(slice(None), slice(None), *(slice(0, k) for k in kernel))]
    return out.transpose(0, 1)


def _backward_inputs(ctx: Any, g: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, bool]:
    """What both convolution backwards start from: (x, w, g, spatial dims n, unbatched), an unbatched (C, *spatial)
    input and its gradient given a batch dim of 1 for the backward's convolutions."""
    x, w = ctx.saved_tensors
    n = w.dim() - 2
    if x.dim() == n + 1:
        return x.unsqueeze(0), w, g.unsqueeze(0), n, True
    return x, w, g, n, False


def _torchs_kernel(ctx: Any, g: torch.Tensor, x: torch.Tensor, w: torch.Tensor, padding: Sequence[int],
                   transposed: bool, output_padding: Sequence[int], unbatched: bool) -> tuple:
    """(dx, dw, db) of the formulas above by torch's convolution_backward, for a first-order backward (no graph
    recorded): the kernels torch autograd runs, so its bits, in a third of the time of the convolutions with roles
    swapped (which stay the create_graph path: every op there has a rule)."""
    needs = list(ctx.needs_input_grad[:3])
    out_channels = w.shape[1] * ctx.groups if transposed else w.shape[0]
    grad_x, grad_w, grad_b = torch.ops.aten.convolution_backward(
        g, x, w, [out_channels] if needs[2] else None, list(ctx.stride), list(padding), list(ctx.dilation),
        transposed, list(output_padding), ctx.groups, needs)
    return (grad_x.squeeze(0) if unbatched and grad_x is not None else grad_x), grad_w, grad_b


def _first_order(x: torch.Tensor) -> bool:
    """Whether a convolution's backward may run torch's kernel: no graph recorded, a batch that is not empty."""
    return not torch.is_grad_enabled() and x.shape[0] > 0


class Convolution(Function):
    """y = conv(x, w) + b  ->  dx = conv_transpose(g, w) (same stride, padding, dilation, groups; output_padding
    restores x's size),  dw[o, c, k] = sum_{n,q} g[n,o,q] x_pad[n,c,s q + d k] (conv with roles swapped),  db = sum g"""

    dims = 2  # spatial dims of the torch function called (one rule per function: by_dims)

    @staticmethod
    def forward(ctx, input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
        n = ctx._rule.dims  # (a weight of another rank: the torch function's own error)
        ctx.stride, ctx.dilation, ctx.groups = ntuple(stride, n), ntuple(dilation, n), groups
        ctx.pads = padding_pairs(padding, weight.shape[2:], ctx.dilation)
        ctx.save_for_backward(input, weight)
        return CONV[n](input, weight, bias, stride, padding, dilation, groups)

    @staticmethod
    def backward(ctx, g):
        x, w, g, n, unbatched = _backward_inputs(ctx, g)
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        low = [lo for lo, _ in ctx.pads]
        if _first_order(x) and all(lo == hi for lo, hi in ctx.pads):  # (padding='same' with an even kernel: below)
            return _torchs_kernel(ctx, g, x, w, low, False, [0] * n, unbatched)
        extra = [(0, hi - lo) for lo, hi in ctx.pads]  # 'same' with an even kernel: one more zero on the high side
        asymmetric = any(hi for _, hi in extra)
        grad_x = grad_w = None
        if need_x:
            size = [length + hi for length, (_, hi) in zip(x.shape[2:], extra)]
            produced = [(q - 1) * s - 2 * p + d * (k - 1) + 1
                        for q, s, p, d, k in zip(g.shape[2:], ctx.stride, low, ctx.dilation, w.shape[2:])]
            output_padding = tuple(want - got for want, got in zip(size, produced))
            grad_x = CONV_TRANSPOSE[n](g, w, None, ctx.stride, tuple(low), output_padding, ctx.groups, ctx.dilation)
            if asymmetric:
                grad_x = F.pad(grad_x, [-side for side in pad_argument(extra)])
            grad_x = grad_x.squeeze(0) if unbatched else grad_x
        if need_w:
            signal = F.pad(x, pad_argument(extra)) if asymmetric else x
            grad_w = _correlate(signal, g, ctx.groups, ctx.stride, low, ctx.dilation, w.shape[2:])
        return grad_x, grad_w, bias_grad(g) if need_b else None


class ConvTranspose(Function):
    """y = conv_transpose(x, w) + b, the adjoint of conv  ->  dx = conv(g, w) (same stride, padding, dilation,
    groups),  dw[c, o, k] = sum_{n,q} x[n,c,q] g_pad[n,o,s q + d k] (conv with roles swapped),  db = sum g"""

    dims = 2  # spatial dims of the torch function called (one rule per function: by_dims)

    @staticmethod
    def forward(ctx, input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
        n = ctx._rule.dims
        ctx.stride, ctx.padding = ntuple(stride, n), ntuple(padding, n)
        ctx.dilation, ctx.groups, ctx.output_padding = ntuple(dilation, n), groups, ntuple(output_padding, n)
        ctx.save_for_backward(input, weight)
        return CONV_TRANSPOSE[n](input, weight, bias, stride, padding, output_padding, groups, dilation)

    @staticmethod
    def backward(ctx, g):
        x, w, g, n, unbatched = _backward_inputs(ctx, g)
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        if _first_order(x):
            return _torchs_kernel(ctx, g, x, w, ctx.padding, True, ctx.output_padding, unbatched)
        grad_x = grad_w = None
        if need_x:
            grad_x = CONV[n](g, w, None, ctx.stride, ctx.padding, ctx.dilation, ctx.groups)
            if grad_x.shape[2:] != x.shape[2:]:  # output_padding >= stride: windows past x's end, cut them off
                grad_x = grad_x[(slice(None), slice(None), *(slice(0, size) for size in x.shape[2:]))]
            grad_x = grad_x.squeeze(0) if unbatched else grad_x
        if need_w:
            grad_w = _correlate(g, x, ctx.groups, ctx.stride, ctx.padding, ctx.dilation, w.shape[2:])
        return grad_x, grad_w, bias_grad(g) if need_b else None


def by_dims(base: type, functions: Dict[int, Callable]) -> None:
    """One rule per torch function: `base` with `dims` set to that function's spatial dims (so a weight of another
    rank meets that function's own check), each named as `base` (torch's grad_fn is one ConvolutionBackward)."""
    for dims, function in functions.items():
        register(function, rule=type(base.__name__, (base,), {"__doc__": base.__doc__, "dims": dims}))


by_dims(Convolution, CONV)  # F.conv1d/2d/3d are these; nn.Conv*d call them
by_dims(ConvTranspose, CONV_TRANSPOSE)  # = F.conv_transpose*d


class _Conv(Module):
    """A convolution module: prints as `Conv2d 3 -> 8` inside an original-style `Sequence(...)`."""

    trace_grad_shapes = True  # the backprop trace shows GRAD: out -> in for conv layers, as the original

    def original_repr(self) -> str:
        return f"{type(self).__name__} {self.in_channels} -> {self.out_channels}"


class Conv1d(_Conv, torch.nn.Conv1d):
    """torch.nn.Conv1d with tracer parameters (same initialisation, so the same seed gives the same weights)."""


class Conv2d(_Conv, torch.nn.Conv2d):
    """torch.nn.Conv2d with tracer parameters; prints as `Conv2d 3 -> 8` inside an original-style model."""


class Conv3d(_Conv, torch.nn.Conv3d):
    """torch.nn.Conv3d with tracer parameters."""


class ConvTranspose1d(_Conv, torch.nn.ConvTranspose1d):
    """torch.nn.ConvTranspose1d with tracer parameters."""


class ConvTranspose2d(_Conv, torch.nn.ConvTranspose2d):
    """torch.nn.ConvTranspose2d with tracer parameters."""


class ConvTranspose3d(_Conv, torch.nn.ConvTranspose3d):
    """torch.nn.ConvTranspose3d with tracer parameters."""

