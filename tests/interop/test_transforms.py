"""torch machinery that cannot see torchtrace's graph refuses tracers clearly at the call (never a silent gradient)."""
import pytest
import torch
import torch.func

import torchtrace as tt


def x():
    return tt.tracer(torch.randn(3, dtype=torch.float64), requires_grad=True)


TRANSFORM_CALLS = {
    "torch.vmap": lambda t: torch.vmap(torch.sin)(t),
    "torch.func.vmap": lambda t: torch.func.vmap(torch.sin)(t),
    "torch.func.grad": lambda t: torch.func.grad(lambda v: v.sin().sum())(t),
    "torch.func.grad_and_value": lambda t: torch.func.grad_and_value(lambda v: v.sin().sum())(t),
    "torch.func.vjp": lambda t: torch.func.vjp(torch.sin, t),
    "torch.func.jvp": lambda t: torch.func.jvp(torch.sin, (t,), (torch.ones(3, dtype=torch.float64),)),
    "torch.func.jacrev": lambda t: torch.func.jacrev(torch.sin)(t),
    "torch.func.jacfwd": lambda t: torch.func.jacfwd(torch.sin)(t),
    "torch.func.hessian": lambda t: torch.func.hessian(lambda v: v.sin().sum())(t),
}


@pytest.mark.parametrize("name", list(TRANSFORM_CALLS))
def test_transforms_refuse_tracers(name):
    message = f"^({name}|torch.vmap): not supported on tracers .* use tt.grad"
    with pytest.raises(tt.UnsupportedOperationError, match=message):
        TRANSFORM_CALLS[name](x())


def test_transforms_still_work_on_plain_tensors():
    v = torch.randn(3, dtype=torch.float64)
    torch.testing.assert_close(torch.func.grad(lambda t: t.sin().sum())(v), v.cos())
    torch.testing.assert_close(torch.vmap(torch.sin)(v), v.sin())


def test_functional_call_works_on_tracers():
    lin = tt.port(torch.nn.Linear(3, 2).double())
    params = {k: v for k, v in lin.named_parameters()}
    out = torch.func.functional_call(lin, params, (x(),))
    out.sum().backward()
    assert lin.weight.grad is not None


def test_torch_autograd_grad_and_backward_refuse_tracers():
    t = x()
    y = t.sin().sum()
    with pytest.raises(tt.UnsupportedOperationError, match=r"^torch.autograd.grad: .* use tt.grad\(outputs, inputs"):
        torch.autograd.grad(y, t)
    with pytest.raises(tt.UnsupportedOperationError, match=r"^torch.autograd.backward: .* use y.backward\(\)"):
        torch.autograd.backward(y)
    p = torch.randn(3, requires_grad=True)
    (g,) = torch.autograd.grad(p.sin().sum(), p)
    torch.testing.assert_close(g, p.detach().cos())


def test_torch_compile_refuses_tracers_clearly():
    compiled = torch.compile(lambda v: v.sin() * 2)
    with pytest.raises(tt.UnsupportedOperationError, match="^torch.compile: .* call the function or module eagerly"):
        compiled(x())
    module = torch.compile(tt.port(torch.nn.Linear(3, 1).double()))
    with pytest.raises(tt.UnsupportedOperationError, match="^torch.compile: .* call the function or module eagerly"):
        module(torch.randn(3, dtype=torch.float64))


@pytest.mark.parametrize("name, instead", [("jacobian", "tt.jacobian"), ("hessian", "tt.hessian"), ("vjp", "tt.grad"),
                                           ("jvp", "tt.jvp"), ("hvp", "tt.hvp"), ("vhp", "tt.hvp")])
def test_torch_autograd_functional_refuses_tracers_naming_torchtraces_own(name, instead):
    fn = getattr(torch.autograd.functional, name)
    v = torch.ones(3, dtype=torch.float64)
    args = (lambda t: t.sin(), x(), v) if name in ("vjp", "jvp") else (lambda t: t.sin().sum(), x(), v)
    with pytest.raises(tt.UnsupportedOperationError, match=rf"^torch.autograd.functional.{name}: .* use {instead}\("):
        fn(*args[:2] if name in ("jacobian", "hessian") else args)
    plain = torch.randn(3, dtype=torch.float64)  # plain tensors: torch's own, untouched
    torch.testing.assert_close(torch.autograd.functional.jacobian(torch.sin, plain), torch.diag(plain.cos()))


@pytest.mark.parametrize("name", ["torch.vmap", "torch.func.grad", "torch.func.jacfwd", "torch.func.jvp"])
def test_a_transformed_function_closing_over_a_tracer_that_requires_grad_is_refused(name):
    """torch.vmap(lambda x: (w @ x).tanh().sum())(xs) with w a tracer parameter: torch's transform gave a plain result
    with no gradient to w, and `out.sum() + (w ** 2).sum()` then filled w.grad with 2w alone (torch: that plus the
    tanh part). Refused by name; a tracer needing no grad (a ported model's buffer) computes as a plain tensor."""
    w = tt.as_tracer(torch.tensor([[0.5, -1.0, 0.2], [1.5, 0.3, -0.4]], dtype=torch.float64), requires_grad=True)
    xs = torch.tensor([[0.3, -0.7, 1.2], [1.0, 0.5, -2.0]], dtype=torch.float64)
    f = lambda v: torch.tanh(w @ v).sum()  # noqa: E731
    calls = {"torch.vmap": lambda: torch.vmap(f)(xs), "torch.func.grad": lambda: torch.func.grad(f)(xs[0]),
             "torch.func.jacfwd": lambda: torch.func.jacfwd(f)(xs[0]),
             "torch.func.jvp": lambda: torch.func.jvp(f, (xs[0],), (xs[1],))}
    with pytest.raises(tt.UnsupportedOperationError, match=rf"^{name}: the function uses a tracer that requires grad"):
        calls[name]()
    constant = tt.as_tracer(w.detach().as_subclass(torch.Tensor).clone())  # no grad needed: torch's result
    torch.testing.assert_close(torch.vmap(lambda v: torch.tanh(constant @ v).sum())(xs).as_subclass(torch.Tensor),
                               torch.tanh(xs @ constant.as_subclass(torch.Tensor).t()).sum(1))
