"""Ops whose torch backward kernel reads the forward's input (pooling, reflect / replicate padding, area
interpolation, prelu, rrelu): under create_graph their first derivative requires grad whenever the input does, with a
zero derivative toward it. A gradient penalty through them gives the input zeros, as torch (its .grad stayed None, and
tt.grad of the first derivative raised that nothing required grad); the ops torch differentiates without reading the
input (constant and circular padding, nearest / bilinear interpolation) stay unconnected, as torch's."""
import pytest
import torch
import torch.nn.functional as F

import torchtrace as tt

X = torch.randn(1, 2, 4, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
_, INDICES = F.max_pool2d(X, 2, return_indices=True)
SLOPE = torch.tensor([0.25, 0.5], dtype=torch.float64)
SAMPLES = torch.rand(1, 2, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(1))

READS_INPUT = {
    "max_pool1d": lambda x: F.max_pool1d(x.flatten(2), 2), "max_pool2d": lambda x: F.max_pool2d(x, 2),
    "max_pool3d": lambda x: F.max_pool3d(x.unsqueeze(0), 2), "avg_pool1d": lambda x: F.avg_pool1d(x.flatten(2), 2),
    "avg_pool2d": lambda x: F.avg_pool2d(x, 2, padding=1), "avg_pool3d": lambda x: F.avg_pool3d(x.unsqueeze(0), 2),
    "adaptive_avg_pool2d": lambda x: F.adaptive_avg_pool2d(x, 3),
    "adaptive_max_pool2d": lambda x: F.adaptive_max_pool2d(x, 3),
    "fractional_max_pool2d": lambda x: F.fractional_max_pool2d(x, 2, output_size=2, _random_samples=SAMPLES),
    "pad_reflect": lambda x: F.pad(x, (1, 2, 1, 1), mode="reflect"),
    "pad_replicate": lambda x: F.pad(x, (1, 1, 2, 0), mode="replicate"),
    "interpolate_area": lambda x: F.interpolate(x, size=(3, 3), mode="area"),
    "prelu": lambda x: F.prelu(x, SLOPE), "rrelu_eval": lambda x: F.rrelu(x, training=False),
}
UNCONNECTED = {
    "pad_constant": lambda x: F.pad(x, (1, 1)), "pad_circular": lambda x: F.pad(x, (1, 1, 1, 1), mode="circular"),
    "interpolate_nearest": lambda x: F.interpolate(x, scale_factor=2),
    "interpolate_bilinear": lambda x: F.interpolate(x, scale_factor=2, mode="bilinear"),
    "max_unpool2d": lambda x: F.max_unpool2d(x[..., :2, :2], INDICES, 2),
}


def _penalty(op, make, grad):
    """A linear head on op(x); the squared norm of d(head)/dx backpropagated: (x.grad, W.grad, whether the first
    derivative required grad)."""
    x = make(X)
    y = op(x)
    w = make(torch.randn(3, y.numel(), dtype=torch.float64, generator=torch.Generator().manual_seed(2)))
    first, = grad(F.linear(y.reshape(1, -1), w).sum(), x, create_graph=True)
    if not first.requires_grad:
        return None, None, False
    first.pow(2).sum().backward()
    return x.grad, w.grad, True


def _sides(op):
    ours = _penalty(op, lambda t: tt.tracer(t.clone(), requires_grad=True), tt.grad)
    theirs = _penalty(op, lambda t: t.clone().requires_grad_(), torch.autograd.grad)
    return ours, theirs


@pytest.mark.parametrize("name", list(READS_INPUT))
def test_a_gradient_penalty_gives_the_input_zeros_and_the_weights_torchs(name):
    (x_grad, w_grad, connected), (their_x_grad, their_w_grad, their_connected) = _sides(READS_INPUT[name])
    assert connected and their_connected
    torch.testing.assert_close(x_grad.as_subclass(torch.Tensor), their_x_grad, rtol=0, atol=0)
    torch.testing.assert_close(w_grad.as_subclass(torch.Tensor), their_w_grad)
    # finite differences: the penalty's value does not move with x (the ops are piecewise linear in x)
    def penalty_value(x):
        x = x.clone().requires_grad_()
        y = READS_INPUT[name](x)
        w = torch.randn(3, y.numel(), dtype=torch.float64, generator=torch.Generator().manual_seed(2))
        first, = torch.autograd.grad(F.linear(y.reshape(1, -1), w).sum(), x)
        return first.pow(2).sum()
    direction = torch.randn(X.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    slope = (penalty_value(X + 1e-6 * direction) - penalty_value(X - 1e-6 * direction)) / 2e-6
    assert abs(float(slope)) < 1e-6 and float((x_grad * direction).sum()) == 0.0


@pytest.mark.parametrize("name", list(UNCONNECTED))
def test_ops_torch_differentiates_without_their_input_stay_unconnected(name):
    (_, _, connected), (_, _, their_connected) = _sides(UNCONNECTED[name])
    assert connected == their_connected


def test_a_plain_backward_is_unchanged():
    x = tt.tracer(X.clone(), requires_grad=True)
    F.max_pool2d(x, 2).sum().backward()
    theirs = X.clone().requires_grad_()
    F.max_pool2d(theirs, 2).sum().backward()
    torch.testing.assert_close(x.grad.as_subclass(torch.Tensor), theirs.grad, rtol=0, atol=0)
