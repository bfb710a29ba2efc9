"""torch._weight_norm and torch.norm_except_dim rules; weight_norm / spectral_norm on tt.nn and ported modules."""
import pytest
import torch
from helpers import check_op, double_backward_matches
from torch.nn.utils import spectral_norm, weight_norm
from torch.nn.utils.parametrizations import spectral_norm as parametrized_spectral_norm
from torch.nn.utils.parametrizations import weight_norm as parametrized_weight_norm

import torchtrace as tt
from torchtrace.errors import UnsupportedOperationError

pytestmark = pytest.mark.filterwarnings("ignore:.*weight_norm.* is deprecated")

torch.manual_seed(0)
V = torch.randn(4, 3, 2)
X = torch.randn(5, 3)


def _g(dim: int) -> torch.Tensor:
    return torch.randn([V.shape[d] if d == dim else 1 for d in range(3)]) if dim != -1 else torch.randn(())


@pytest.mark.parametrize("dim", [0, 1, 2, -1])
def test_weight_norm_rule(dim):
    g = _g(dim)
    check_op(lambda v, g: torch._weight_norm(v, g, dim), V, g)
    check_op(lambda v: torch.norm_except_dim(v, 2, dim), V)
    check_op(lambda v, g: torch._weight_norm(v, g, dim) * v.sum(), V.double(), g.double())


@pytest.mark.parametrize("g_shape", [(1, 1, 2), (3, 1), (1, 3, 2)])
def test_weight_norm_over_the_whole_tensor_with_a_g_that_broadcasts(g_shape):
    """dim=-1 (one norm of all of v) with a g of several elements, broadcast over v as torch's forward does: w = g v /
    ||v||. Its backward reshaped g to the norm's single element and raised; now torch's gradients (tt.check: torch
    autograd; tt.gradcheck: central differences) and second derivatives."""
    g = torch.randn(g_shape)
    check_op(lambda v, g: torch._weight_norm(v, g, -1), V, g)
    double_backward_matches(lambda v, g: torch._weight_norm(v, g, -1), V.double(), g.double())


def test_zero_norm_and_second_derivatives():
    check_op(lambda v: torch.norm_except_dim(v, 2, 0), torch.cat([torch.zeros(1, 3), torch.randn(2, 3)]),
             gradcheck=False)  # ||v|| = 0: torch's subgradient 0
    composite = lambda v, g: torch.sin(v * (g / v.pow(2).sum([1, 2], keepdim=True).sqrt()))  # noqa: E731
    double_backward_matches(composite, V.double(), _g(0).double())  # the engine on the spelled-out formula ...
    v, g = tt.tracer(V.double(), requires_grad=True), tt.tracer(_g(0).double(), requires_grad=True)
    grads = tt.grad(torch.sin(torch._weight_norm(v, g, 0)).sum(), [v, g], create_graph=True)
    ours = tt.grad(sum((d * d).sum() for d in grads), [v, g])
    v2, g2 = (t.as_subclass(torch.Tensor).detach().requires_grad_(True) for t in (v, g))
    first = torch.autograd.grad(composite(v2, g2).sum(), [v2, g2], create_graph=True)
    expected = torch.autograd.grad(sum((d * d).sum() for d in first), [v2, g2])
    for a, b in zip(ours, expected):  # ... and the rule, against torch on that formula: torch's own double backward
        torch.testing.assert_close(a.as_subclass(torch.Tensor), b)  # of _weight_norm is off for v (CPU, 2.13)


def test_norm_except_dim_other_powers_refused():
    with pytest.raises(UnsupportedOperationError, match=r"torch.norm_except_dim: pow=3 has no gradient rule — use"):
        torch.norm_except_dim(tt.tracer(V, requires_grad=True), 3, 0)


def _two_steps_match(wrap, make_ours) -> list:
    torch.manual_seed(0)
    theirs = wrap(torch.nn.Linear(3, 4))
    torch.manual_seed(0)
    ours = wrap(make_ours())
    for _ in range(2):  # spectral_norm's power iteration updates u, v in place between steps
        theirs.zero_grad()
        ours.zero_grad()
        expected = theirs(X).pow(2).sum()
        expected.backward()
        loss = ours(tt.tracer(X)).pow(2).sum()
        loss.backward()
        torch.testing.assert_close(loss.as_subclass(torch.Tensor), expected.detach())
        params, twin = dict(ours.named_parameters()), dict(theirs.named_parameters())
        assert list(params) == list(twin)
        for name, p in params.items():
            torch.testing.assert_close(p.grad.as_subclass(torch.Tensor), twin[name].grad, rtol=1e-5, atol=1e-6)
    return list(params)


MAKERS = [lambda: tt.nn.Linear(3, 4), lambda: tt.port(torch.nn.Linear(3, 4))]


@pytest.mark.parametrize("make", MAKERS, ids=["tt.nn", "port"])
@pytest.mark.parametrize("wrap", [weight_norm, lambda m: weight_norm(m, dim=None), spectral_norm,
                                  parametrized_spectral_norm], ids=["weight_norm", "weight_norm dim=None",
                                                                     "spectral_norm", "parametrizations.spectral_norm"])
def test_norm_wrappers_train_like_torch(wrap, make):
    assert _two_steps_match(wrap, make)


def test_parametrized_weight_norm_trains_like_torch():
    assert _two_steps_match(parametrized_weight_norm, MAKERS[0])
