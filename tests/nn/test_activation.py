"""Activation rules (F.relu6, hardtanh, leaky_relu, elu, gelu, silu, mish, softplus) and every activation module."""
import pytest
import torch
import torch.nn.functional as F
from helpers import check_op, double_backward_matches, non_contiguous

import torchtrace as tt
import torchtrace.nn as nn

torch.manual_seed(0)
X = torch.randn(3, 4) * 3
KINKS = torch.tensor([-2.0, -1.0, 0.0, 1.0, 6.0, 7.0])  # where the one-sided derivatives differ



@pytest.mark.parametrize("fn", [
    F.relu6,
    lambda x: F.hardtanh(x),
    lambda x: F.hardtanh(x, -0.5, 2.0),
    lambda x: F.hardtanh(x, min_val=0.0, max_val=6.0),
    lambda x: F.leaky_relu(x),
    lambda x: F.leaky_relu(x, 0.2),
    lambda x: F.leaky_relu(x, negative_slope=-0.3),
    lambda x: F.elu(x),
    lambda x: F.elu(x, 0.5),
    lambda x: F.elu(x, alpha=2.0),
    lambda x: F.gelu(x),
    lambda x: F.gelu(x, approximate="none"),
    lambda x: F.gelu(x, approximate="tanh"),
    F.silu,
    F.mish,
    lambda x: F.softplus(x),
    lambda x: F.softplus(x, 2.0),
    lambda x: F.softplus(x, beta=0.5, threshold=1.0),
    lambda x: F.softplus(x, beta=3.0, threshold=2.0),
    lambda x: F.elu(input=x),
])
@pytest.mark.parametrize("x", [X, X.double(), non_contiguous(X), torch.tensor(0.7), torch.tensor(-1.3)])
def test_activation_functions(fn, x):
    check_op(fn, x)


@pytest.mark.parametrize("fn", [
    F.relu6, F.hardtanh, lambda x: F.hardtanh(x, -2.0, 1.0), F.leaky_relu, F.elu,
    lambda x: F.softplus(x, 1.0, 0.0), lambda x: F.softplus(x, 2.0, 2.0),
])
def test_gradient_at_kinks_follows_torch(fn):
    check_op(fn, KINKS, gradcheck=False)  # finite differences straddle the kink; torch's choice is the reference


@pytest.mark.parametrize("fn", [
    lambda x: F.elu(x) * F.elu(x),
    lambda x: F.silu(x) + F.mish(x) * x,
    lambda x: F.gelu(F.leaky_relu(x, 0.1), approximate="tanh"),
])
def test_reused_and_chained(fn):
    check_op(fn, X)


@pytest.mark.parametrize("fn, inplace_fn", [
    (F.relu6, lambda x: F.relu6(x, inplace=True)),
    (F.hardtanh, lambda x: F.hardtanh(x, -1.0, 1.0, True)),
    (F.leaky_relu, lambda x: F.leaky_relu(x, 0.01, inplace=True)),
    (F.elu, lambda x: F.elu(x, inplace=True)),
    (F.silu, lambda x: F.silu(x, inplace=True)),
    (F.mish, lambda x: F.mish(x, inplace=True)),
])
def test_inplace_flag_changes_the_input_as_torch_does(fn, inplace_fn):
    leaf = tt.tracer(X, requires_grad=True)
    x = leaf * 2  # a non-leaf: torch allows in-place changes of it
    y = inplace_fn(x)
    assert y is x
    expected_leaf = X.clone().requires_grad_(True)
    expected = expected_leaf * 2
    inplace_fn(expected)
    torch.testing.assert_close(x.as_subclass(torch.Tensor), expected.detach())  # the input was changed
    (x * x).sum().backward()
    (expected * expected).sum().backward()
    torch.testing.assert_close(leaf.grad, expected_leaf.grad)


@pytest.mark.parametrize("fn, inplace_fn", [(F.relu6, lambda x: F.relu6(x, inplace=True)),
                                            (F.relu, lambda x: torch.nn.ReLU(inplace=True)(x))])
def test_inplace_flag_on_a_leaf_that_requires_grad_raises(fn, inplace_fn):
    with pytest.raises(RuntimeError, match=r"\(inplace=True\): a leaf tracer that requires grad"):
        inplace_fn(tt.tracer(X, requires_grad=True))


@pytest.mark.parametrize("fn", [
    lambda x: F.elu(x, 0.7), lambda x: F.leaky_relu(x, 0.2) * x, lambda x: F.softplus(x, 2.0), F.silu,
    lambda x: F.gelu(x, approximate="tanh"),
])
def test_double_backward(fn):
    double_backward_matches(fn, X / 3)


def test_gelu_double_backward():
    double_backward_matches(F.gelu, X / 3)


@pytest.mark.parametrize("name, args", [
    ("ReLU6", ()), ("LeakyReLU", (0.1,)), ("ELU", (0.5,)), ("GELU", ()), ("GELU", ("tanh",)), ("SiLU", ()),
    ("Mish", ()), ("Softplus", (2.0, 5.0)), ("Hardtanh", (-2.0, 2.0)),
])
def test_modules_match_torch(name, args):
    ours, theirs = getattr(nn, name)(*args), getattr(torch.nn, name)(*args)
    assert isinstance(ours, nn.Module) and isinstance(ours, type(theirs))
    assert repr(ours) == repr(theirs)
    check_op(ours, X)
    out = ours(tt.tracer(X, requires_grad=True))
    torch.testing.assert_close(out.as_subclass(torch.Tensor), theirs(X))
    assert out.grad_fn.module is ours


@pytest.mark.parametrize("name, args", [
    ("ReLU", ()),
    ("Sigmoid", ()),
    ("Tanh", ()),
    ("Softmax", (1,)),
    ("Softmax", (0,)),
    ("LogSoftmax", (-1,)),
])
def test_modules_backed_by_ops_rules(name, args):
    """These modules call F.relu, torch.sigmoid, torch.tanh, F.softmax, F.log_softmax: rules in torchtrace/ops."""
    ours, theirs = getattr(nn, name)(*args), getattr(torch.nn, name)(*args)
    assert repr(ours) == repr(theirs)
    check_op(ours, X)


def test_original_repr_of_activations():
    assert nn.ReLU().original_repr() == "ReLU()"
    assert nn.LeakyReLU(0.2).original_repr() == "LeakyReLU(negative_slope=0.2)"


def test_unknown_gelu_approximation_is_refused():
    with pytest.raises(RuntimeError, match="approximate"):
        F.gelu(tt.tracer(X, requires_grad=True), approximate="cubic")
