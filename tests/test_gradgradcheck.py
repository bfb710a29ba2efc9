"""tt.gradgradcheck (second derivatives against finite differences of the first) and gradcheck's raise_exception,
decided as torch's gradcheck / gradgradcheck decide on the same functions."""
import pytest
import torch
import torch.nn.functional as F
from helpers import WrongSquare

import torchtrace as tt
from torchtrace.errors import GradientMismatch

SMOOTH = {
    "tanh_of_a_product": (lambda x, w: (torch.tanh(x @ w) ** 2).sum(-1), [(3, 4), (4, 2)]),
    "softmax_cross_entropy": (lambda x: F.cross_entropy(x, torch.tensor([0, 2])), [(2, 3)]),
    "layer_norm": (lambda x, w: F.layer_norm(x, (3,), w), [(2, 3), (3,)]),
    "two_outputs": (lambda x: (x.exp(), x.sin() * x), [(3,)]),
    "pow_and_log": (lambda x: (x.abs() + 1).log() * x ** 3, [(4,)]),
}


class DetachedSin(tt.Function):
    """sin with a right first derivative computed from a detached x: the second derivative is lost."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.sin(x)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * torch.cos(x.detach())


@pytest.mark.parametrize("name", sorted(SMOOTH))
def test_gradgradcheck_passes_where_torchs_passes(name):
    fn, shapes = SMOOTH[name]
    torch.manual_seed(0)
    inputs = [torch.randn(*s, dtype=torch.float64) for s in shapes]
    assert torch.autograd.gradgradcheck(fn, [x.clone().requires_grad_(True) for x in inputs])
    assert tt.gradgradcheck(fn, *inputs)


def test_a_first_derivative_that_cannot_be_differentiated_fails_gradgradcheck_only():
    x = torch.randn(3, dtype=torch.float64)
    assert tt.gradcheck(DetachedSin.apply, x)
    with pytest.raises(GradientMismatch, match="second derivatives: .* differs from its finite differences"):
        tt.gradgradcheck(DetachedSin.apply, x)
    assert tt.gradgradcheck(DetachedSin.apply, x, raise_exception=False) is False
    assert tt.gradgradcheck(torch.sin, x, raise_exception=False) is True


def test_gradcheck_returns_false_instead_of_raising_when_asked():
    x = torch.randn(3, dtype=torch.float64)
    assert tt.gradcheck(WrongSquare.apply, x, raise_exception=False) is False
    with pytest.raises(GradientMismatch):
        tt.gradcheck(WrongSquare.apply, x)


def test_gradgradcheck_needs_a_floating_input():
    with pytest.raises(ValueError, match="at least one floating-point tensor input"):
        tt.gradgradcheck(lambda n: n * 2, torch.tensor([1, 2]))
