"""aten-level spellings that reach __torch_function__ from decompositions and tests: constant_pad_nd,
aten.slice, aten._safe_softmax, the VJP ops aten._softmax_backward_data / threshold_backward / leaky_relu_backward /
hardtanh_backward / hardshrink_backward / softshrink_backward / hardsigmoid_backward / native_dropout_backward /
max_pool2d_with_indices_backward (the activations' rules write their gradients with them, as torch's formulas do, so a
second derivative through them is zeros, not absent), the smooth activations' VJP ops (smooth_vjp: tanh_backward,
sigmoid_backward, gelu_backward, silu_backward, each with its second derivative); and torch.dist, torch.nextafter."""
from types import SimpleNamespace
from typing import Any, Callable, Tuple

import torch

from torchtrace.autograd.function import Function, register
from torchtrace.ops.opmath import opmath
from torchtrace.ops.padding import Pad
from torchtrace.ops.reduction import VectorNorm
from torchtrace.ops.rule_tables import binary

T = torch.Tensor
aten = torch.ops.aten


@register(torch.constant_pad_nd)
class ConstantPadNd(Function):
    """y = x padded with `value` (negative pads crop)  ->  dx = g with the padding removed"""

    @staticmethod
    def forward(ctx, input, pad, value=0):
        return Pad.forward(ctx, input, pad, "constant", value)

    @staticmethod
    def backward(ctx, g):
        return Pad.backward(ctx, g), None, None


@register(aten.slice.Tensor, aten.slice)
class Slice(Function):
    """y = x[start:end:step] along dim  ->  dx = zeros with g scattered back into that slice"""

    @staticmethod
    def forward(ctx, input, dim=0, start=None, end=None, step=1):
        ctx.dim, ctx.shape = dim, input.shape
        ctx.picked = range(*slice(start, end, step).indices(input.shape[dim]))  # Python's clamping = aten's
        return aten.slice.Tensor(input, dim, start, end, step)

    @staticmethod
    def backward(ctx, g):
        index = torch.tensor(list(ctx.picked), dtype=torch.long, device=g.device)
        return g.new_zeros(ctx.shape).index_add(ctx.dim, index, g), None, None, None, None


@register(aten._safe_softmax.default, aten._safe_softmax)
class SafeSoftmax(Function):
    """y = softmax(x) with rows that are all -inf giving 0  ->  dL/dx = y * (g - sum(g * y))"""

    @staticmethod
    def forward(ctx, input, dim, dtype=None):
        y = aten._safe_softmax.default(input, dim, dtype=dtype)
        ctx.dim = dim
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return y * (g - (g * y).sum(ctx.dim, keepdim=True)), None, None


@register(aten._softmax_backward_data, aten._softmax_backward_data.default)
class SoftmaxBackwardData(Function):
    """r = y * (h - sum(h * y)) (softmax's VJP of h at output y)  ->  dh = y * (g - sum(g * y)),
    dy = g * (h - sum(h * y)) - h * sum(g * y)"""

    @staticmethod
    def forward(ctx, grad_output, output, dim, input_dtype):
        ctx.dim = dim
        ctx.save_for_backward(grad_output, output)
        return aten._softmax_backward_data(grad_output, output, dim, input_dtype)

    @staticmethod
    def backward(ctx, g):
        h, y, g = opmath(*ctx.saved_tensors, g)
        need_h, need_y = ctx.needs_input_grad[:2]
        gy = (g * y).sum(ctx.dim, keepdim=True)
        dh = y * (g - gy) if need_h else None
        dy = g * (h - (h * y).sum(ctx.dim, keepdim=True)) - h * gy if need_y else None
        return dh, dy, None, None


def masked_vjp(name: str, op: object, math: str) -> type:
    """The rule of a piecewise-linear activation's VJP op r = op(h, x, *options): linear in h, piecewise constant in
    x. So dh = op(g, x, *options) and dx = 0 — zeros, as torch sends them: the activation's gradient, written with
    this op, is a function of x whose derivative is 0, so a second derivative through it is zeros (a NaN in what
    made x meets them as in torch's), not absent."""

    def forward(ctx, grad_output, self, *options):
        ctx.options = options
        ctx.save_for_backward(self)
        return op(grad_output, self, *options)

    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        dx = torch.zeros_like(x) if ctx.needs_input_grad[1] else None
        return (op(g, x, *ctx.options), dx, *(None,) * len(ctx.options))

    rule = type(name, (Function,), {"__doc__": f"{math}  ->  dh = the same of g;  dx = 0 (piecewise constant in x)",
                                    "forward": staticmethod(forward), "backward": staticmethod(backward),
                                    "__module__": __name__})
    register(op, op.default, rule=rule)
    return rule


