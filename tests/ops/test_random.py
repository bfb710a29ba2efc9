"""torch.normal / torch.bernoulli on tracers (torchtrace/ops/random.py): torch's samples, torch's zero gradients."""
import pytest
import torch

import torchtrace as tt

_gen = torch.Generator().manual_seed(0)
MEAN = torch.randn(3, 4, generator=_gen, dtype=torch.float64)
STD = torch.rand(3, 4, generator=_gen, dtype=torch.float64) + 0.1
P = torch.rand(3, 4, generator=_gen, dtype=torch.float64)

CALLS = {
    "tensor_tensor": (lambda m, s: torch.normal(m, s), (MEAN, STD)),
    "tensor_float": (lambda m: torch.normal(m, 2.0), (MEAN,)),
    "float_tensor": (lambda s: torch.normal(1.5, s), (STD,)),
    "keywords": (lambda m, s: torch.normal(mean=m, std=s), (MEAN, STD)),
    "broadcast": (lambda m, s: torch.normal(m, s[0]), (MEAN, STD)),
    "bernoulli": (lambda p: torch.bernoulli(p), (P,)),
    "bernoulli_method": (lambda p: p.bernoulli(), (P,)),
}


def _run(fn, inputs, make):
    leaves = [make(t) for t in inputs]
    torch.manual_seed(7)
    out = fn(*leaves)
    (out * out.detach().sin()).sum().backward()
    return out, [x.grad for x in leaves]


@pytest.mark.parametrize("name", list(CALLS))
def test_same_samples_and_gradients_as_torch(name):
    fn, inputs = CALLS[name]
    ours, our_grads = _run(fn, inputs, lambda t: tt.tracer(t.clone(), requires_grad=True))
    theirs, their_grads = _run(fn, inputs, lambda t: t.clone().requires_grad_())
    assert torch.equal(ours.detach(), theirs.detach())
    for a, b in zip(our_grads, their_grads):
        assert torch.equal(a, b) and not a.any()  # not reparameterised, as torch: zeros


def test_reparameterised_sample_has_the_pathwise_gradient():
    m, s = (tt.tracer(t.clone(), requires_grad=True) for t in (MEAN, STD))
    torch.manual_seed(3)
    eps = torch.randn_like(STD)
    (m + s * eps).sum().backward()
    assert torch.equal(m.grad, torch.ones_like(MEAN)) and torch.equal(s.grad, eps)


def test_bernoulli_with_a_fixed_p_uses_only_the_shape():  # torch: "derivative not implemented"; it is zero
    ours, (grad,) = _run(lambda p: torch.bernoulli(p, 0.3), (P,), lambda t: tt.tracer(t.clone(), requires_grad=True))
    torch.manual_seed(7)
    assert torch.equal(ours.detach(), torch.bernoulli(P, 0.3)) and not grad.any()


def test_poisson_has_torchs_samples_and_zero_gradient():
    fn = (lambda r: torch.poisson(r * 3)), (STD,)
    ours, our_grads = _run(*fn, lambda t: tt.tracer(t.clone(), requires_grad=True))
    theirs, their_grads = _run(*fn, lambda t: t.clone().requires_grad_())
    assert torch.equal(ours.detach(), theirs.detach()) and torch.equal(our_grads[0], their_grads[0])
    assert not our_grads[0].any()


# An op that draws random numbers, written in place into a tensor on the graph: torch draws once. The tensor must hold
# the very samples the graph recorded (a second draw would give it other values than the gradient was taken for, and
# move torch's generator on twice).
IN_PLACE = {
    "bernoulli_float": lambda h: h.bernoulli_(0.5),
    "bernoulli_tensor_p": lambda h: h.bernoulli_(torch.full_like(h, 0.3)),
    "uniform_": lambda h: h.uniform_(-2, 2),
    "normal_": lambda h: h.normal_(1.0, 3.0),
    "exponential_": lambda h: h.exponential_(),
    "random_": lambda h: h.random_(0, 10),
    "cauchy_": lambda h: h.cauchy_(),
    "log_normal_": lambda h: h.log_normal_(),
    "geometric_": lambda h: h.geometric_(0.5),
    "torch.dropout_": lambda h: torch.dropout_(h, 0.5, True),
    "torch.alpha_dropout_": lambda h: torch.alpha_dropout_(h, 0.5, True),
    "torch.feature_alpha_dropout_": lambda h: torch.feature_alpha_dropout_(h.reshape(2, 3, 1), 0.5, True),
    "torch.rrelu_": lambda h: torch.rrelu_(h, training=True),
    "uniform_ on a view": lambda h: h[1:4].uniform_(-2, 2),
    "bernoulli_ on a strided view": lambda h: h[::2].bernoulli_(0.3),
    "normal_ on a transpose": lambda h: h.reshape(2, 3).t().normal_(),
    "dropout_ on a view": lambda h: torch.dropout_(h[2:], 0.5, True),
}


def _in_place_run(fn, make):
    torch.manual_seed(0)
    x = make(torch.randn(6, dtype=torch.float64))
    h = x * 2
    fn(h)
    after = torch.rand(3)  # the generator's next numbers: equal only if each sampler drew exactly as torch's did
    (h * torch.arange(1.0, 7.0, dtype=torch.float64)).sum().backward()
    return h.detach().as_subclass(torch.Tensor), after, x.grad.as_subclass(torch.Tensor)


@pytest.mark.parametrize("name", list(IN_PLACE))
def test_random_op_in_place_draws_once_as_torch(name):
    ours = _in_place_run(IN_PLACE[name], lambda t: tt.tracer(t, requires_grad=True))
    theirs = _in_place_run(IN_PLACE[name], lambda t: t.requires_grad_())
    assert torch.equal(ours[0], theirs[0]) and torch.equal(ours[1], theirs[1])
    torch.testing.assert_close(ours[2], theirs[2], rtol=0, atol=0)


