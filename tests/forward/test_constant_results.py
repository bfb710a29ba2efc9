"""tt.jvp's and tt.hvp's results carry no gradient (forward mode runs outside the graph). Where torch.func's would
carry one (f read a tensor requiring grad), a loss built from them must not back-propagate without that term: its
backward refuses, naming what to do. Elsewhere they are plain tensors, torch.func's values."""
import pytest
import torch

import torchtrace as tt
from torchtrace.errors import UnsupportedOperationError

torch.manual_seed(0)
X0, V = torch.randn(4, dtype=torch.float64), torch.randn(4, dtype=torch.float64)


def f(x):
    return (x.sin() * x).sum() * x


def _linear_pair():
    torch.manual_seed(1)
    theirs = torch.nn.Linear(4, 3).double()
    ours = tt.port(torch.nn.Linear(4, 3).double())
    ours.load_state_dict(theirs.state_dict())
    return theirs, ours


def test_a_jvp_of_a_primal_that_requires_grad_refuses_backward_instead_of_dropping_the_term():
    x = tt.as_tracer(X0.clone(), requires_grad=True)
    value, jv = tt.jvp(f, (x,), (V,))
    expected_value, expected_jv = torch.func.jvp(f, (X0,), (V,))
    torch.testing.assert_close(value.detach().as_subclass(torch.Tensor), expected_value, rtol=0, atol=1e-12)
    torch.testing.assert_close(jv.detach().as_subclass(torch.Tensor), expected_jv, rtol=0, atol=1e-12)
    assert jv.requires_grad  # as torch.func's result
    with pytest.raises(UnsupportedOperationError, match="tt.jvp: its result was computed outside the graph"):
        ((x ** 2).sum() + jv.sum()).backward()
    x.grad = None
    ((x ** 2).sum() + jv.detach().sum()).backward()  # as a constant: the rest of the gradient, torch's
    torch.testing.assert_close(x.grad.as_subclass(torch.Tensor), 2 * X0, rtol=0, atol=0)


@pytest.mark.parametrize("method", ["auto", "transpose"])
def test_a_jvp_through_a_ported_modules_parameters_refuses_backward(method):
    theirs, ours = _linear_pair()
    _, jv = tt.jvp(lambda x: torch.tanh(ours(x)), (X0,), (V,), method=method)
    _, expected = torch.func.jvp(lambda x: torch.tanh(theirs(x)), (X0,), (V,))
    torch.testing.assert_close(jv.detach().as_subclass(torch.Tensor), expected, rtol=0, atol=1e-12)
    with pytest.raises(UnsupportedOperationError, match="Differentiate with reverse mode twice"):
        (jv ** 2).sum().backward()
    assert ours.weight.grad is None  # nothing half-accumulated


def test_a_jvp_that_reads_nothing_requiring_grad_is_a_plain_tensor():
    theirs, ours = _linear_pair()
    ours.requires_grad_(False)
    value, jv = tt.jvp(lambda x: torch.tanh(ours(x)), (X0,), (V,))
    assert type(value) is torch.Tensor and type(jv) is torch.Tensor
    torch.testing.assert_close(jv, torch.func.jvp(lambda x: torch.tanh(theirs(x)), (X0,), (V,))[1], rtol=0, atol=1e-12)
    with torch.no_grad():  # grad mode off: torch.func's would be constant too
        x = tt.as_tracer(X0.clone(), requires_grad=True)
        assert type(tt.jvp(f, (x,), (V,))[1]) is torch.Tensor


def test_an_hvp_of_a_function_reading_a_tensor_that_requires_grad_refuses_backward():
    a = tt.as_tracer(torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64), requires_grad=True)
    p, v = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64), torch.tensor([1.0, 0.0, -1.0], dtype=torch.float64)

    def loss(q, scale):
        return (scale * q ** 3).sum()

    hv = tt.hvp(lambda q: loss(q, a), p, v)
    expected = torch.func.jvp(torch.func.grad(lambda q: loss(q, a.detach().as_subclass(torch.Tensor))), (p,), (v,))[1]
    torch.testing.assert_close(hv.detach().as_subclass(torch.Tensor), expected, rtol=0, atol=1e-12)  # 6 a q v
    with pytest.raises(UnsupportedOperationError, match="tt.hvp"):
        (hv.pow(2).sum() + (a ** 2).sum()).backward()
    plain_hv = tt.hvp(lambda q: loss(q, a.detach()), p, v)
    assert type(plain_hv) is torch.Tensor
    torch.testing.assert_close(plain_hv, expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("mode", ["reverse", "forward"])
def test_a_jacobian_or_hessian_through_parameters_refuses_backward(mode):
    theirs, ours = _linear_pair()
    J = tt.jacobian(lambda x: torch.tanh(ours(x)), X0, mode=mode)
    expected = torch.func.jacrev(lambda x: torch.tanh(theirs(x)))(X0)
    torch.testing.assert_close(J.detach().as_subclass(torch.Tensor), expected, rtol=0, atol=1e-12)
    with pytest.raises(UnsupportedOperationError, match="tt.jacobian / tt.hessian"):
        (ours(X0).sum() + J.pow(2).sum()).backward()
    H = tt.hessian(lambda x: torch.tanh(ours(x)).sum(), X0)
    with pytest.raises(UnsupportedOperationError, match="computed outside the graph"):
        H.sum().backward()
    ours.requires_grad_(False)
    assert type(tt.jacobian(lambda x: torch.tanh(ours(x)), X0, mode=mode)) is torch.Tensor


def test_nested_forward_mode_is_refused_instead_of_a_zero_tangent():
    v = torch.tensor([1.0, 2.0], dtype=torch.float64)

    def g(y):
        return torch.sin(y) * y

    with pytest.raises(UnsupportedOperationError, match="nested forward mode is not supported"):
        tt.jvp(lambda y: tt.jvp(g, (y,), (v,))[1], (torch.tensor([0.3, -0.7], dtype=torch.float64),), (v,))
    x = torch.tensor([0.3, -0.7], dtype=torch.float64)  # what it says to do instead: forward over reverse
    second = tt.jvp(lambda y: tt.grad((g(y) * v).sum(), y, create_graph=True)[0], (x,), (v,))[1]
    expected = torch.func.jvp(lambda y: torch.func.jvp(g, (y,), (v,))[1], (x,), (v,))[1]
    torch.testing.assert_close(second, expected, rtol=1e-12, atol=1e-12)  # g''(x) v^2, elementwise
