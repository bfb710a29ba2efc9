"""F.prelu (torch.prelu, Tensor.prelu) with its weight gradient, F.rrelu (torch.rrelu) with torch's draws, modules."""
import math

import pytest
import torch
import torch.nn.functional as F
from helpers import check_op, double_backward_matches, non_contiguous

import torchtrace as tt
import torchtrace.nn as nn

torch.manual_seed(0)
X = torch.randn(2, 3, 4)
ONE, PER_CHANNEL = torch.tensor([0.25]), torch.tensor([0.25, -0.5, 2.0])


@pytest.mark.parametrize("fn, inputs", [
    (F.prelu, (X, ONE)),
    (F.prelu, (X, PER_CHANNEL)),
    (F.prelu, (X.double(), PER_CHANNEL.double())),
    (F.prelu, (X[0].t(), PER_CHANNEL)),  # (N, C)
    (F.prelu, (torch.randn(5), torch.tensor(0.3))),  # 1-D input, 0-d weight
    (F.prelu, (torch.tensor(-1.5), ONE)),  # 0-d input
    (F.prelu, (non_contiguous(X[0]), torch.tensor([0.1, 0.2, 0.3, 0.4]))),
    (torch.prelu, (X, PER_CHANNEL)),
    (lambda x, w: x.prelu(w), (X, PER_CHANNEL)),
    (lambda x, w: F.prelu(x, w) * x, (X, ONE)),  # input used twice
    (lambda x: F.prelu(x, x[0, :, 0]), (X,)),  # the weight taken from the input itself
    (lambda w: F.prelu(X.to(w.dtype), w * w), (PER_CHANNEL,)),
])
def test_prelu(fn, inputs):
    check_op(fn, *inputs)


def test_prelu_at_zero_and_nan_follows_torch():
    """x = 0 takes the slope w (dy/dw = x = 0); a NaN takes the slope too and gives dy/dw = NaN."""
    check_op(F.prelu, torch.tensor([0.0, -1.0, 2.0, -0.0]), ONE, gradcheck=False)
    ours_x, ours_w = tt.tracer([math.nan, 1.0], requires_grad=True), tt.tracer([0.5], requires_grad=True)
    F.prelu(ours_x, ours_w).sum().backward()
    x, w = torch.tensor([math.nan, 1.0], requires_grad=True), torch.tensor([0.5], requires_grad=True)
    F.prelu(x, w).sum().backward()
    torch.testing.assert_close(ours_x.grad, x.grad, equal_nan=True)
    torch.testing.assert_close(ours_w.grad, w.grad, equal_nan=True)


def test_prelu_double_backward():
    double_backward_matches(lambda x, w: F.prelu(x, w) * x, X, PER_CHANNEL)


def seeded(fn, seed=3):
    def run(*args):
        torch.manual_seed(seed)
        return fn(*args)

    return run


@pytest.mark.parametrize("fn", [
    lambda x: F.rrelu(x),  # eval: the mean slope
    lambda x: F.rrelu(x, 0.1, 0.3),
    lambda x: F.rrelu(x, training=True),
    lambda x: F.rrelu(x, 0.1, 0.9, True),
    lambda x: F.rrelu(x, lower=0.2, upper=0.2, training=True),  # lower = upper: torch's fixed-slope backward
    lambda x: torch.rrelu(x, 0.1, 0.5, True),
    lambda x: torch.rrelu(x, 0.1, 0.5, True, generator=torch.Generator().manual_seed(4)),
    lambda x: F.rrelu(x, training=True) * x,
])
@pytest.mark.parametrize("x", [X, X.double(), non_contiguous(X[0]), torch.tensor(-0.7)])
def test_rrelu(fn, x):
    check_op(seeded(fn), x)


