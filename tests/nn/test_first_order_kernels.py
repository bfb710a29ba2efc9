"""The first-order backwards that run torch's kernels (convolution, batch and layer norm, the smooth activations):
torch autograd's gradients bit for bit, whatever the layouts of the input and of the incoming gradient (a kernel
that read a gradient in another layout than it assumes would give silently wrong values)."""
import pytest
import torch
import torch.nn.functional as F

import torchtrace as tt

OPS = {
    "batch_norm, batch statistics": (lambda x, w, b: F.batch_norm(x, None, None, w, b, True), [(6,), (6,)]),
    "batch_norm, running statistics": (
        lambda x, w, b: F.batch_norm(x, torch.zeros(6), torch.ones(6), w, b, False), [(6,), (6,)]),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (5,), w, b), [(5,), (5,)]),
    "conv2d": (lambda x, w, b: F.conv2d(x, w, b, padding=1), [(3, 6, 3, 3), (3,)]),
    "conv_transpose2d": (lambda x, w, b: F.conv_transpose2d(x, w, b, stride=2), [(6, 3, 3, 3), (3,)]),
    "gelu": (F.gelu, []),
    "silu": (F.silu, []),
    "tanh": (torch.tanh, []),
    "sigmoid": (torch.sigmoid, []),
}


def laid_out(t: torch.Tensor, layout: str) -> torch.Tensor:
    if layout == "channels_last":
        return t.to(memory_format=torch.channels_last)
    if layout == "transposed":
        return t.transpose(0, 1).contiguous().transpose(0, 1)
    return t


@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("x_layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("g_layout", ["contiguous", "channels_last", "transposed"])
def test_gradients_are_torch_autograds_bits_in_every_layout(name, x_layout, g_layout):
    fn, parameter_shapes = OPS[name]
    torch.manual_seed(0)
    x = laid_out(torch.randn(4, 6, 5, 5), x_layout)
    inputs = [x, *(torch.randn(shape) for shape in parameter_shapes)]
    ours = [tt.tracer(t, requires_grad=True) for t in inputs]
    theirs = [t.clone().requires_grad_() for t in inputs]
    out, expected = fn(*ours), fn(*theirs)
    g = laid_out(torch.randn(expected.shape), g_layout)
    out.backward(g)
    expected.backward(g)
    assert torch.equal(out.as_subclass(torch.Tensor), expected.detach())
    for a, c in zip(ours, theirs):
        assert torch.equal(a.grad, c.grad)