masked_vjp("ThresholdBackward", aten.threshold_backward, "r = h where x > t, else 0 (ReLU's VJP)")
masked_vjp("LeakyReluBackward", aten.leaky_relu_backward, "r = h where x > 0, else a h (LeakyReLU's VJP)")
masked_vjp("HardtanhBackward", aten.hardtanh_backward, "r = h where lo < x < hi, else 0 (hardtanh's, relu6's VJP)")
masked_vjp("HardshrinkBackward", aten.hardshrink_backward, "r = h where |x| > l, else 0 (hardshrink's VJP)")
masked_vjp("SoftshrinkBackward", aten.softshrink_backward, "r = h where |x| > l, else 0 (softshrink's VJP)")
masked_vjp("HardsigmoidBackward", aten.hardsigmoid_backward, "r = h / 6 where -3 < x < 3, else 0 (its VJP)")


def smooth_vjp(name: str, op: Any, math: str, curvature: Callable, options: Tuple[str, ...] = ()) -> type:
    """The rule of a smooth activation's VJP op r = op(h, v, *options) = h f'(v), which the activation's rule calls for
    speed (torch's one-pass kernel of its formula). v is what f' reads: the activation's input (gelu, silu) or its
    output (tanh, sigmoid). Linear in h: dh = op(g, v, *options); dv = g h curvature(v, *options), curvature = d f'/dv
    (its math: the docstring of each). `options` name op's keyword arguments (gelu_backward's approximate)."""

    def forward(ctx, grad_output, value, *args, **kwargs):
        ctx.options = {**dict(zip(options, args)), **kwargs}
        ctx.save_for_backward(grad_output, value)
        return op(grad_output, value, **ctx.options)

    def backward(ctx, g):
        h, v = ctx.saved_tensors
        need_h, need_v = ctx.needs_input_grad[:2]
        dh = op(g, v, **ctx.options) if need_h else None
        dv = (g * h * curvature(v, **ctx.options)).to(v.dtype) if need_v else None
        return (dh, dv, *(None,) * len(options))

    body = {"__doc__": math, "_param_names": ["grad_output", "value", *options], "op": staticmethod(op),
            "curvature": staticmethod(curvature), "option_names": options, "forward": staticmethod(forward),
            "backward": staticmethod(backward), "__module__": __name__}
    rule = type(name, (Function,), body)
    register(op, op.default, rule=rule)
    return rule


@register(aten.native_dropout_backward, aten.native_dropout_backward.default)
class NativeDropoutBackward(Function):
    """r = h * mask * scale (dropout's VJP)  ->  dh = g * mask * scale;  the mask is not differentiable"""

    @staticmethod
    def forward(ctx, grad_output, mask, scale):
        ctx.scale = scale
        ctx.save_for_backward(mask)
        return aten.native_dropout_backward(grad_output, mask, scale)

    @staticmethod
    def backward(ctx, g):
        (mask,) = ctx.saved_tensors
        return g * mask * ctx.scale, None, None


@register(aten.max_pool2d_with_indices_backward, aten.max_pool2d_with_indices_backward.default)
class MaxPool2dWithIndicesBackward(Function):
    """r = h scattered into zeros of x's shape at the max-pool indices (max_pool2d's VJP)  ->  dh = g gathered at
    those indices;  dx = 0 (r does not depend on x's values, only on the indices)"""

    @staticmethod
    def forward(ctx, grad_output, self, kernel_size, stride, padding, dilation, ceil_mode, indices):
        ctx.save_for_backward(indices)
        ctx.input_meta = self.shape, self.dtype, self.device
        return aten.max_pool2d_with_indices_backward(grad_output, self, kernel_size, stride, padding, dilation,
                                                     ceil_mode, indices)

    @staticmethod
    def backward(ctx, g):
        (indices,) = ctx.saved_tensors
        grad_output = g.flatten(-2).gather(-1, indices.flatten(-2)).view(indices.shape)
        shape, dtype, device = ctx.input_meta
        grad_self = torch.zeros(shape, dtype=dtype, device=device) if ctx.needs_input_grad[1] else None
        return grad_output, grad_self, None, None, None, None, None, None


@register(torch.dist, T.dist)
class Dist(Function):
    """y = ||a - b||_p  ->  da = d||d||_p/dd (as vector_norm) at d = a - b,  db = -da"""

    @staticmethod
    def forward(ctx, input, other, p=2):
        y = torch.dist(input, other, p)
        ctx.p = float(p)
        ctx.save_for_backward(input, other, y)
        return y

    @staticmethod
    def backward(ctx, g):
        a, b, y = ctx.saved_tensors
        diff = a - b
        norm = SimpleNamespace(saved_tensors=(diff, y), ord=ctx.p, dim=None, keepdim=False)  # vector_norm's ctx
        d = VectorNorm.backward(norm, g)
        if d is None:  # p = 0: none, as vector_norm's
            return None, None, None
        d = d.expand(torch.broadcast_shapes(a.shape, b.shape))
        need_a, need_b = ctx.needs_input_grad[:2]
        return (d if need_a else None), (-d if need_b else None), None


binary("Nextafter", [torch.nextafter, T.nextafter],
       "y = next float after a towards b  ->  dy/da = 1, dy/db = 0 (torch)",
       lambda g, a, b, z: g, lambda g, a, b, z: torch.zeros_like(g), uses=((), ()))
