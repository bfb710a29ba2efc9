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


@pytest.mark.parametrize("name", ["jacobian", "hessian", "vjp"])
def test_torch_autograd_functional_refuses_tracers(name):
    fn = getattr(torch.autograd.functional, name)
    v = torch.ones(3, dtype=torch.float64)
    args = (lambda t: t.sin(), x(), v) if name == "vjp" else (lambda t: t.sin().sum(), x())
    with pytest.raises(tt.UnsupportedOperationError, match=r"^torch.autograd.grad: .* use tt.grad"):
        fn(*args)
