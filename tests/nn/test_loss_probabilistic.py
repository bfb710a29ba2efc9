"""F.poisson_nll_loss (torch.poisson_nll_loss) and F.gaussian_nll_loss, every reduction and var form; the modules."""
import pytest
import torch
import torch.nn.functional as F
from helpers import check_op, double_backward_matches, non_contiguous

import torchtrace as tt
import torchtrace.nn as nn

pytestmark = pytest.mark.filterwarnings("ignore:size_average", "ignore:reduction")

torch.manual_seed(0)
X, T = torch.randn(4, 3), torch.rand(4, 3) * 4
RATE = torch.rand(4, 3) + 0.1
VAR = torch.rand(4, 3) + 0.1
X3, T3 = torch.randn(2, 3, 4), torch.randn(2, 3, 4)
REDUCTIONS = ["mean", "sum", "none"]


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("fn, inputs", [
    (lambda x, t, r: F.poisson_nll_loss(x, t, reduction=r), (X, T)),
    (lambda x, t, r: F.poisson_nll_loss(x, t, False, reduction=r), (RATE, T)),
    (lambda x, t, r: F.poisson_nll_loss(x, t, True, True, reduction=r), (X, T + 0.01)),  # Stirling where t > 1
    (lambda x, t, r: F.poisson_nll_loss(x, t, False, True, eps=0.1, reduction=r), (RATE, T + 0.01)),
    (lambda x, t, r: torch.poisson_nll_loss(x, t, True, False, 1e-8, ["none", "mean", "sum"].index(r)), (X, T)),
    (lambda x, t, v, r: F.gaussian_nll_loss(x, t, v, reduction=r), (X, T, VAR)),
    (lambda x, t, v, r: F.gaussian_nll_loss(x, t, v, True, reduction=r), (X, T, VAR)),
    (lambda x, t, v, r: F.gaussian_nll_loss(x, t, v, reduction=r), (X, T, VAR[:, 0])),  # var lacks the last dim
    (lambda x, t, v, r: F.gaussian_nll_loss(x, t, v, reduction=r), (X, T, VAR[:, :1])),  # last dim 1
    (lambda x, t, v, r: F.gaussian_nll_loss(x, t, v, reduction=r), (X, T, VAR[:1])),  # size 1 in another dim
    (lambda x, t, v, r: F.gaussian_nll_loss(x, t, v, reduction=r), (X3, T3, torch.rand(2, 1, 4) + 0.1)),
    (lambda x, t, v, r: F.gaussian_nll_loss(x, t, v, reduction=r), (X3, T3, torch.rand(2, 3) + 0.1)),
    (lambda x, t, r: F.gaussian_nll_loss(x, t, 0.5, reduction=r), (X, T)),  # a float var
])
def test_losses(fn, inputs, reduction):
    check_op(lambda *xs: fn(*xs, reduction), *inputs)


@pytest.mark.parametrize("fn, inputs", [
    (lambda x, t: F.poisson_nll_loss(x, t, size_average=False), (X, T)),
    (lambda x, t: F.poisson_nll_loss(x, t, reduce=False), (X.double(), T.double())),
    (lambda x, t: F.poisson_nll_loss(x, t), (X, T[0])),  # broadcast target
    (lambda x: F.poisson_nll_loss(x, x.exp()), (non_contiguous(X),)),
    (lambda x, v: F.gaussian_nll_loss(x, x * 2, v), (X, VAR)),
    (lambda x, t, v: F.gaussian_nll_loss(x, t, v), (X, T[0], VAR)),
    (lambda x, t, v: F.gaussian_nll_loss(x, t, v), (X.double(), T.double(), VAR.double())),
])
def test_loss_forms(fn, inputs):
    check_op(fn, *inputs)


@pytest.mark.parametrize("fn, inputs", [
    (lambda x, t, v: F.gaussian_nll_loss(x, t, v, eps=0.5), (X, T, VAR)),  # var clamped at eps in places
    (lambda x, t, v: F.gaussian_nll_loss(x, t, v, True, 0.3, "sum"), (X, T, VAR)),
])
def test_gaussian_var_below_eps_follows_torch(fn, inputs):
    """torch clamps a clone of var in place under no_grad: var's gradient is evaluated at max(var, eps) but not
    masked by the clamp, which finite differences cannot see; torch is the reference here."""
    check_op(fn, *inputs, gradcheck=False)


def test_poisson_full_target_gradient_at_zero_is_zero_not_torchs_nan():
    """Stirling's term is masked where t <= 1; torch differentiates its t log t at t = 0 to NaN, torchtrace gives 0."""
    t = torch.tensor([0.0, 0.5, 1.0, 2.0])
    ours = tt.tracer(t, requires_grad=True)
    F.poisson_nll_loss(torch.zeros(4), ours, full=True, reduction="sum").backward()
    theirs = t.clone().requires_grad_(True)
    F.poisson_nll_loss(torch.zeros(4), theirs, full=True, reduction="sum").backward()
    assert theirs.grad[0].isnan()
    torch.testing.assert_close(ours.grad[1:], theirs.grad[1:])
    assert ours.grad[0] == 0
    check_op(lambda x: F.poisson_nll_loss(x, t, full=True), torch.randn(4))  # the input's gradient: as torch's


@pytest.mark.parametrize("fn, inputs", [
    (lambda x, t: F.poisson_nll_loss(x, t, full=True), (X, T + 1.5)),
    (lambda x, t: F.poisson_nll_loss(x, t, False, reduction="sum"), (RATE, T)),
    (lambda x, t, v: F.gaussian_nll_loss(x, t, v), (X, T, VAR)),
    (lambda x, t, v: F.gaussian_nll_loss(x, t, v, full=True), (X, T, VAR[:, 0])),
])
def test_double_backward(fn, inputs):
    double_backward_matches(fn, *inputs)


@pytest.mark.parametrize("name, kwargs, inputs", [
    ("PoissonNLLLoss", {}, (X, T)),
    ("PoissonNLLLoss", {"log_input": False, "full": True, "reduction": "sum"}, (RATE, T + 0.01)),
    ("GaussianNLLLoss", {}, (X, T, VAR)),
    ("GaussianNLLLoss", {"full": True, "eps": 1e-3, "reduction": "none"}, (X, T, VAR[:, 0])),
])
def test_modules_match_torch(name, kwargs, inputs):
    ours, theirs = getattr(nn, name)(**kwargs), getattr(torch.nn, name)(**kwargs)
    assert isinstance(ours, nn.Module) and repr(ours) == repr(theirs)
    check_op(ours, *inputs)
    out = ours(*(tt.tracer(x, requires_grad=True) for x in inputs))
    torch.testing.assert_close(out.as_subclass(torch.Tensor), theirs(*inputs))
    assert out.grad_fn.module is ours
