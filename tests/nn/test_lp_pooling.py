"""F.lp_pool1d/2d/3d rules and nn.LPPool1d/2d/3d, against torch autograd."""
import pytest
import torch
import torch.nn.functional as F
from helpers import check_op, double_backward_matches

import torchtrace as tt
from torchtrace.nn import lp_pooling

torch.manual_seed(0)
X = torch.randn(2, 3, 7, 6)
POSITIVE = X.abs() + 0.1
ZERO_WINDOW = X.double().clone()
ZERO_WINDOW[0, 0, :2, :2] = 0  # u = 0: torch's sign(u) relu(|u|) sends no gradient (no infinite slope)


@pytest.mark.parametrize("p", [1, 2, 3, 1.5])
@pytest.mark.parametrize("fn", [
    lambda x, p: F.lp_pool2d(x, p, 2),
    lambda x, p: F.lp_pool2d(x, p, (3, 2), stride=(2, 1)),
    lambda x, p: F.lp_pool2d(x, p, 3, 2, ceil_mode=True),  # windows past the edge
    lambda x, p: F.lp_pool1d(x.flatten(2), p, 4, 3, ceil_mode=True),
    lambda x, p: F.lp_pool1d(x[0].flatten(1), p, 3),  # unbatched
    lambda x, p: F.lp_pool3d(x[None], p, 2),
    lambda x, p: F.lp_pool3d(x[None], p, (2, 3, 2), stride=1, ceil_mode=True),
    lambda x, p: lp_pooling.LPPool2d(p, 2)(x) * x.sum(),
    lambda x, p: lp_pooling.LPPool1d(p, 3)(x.flatten(2)),
    lambda x, p: lp_pooling.LPPool3d(p, 2)(x[None]),
])
def test_lp_pool(fn, p):
    check_op(lambda x: fn(x, p), POSITIVE, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("fn", [lambda x: F.lp_pool2d(x, 2, 2), lambda x: F.lp_pool2d(x, 1, 3, 1),
                                lambda x: F.lp_pool2d(x, 4, 2, ceil_mode=True)])
def test_lp_pool_signed_inputs(fn):
    check_op(fn, X.double())


@pytest.mark.parametrize("p", [float("inf"), float("-inf")])
@pytest.mark.parametrize("fn", [
    lambda x, p: F.lp_pool2d(x, p, 2), lambda x, p: F.lp_pool2d(x, p, 3, 2, ceil_mode=True),
    lambda x, p: F.lp_pool1d(x.flatten(2), p, 4, 3), lambda x, p: F.lp_pool3d(x[None], p, 2),
    lambda x, p: lp_pooling.LPPool1d(p, 2)(x.flatten(2))])
def test_infinite_p_is_the_largest_or_smallest_magnitude_per_window(fn, p):
    """torch's max_pool(|x|) and -max_pool(-|x|): the gradient reaches each window's pick, signed (no NaN)."""
    check_op(lambda x: fn(x, p), X.double())
    double_backward_matches(lambda x: fn(x, p), X.double())


def test_all_zero_window_gets_zero_gradient_like_torch():
    theirs = ZERO_WINDOW.clone().requires_grad_(True)
    F.lp_pool2d(theirs, 2, 2).sum().backward()
    ours = tt.tracer(ZERO_WINDOW, requires_grad=True)
    F.lp_pool2d(ours, 2, 2).sum().backward()
    torch.testing.assert_close(ours.grad, theirs.grad, equal_nan=True)
    assert ours.grad[0, 0, :2, :2].eq(0).all()


def test_double_backward():
    double_backward_matches(lambda x: F.lp_pool2d(x, 2, 2), POSITIVE.double())
    double_backward_matches(lambda x: F.lp_pool1d(x, 3, 3, ceil_mode=True), POSITIVE.double().flatten(2))


def test_modules_print_like_torch():
    assert repr(lp_pooling.LPPool2d(2, 3, 2)) == repr(torch.nn.LPPool2d(2, 3, 2))
    assert F.lp_pool2d(tt.tracer(X, requires_grad=True), 2, 2).grad_fn.name == "LPPool2dBackward"


@pytest.mark.parametrize("p", [1.0, 2.0, 3.0, 1.5])
def test_windows_holding_nan_inf_zeros_or_negative_powers_send_torchs_gradients(p):
    """torch's chain runs through sign(u) relu(|u|): its derivative is sign(u)^2 (torch.sign(NaN) = 0) where u != 0
    and 0 at u = 0. A window holding a NaN sent [1, 1] for p = 1 where torch sends [0, 0] (NaN^0 = 1 times 0); for
    other p both send NaN. Zero windows, inf and odd powers of negative sums as torch, value for value."""
    nan, inf = float("nan"), float("inf")
    for values in ([1.0, nan, 2.0, 3.0], [0.0, 0.0, -1.0, 2.0], [1.0, 2.0, -3.0, 0.5], [inf, 2.0, 0.0, 0.5]):
        x = torch.tensor([[values]], dtype=torch.float64)
        ours, theirs = tt.as_tracer(x.clone(), requires_grad=True), x.clone().requires_grad_()
        F.lp_pool1d(ours, p, 2).sum().backward()
        F.lp_pool1d(theirs, p, 2).sum().backward()
        torch.testing.assert_close(ours.grad.as_subclass(torch.Tensor), theirs.grad, rtol=1e-12, atol=0, equal_nan=True)