@pytest.mark.parametrize("seed", [0, 1, 7])
@pytest.mark.parametrize("x", [
    torch.tensor([0.5, -1.0, math.nan, 0.0, -2.0, 3.0, -0.0] * 5),  # NaN and x > 0 draw nothing, x <= 0 one each
    torch.randn(6, 5).double().t(),  # non-contiguous: torch draws in logical order
])
def test_rrelu_draws_the_same_slopes_as_torch(x, seed):
    torch.manual_seed(seed)
    ours = F.rrelu(tt.tracer(x, requires_grad=True), training=True)
    after_ours = torch.rand(3)
    torch.manual_seed(seed)
    theirs = F.rrelu(x, training=True)
    after_theirs = torch.rand(3)
    assert torch.equal(ours.as_subclass(torch.Tensor).nan_to_num(), theirs.nan_to_num())
    assert torch.equal(after_ours, after_theirs)


def test_rrelu_gradient_is_the_drawn_slope():
    x = tt.tracer(-torch.rand(500, dtype=torch.float64) - 0.1, requires_grad=True)
    y = F.rrelu(x, 0.2, 0.4, training=True)
    y.sum().backward()
    torch.testing.assert_close(x.grad, (y / x).as_subclass(torch.Tensor))
    assert 0.2 <= x.grad.min() and x.grad.max() <= 0.4 and len(x.grad.unique()) > 400


def test_rrelu_double_backward():
    double_backward_matches(seeded(lambda x: F.rrelu(x * x - 1, training=True) * x), X)


@pytest.mark.parametrize("num_parameters, init", [(1, 0.25), (3, 0.1)])
def test_prelu_module(num_parameters, init):
    ours, theirs = nn.PReLU(num_parameters, init), torch.nn.PReLU(num_parameters, init)
    assert repr(ours) == repr(theirs)
    assert isinstance(ours.weight, nn.Parameter) and isinstance(ours.weight, tt.tracer)
    x = tt.tracer(X, requires_grad=True)
    out = ours(x)
    out.sum().backward()
    expected_x = X.clone().requires_grad_(True)
    theirs(expected_x).sum().backward()
    torch.testing.assert_close(out.as_subclass(torch.Tensor), theirs(X).detach())
    torch.testing.assert_close(ours.weight.grad, theirs.weight.grad)
    torch.testing.assert_close(x.grad, expected_x.grad)
    assert out.grad_fn.module is ours


def test_rrelu_module_train_and_eval():
    ours, theirs = nn.RReLU(0.1, 0.3), torch.nn.RReLU(0.1, 0.3)
    assert repr(ours) == repr(theirs)
    for train in (True, False):
        ours.train(train)
        theirs.train(train)
        check_op(seeded(ours), X)
        torch.manual_seed(2)
        out = ours(tt.tracer(X, requires_grad=True))
        torch.manual_seed(2)
        assert torch.equal(out.as_subclass(torch.Tensor), theirs(X))


@pytest.mark.parametrize("training", [False, True])
@pytest.mark.parametrize("lower, upper", [(0.3, 0.1), (float("nan"), 0.1), (0.1, float("inf"))])
def test_rrelu_bounds_are_checked_as_torch_checks_them(training, lower, upper):
    """In eval mode the bounds went unchecked: lower > upper gave a leaky ReLU of their mean."""
    x = torch.randn(5, dtype=torch.float64)
    with pytest.raises(RuntimeError) as theirs:
        F.rrelu(x, lower, upper, training)
    with pytest.raises(RuntimeError) as ours:
        F.rrelu(tt.tracer(x, requires_grad=True), lower, upper, training)
    assert str(ours.value) == str(theirs.value)


@pytest.mark.parametrize("fn", [lambda x: F.rrelu(x), lambda x: F.rrelu(x, 0.2, 0.2, True)])
def test_rrelus_fixed_slope_is_exact_in_float64(fn):
    """The mean slope (lower + upper) / 2 as a float64 number, as torch's (it was rounded to float32: 2e-8 off)."""
    x = torch.tensor([-1.0, 2.0], dtype=torch.float64)
    theirs = x.clone().requires_grad_()
    fn(theirs).sum().backward()
    ours = tt.tracer(x, requires_grad=True)
    fn(ours).sum().backward()
    assert ours.grad.tolist() == theirs.grad.tolist()
    assert ours.grad.tolist()[0] in ((1 / 8 + 1 / 3) / 2, (0.2 + 0.2) / 2)  # the exact slope of the line
