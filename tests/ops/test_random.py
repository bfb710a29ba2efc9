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
