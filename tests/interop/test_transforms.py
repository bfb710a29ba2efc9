"""torch machinery that cannot see torchtrace's graph refuses tracers clearly at the call (never a silent gradient);
torch.autograd.grad / backward, and torch.autograd.functional written on them, run on torchtrace's engine."""
import copy

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


def test_torch_autograd_grad_and_backward_answer_tracers_with_torchs_gradients():
    """torch.autograd.grad / backward on tracers are answered by torchtrace's engine, every argument bound as torch
    binds it (positionally too: only_inputs, deprecated, ignored with torch's warning); on plain tensors torch's."""
    data = torch.randn(3, dtype=torch.float64)
    t, p = tt.tracer(data, requires_grad=True), data.clone().requires_grad_()
    ours = torch.autograd.grad(t.sin().sum(), t, None, None, True)[0]
    theirs = torch.autograd.grad(p.sin().sum(), p, None, None, True)[0]
    torch.testing.assert_close(ours.as_subclass(torch.Tensor), theirs.detach())
    torch.testing.assert_close(ours.as_subclass(torch.Tensor), data.cos())
    with pytest.warns(FutureWarning, match="only_inputs argument is deprecated"):
        torch.autograd.grad(t.sin().sum(), t, None, None, False, False)
    torch.autograd.backward([t.exp().sum(), (t * t).sum()], grad_tensors=[torch.tensor(2.0, dtype=torch.float64),
                                                                        None], inputs=[t])
    torch.testing.assert_close(t.grad.as_subclass(torch.Tensor), 2 * data.exp() + 2 * data)
    with pytest.warns(FutureWarning, match="grad_variables"), pytest.raises(RuntimeError, match="both passed"):
        torch.autograd.backward(t.sum(), grad_tensors=torch.tensor(1.0), grad_variables=torch.tensor(1.0))


def test_a_gradient_penalty_written_with_torch_autograd_grad_runs_on_a_ported_critic():
    """WGAN-GP's penalty as torch code writes it (create_graph through torch.autograd.grad, then backward): the
    critic's parameter gradients equal torch autograd's, and central differences of the penalty in float64."""
    torch.manual_seed(0)
    critic = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)).double()
    ported = tt.port(copy.deepcopy(critic))
    points = torch.randn(5, 4, dtype=torch.float64)

    def penalty(model, x):
        score = model(x)
        (g,) = torch.autograd.grad(outputs=score, inputs=x, grad_outputs=torch.ones_like(score), create_graph=True,
                                   retain_graph=True)
        return ((g.norm(2, dim=1) - 1) ** 2).mean()

    penalty(ported, tt.tracer(points, requires_grad=True)).backward()
    penalty(critic, points.clone().requires_grad_()).backward()
    for ours, theirs in zip(ported.parameters(), critic.parameters()):  # (the last bias: no gradient in either)
        assert (ours.grad is None) == (theirs.grad is None)
        if theirs.grad is not None:
            torch.testing.assert_close(ours.grad.as_subclass(torch.Tensor), theirs.grad)
    assert critic[2].bias.grad is None and critic[0].weight.grad is not None
    weight = critic[0].weight
    for index in [(0, 0), (3, 2), (7, 3)]:
        with torch.no_grad():
            weight[index] += 1e-6
        up = penalty(critic, points.clone().requires_grad_()).item()
        with torch.no_grad():
            weight[index] -= 2e-6
        down = penalty(critic, points.clone().requires_grad_()).item()
        with torch.no_grad():
            weight[index] += 1e-6
        assert abs((up - down) / 2e-6 - ported[0].weight.grad[index].item()) < 1e-6


def test_torch_compile_refuses_tracers_clearly():
    compiled = torch.compile(lambda v: v.sin() * 2)
    with pytest.raises(tt.UnsupportedOperationError, match="^torch.compile: .* call the function or module eagerly"):
        compiled(x())
    module = torch.compile(tt.port(torch.nn.Linear(3, 1).double()))
    with pytest.raises(tt.UnsupportedOperationError, match="^torch.compile: .* call the function or module eagerly"):
        module(torch.randn(3, dtype=torch.float64))