def test_random_fill_of_a_leaf_that_requires_grad_is_refused_as_torch():
    for x in (torch.zeros(3, requires_grad=True), tt.tracer(torch.zeros(3), requires_grad=True)):
        with pytest.raises(RuntimeError, match="leaf"):
            x.uniform_()


def _laplace_sample_loss(loc, scale):
    torch.manual_seed(5)  # the same uniform draw on every call: a deterministic function of loc and scale
    return (torch.distributions.Laplace(loc, scale).rsample((4,)) ** 2).sum()


def test_distributions_sampling_through_tensor_new_as_torch_and_finite_differences():
    """Laplace / Cauchy / Exponential rsample draw into loc.new(shape): a constructor, no gradient of its own."""
    loc, scale = MEAN[0].clone(), STD[0].clone()
    ours = [tt.tracer(t.clone(), requires_grad=True) for t in (loc, scale)]
    theirs = [t.clone().requires_grad_() for t in (loc, scale)]
    _laplace_sample_loss(*ours).backward()
    _laplace_sample_loss(*theirs).backward()
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a.grad.as_subclass(torch.Tensor), b.grad)
    for i, t in enumerate((loc, scale)):  # central differences, element by element
        for j in range(t.numel()):
            step = torch.zeros_like(t).view(-1)
            step[j] = 1e-6
            args_up = [u + step.view_as(u) if k == i else u for k, u in enumerate((loc, scale))]
            args_down = [u - step.view_as(u) if k == i else u for k, u in enumerate((loc, scale))]
            numeric = (_laplace_sample_loss(*args_up) - _laplace_sample_loss(*args_down)) / 2e-6
            assert abs(numeric.item() - ours[i].grad.view(-1)[j].item()) < 1e-5
    for make in (lambda r: torch.distributions.Exponential(r).rsample((3,)),
                 lambda m: torch.distributions.Cauchy(m, 1.0).rsample((3,))):
        results = []
        for leaf in (tt.tracer(STD[0].clone(), requires_grad=True), STD[0].clone().requires_grad_()):
            torch.manual_seed(2)
            make(leaf).sum().backward()
            results.append(leaf.grad.as_subclass(torch.Tensor))
        torch.testing.assert_close(*results)


NON_DIFFERENTIABLE_CALLS = {  # torch's results carry no gradient here; the calls must run, as in torch
    "Tensor.new": lambda x: x.new(3).fill_(1.0),
    "Tensor.new(list)": lambda x: x.new([1.0, 2.0]),
    "Tensor.new_empty_strided": lambda x: x.new_empty_strided((2, 2), (2, 1)).fill_(0.0),
    "histc": lambda x: torch.histc(x, 4),
    "linspace": lambda x: torch.linspace(x[0], x[1], 5),
    "logspace": lambda x: torch.logspace(x[0], x[1], 5),
}


@pytest.mark.parametrize("name", list(NON_DIFFERENTIABLE_CALLS))
def test_calls_whose_results_carry_no_gradient_run_as_torch(name):
    fn = NON_DIFFERENTIABLE_CALLS[name]
    x = tt.tracer(MEAN[0].clone(), requires_grad=True)
    reference = MEAN[0].clone().requires_grad_()
    ours, theirs = fn(x), fn(reference)
    assert not theirs.requires_grad and not ours.requires_grad
    assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
    if name in ("histc", "linspace", "logspace"):
        assert torch.equal(ours.as_subclass(torch.Tensor), theirs)
    (ours.sum() + x.sum()).backward()
    assert torch.equal(x.grad, torch.ones_like(MEAN[0]))


def test_a_gamma_sample_has_torchs_implicit_reparameterisation_gradient():
    """Gamma(a, rate).rsample() samples with torch._standard_gamma, whose derivative keeps the sample's quantile
    u = F(y; a) fixed: dy/da = -(dF/da) / (dF/dy) with F the regularised lower incomplete gamma function P(a, y) and
    dF/dy the density. Same samples and gradients as torch; the gradient also against that formula, dF/da by central
    differences of torch.special.gammainc."""
    alpha0 = torch.tensor([0.7, 1.5, 4.0], dtype=torch.float64)
    rate0 = torch.tensor([1.0, 2.0, 0.5], dtype=torch.float64)
    results = []
    for make in (lambda t: tt.tracer(t.clone(), requires_grad=True), lambda t: t.clone().requires_grad_()):
        alpha, rate = make(alpha0), make(rate0)
        torch.manual_seed(11)
        y = torch.distributions.Gamma(alpha, rate).rsample()
        y.sum().backward()
        results.append((y.detach().as_subclass(torch.Tensor), alpha.grad.as_subclass(torch.Tensor),
                        rate.grad.as_subclass(torch.Tensor)))
    for ours, theirs in zip(*results):
        torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=0)
    z = results[0][0] * rate0  # the standard Gamma(a, 1) sample behind y = z / rate
    h = 1e-6
    dF_da = (torch.special.gammainc(alpha0 + h, z) - torch.special.gammainc(alpha0 - h, z)) / (2 * h)
    density = torch.exp((alpha0 - 1) * z.log() - z - torch.lgamma(alpha0))
    # (torch._standard_gamma_grad evaluates it by series and asymptotic approximations: 4.5e-5 apart here at most)
    torch.testing.assert_close(results[0][1], -dF_da / density / rate0, rtol=2e-4, atol=0)
    chi = tt.tracer(torch.tensor([3.0], dtype=torch.float64), requires_grad=True)  # Chi2 samples through it too
    torch.distributions.Chi2(chi).rsample().sum().backward()
    assert chi.grad is not None and torch.isfinite(chi.grad).all()