def _central(f, x, v, h=1e-6):
    """The directional derivative of f at x along v, by central differences (float64)."""
    return (f(x + h * v) - f(x - h * v)) / (2 * h)


_G = lambda t: t.sin() * t.cumsum(0)  # noqa: E731  (a vector function, its Jacobian not diagonal)
_F = lambda t: (t.sin() * t).sum() + t.prod()  # noqa: E731  (a scalar function, its Hessian not diagonal)


def _plain_gradient(t):
    t = t.detach().clone().requires_grad_()
    return torch.autograd.grad(_F(t), t)[0]


FUNCTIONAL = {  # name -> (call on x and v, its value by central differences along each direction e_i / along v)
    "jacobian": (lambda x, v: torch.autograd.functional.jacobian(_G, x),
                 lambda x, v: torch.stack([_central(_G, x, e) for e in torch.eye(3, dtype=x.dtype)], 1)),
    "jacobian vectorized": (lambda x, v: torch.autograd.functional.jacobian(_G, x, vectorize=True),
                            lambda x, v: torch.stack([_central(_G, x, e) for e in torch.eye(3, dtype=x.dtype)], 1)),
    "hessian": (lambda x, v: torch.autograd.functional.hessian(_F, x),
                lambda x, v: torch.stack([_central(_plain_gradient, x, e) for e in torch.eye(3, dtype=x.dtype)], 1)),
    "vjp": (lambda x, v: torch.autograd.functional.vjp(_G, x, v)[1],
            lambda x, v: torch.stack([_central(_G, x, e) @ v for e in torch.eye(3, dtype=x.dtype)])),
    "jvp": (lambda x, v: torch.autograd.functional.jvp(_G, x, v)[1], lambda x, v: _central(_G, x, v)),
    "hvp": (lambda x, v: torch.autograd.functional.hvp(_F, x, v)[1], lambda x, v: _central(_plain_gradient, x, v)),
    "vhp": (lambda x, v: torch.autograd.functional.vhp(_F, x, v)[1], lambda x, v: _central(_plain_gradient, x, v)),
}


@pytest.mark.parametrize("name", list(FUNCTIONAL))
def test_torch_autograd_functional_runs_on_tracers_with_torchs_values(name):
    """torch.autograd.functional is written on torch.autograd.grad, which torchtrace answers on tracers: its results
    equal torch autograd's on plain tensors and central differences."""
    call, numeric = FUNCTIONAL[name]
    data, v = torch.randn(3, dtype=torch.float64), torch.randn(3, dtype=torch.float64)
    ours = call(tt.tracer(data, requires_grad=True), v)
    theirs = call(data.clone().requires_grad_(), v)
    torch.testing.assert_close(ours.as_subclass(torch.Tensor), theirs)
    torch.testing.assert_close(ours.as_subclass(torch.Tensor), numeric(data, v), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", ["jacobian", "hessian"])
def test_torch_autograd_functional_forward_mode_refuses_tracers_naming_torchtraces_own(name):
    fn = getattr(torch.autograd.functional, name)
    strategy = {"strategy": "forward-mode"} if name == "jacobian" else {"outer_jacobian_strategy": "forward-mode"}
    with pytest.raises(tt.UnsupportedOperationError, match=rf"^torch.autograd.functional.{name}: .* tt.jacobian"):
        fn(lambda t: t.sin().sum() if name == "hessian" else t.sin(), x(), vectorize=True, **strategy)
    with pytest.raises(tt.UnsupportedOperationError, match=rf"^torch.autograd.functional.{name}: .* tt.jacobian"):
        # the same strategy passed by position (func, inputs, create_graph, strict, vectorize, strategy)
        fn(lambda t: t.sin().sum() if name == "hessian" else t.sin(), x(), False, False, True, "forward-mode")
    plain = torch.randn(3, dtype=torch.float64)  # plain tensors: torch's own, untouched
    torch.testing.assert_close(torch.autograd.functional.jacobian(torch.sin, plain, vectorize=True,
                                                                  strategy="forward-mode"), torch.diag(plain.cos()))


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
