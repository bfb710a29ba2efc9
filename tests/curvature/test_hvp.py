"""tt.hvp equals torch.func's HVP (jvp of grad) and central differences of torch autograd's gradient, in both
methods, on an MLP, a CNN with BatchNorm in eval mode and a ported transformer; tt.hessian equals
torch.func.hessian."""
import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import torchtrace as tt
from curvature.models import cnn_with_batchnorm_eval, data, functional_loss, mlp, transformer, twins

MODELS = {"mlp": mlp, "cnn": cnn_with_batchnorm_eval, "transformer": transformer}
METHODS = ["forward-over-reverse", "reverse-over-reverse"]


def random_like(values, seed=3):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(v.shape, generator=g, dtype=v.dtype) for v in values)


def torch_func_hvp(f, values, v):
    """torch.func.jvp(torch.func.grad(f)); attention in its math form (the fused CPU kernel has no forward AD)."""
    with sdpa_kernel(SDPBackend.MATH):
        return torch.func.jvp(torch.func.grad(f, argnums=tuple(range(len(values)))), values, v)[1]


def central_difference_hvp(f, values, v, eps=1e-5):
    """(∇f(θ + εv) − ∇f(θ − εv)) / 2ε, the gradients by torch autograd."""
    def gradient(sign):
        leaves = [(x + sign * eps * d).requires_grad_() for x, d in zip(values, v)]
        return torch.autograd.grad(f(*leaves), leaves)
    return tuple((a - b) / (2 * eps) for a, b in zip(gradient(1), gradient(-1)))


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("name", list(MODELS))
def test_hvp_equals_torch_func_and_finite_differences(name, method):
    plain, ported = twins(MODELS[name])
    batch = data(name)
    v = random_like(functional_loss(plain, batch)[1])
    f_plain, values = functional_loss(plain, batch)
    expected = torch_func_hvp(f_plain, values, v)
    f_ported, _ = functional_loss(ported, batch)
    got = tt.hvp(f_ported, values, v, method=method)
    assert all(type(h) is torch.Tensor for h in got)
    for h, e in zip(got, expected):
        torch.testing.assert_close(h, e, rtol=0, atol=1e-10)
    for h, e in zip(got, central_difference_hvp(f_plain, values, v)):
        torch.testing.assert_close(h, e, rtol=1e-6, atol=1e-6)


def test_hvp_of_one_tensor_keeps_its_structure_and_a_linear_function_has_none():
    x = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    v = torch.tensor([0.3, 0.1, -1.0], dtype=torch.float64)
    f = lambda z: (z ** 3).sum() + z[0] * z[1]  # noqa: E731
    expected = torch.func.jvp(torch.func.grad(f), (x,), (v,))[1]
    for method in METHODS:
        torch.testing.assert_close(tt.hvp(f, x, v, method=method), expected, rtol=0, atol=1e-12)
        assert torch.equal(tt.hvp(lambda z: (2 * z).sum(), x, v, method=method), torch.zeros(3, dtype=x.dtype))


def test_hvp_refuses_what_it_cannot_do():
    x = torch.ones(3, dtype=torch.float64)
    with pytest.raises(ValueError, match="method must be one of"):
        tt.hvp(lambda z: z.sum(), x, x, method="forward")
    with pytest.raises(ValueError, match="scalar function"):
        tt.hvp(lambda z: z * 2, x, x)
    with pytest.raises(ValueError, match="shape"):
        tt.hvp(lambda z: z.sum(), x, torch.ones(2, dtype=torch.float64))


@pytest.mark.parametrize("method", METHODS)
def test_hessian_equals_torch_func_hessian(method):
    f = lambda a, b: (a.sin() * b[:2]).sum() * b.pow(2).sum()  # noqa: E731
    a = torch.tensor([0.4, -1.2], dtype=torch.float64)
    b = torch.tensor([1.5, 0.3, -0.7], dtype=torch.float64)
    got = tt.hessian(f, (a, b), method=method)
    expected = torch.func.hessian(f, argnums=(0, 1))(a, b)
    for i in range(2):
        for j in range(2):
            torch.testing.assert_close(got[i][j], expected[i][j], rtol=0, atol=1e-12)
    single = tt.hessian(lambda z: (z ** 4).sum() * z[0], a, method=method)
    torch.testing.assert_close(single, torch.func.hessian(lambda z: (z ** 4).sum() * z[0])(a), rtol=0, atol=1e-12)


def test_the_report_shows_each_method_in_the_player():
    f = lambda a, b: (torch.tanh(a) * b).sum() ** 2  # noqa: E731
    a, b = torch.tensor([0.5, -1.0], dtype=torch.float64), torch.tensor([2.0, 0.25], dtype=torch.float64)
    v = (torch.tensor([1.0, 0.0], dtype=torch.float64), torch.tensor([0.0, 1.0], dtype=torch.float64))
    hv, report = tt.hvp(f, (a, b), v, report=True)
    forward = report.explore()
    assert forward.steps and any(finding.kind == "tangent" for finding in forward.findings)
    hv2, report2 = tt.hvp(f, (a, b), v, method="reverse-over-reverse", report=True)
    second = report2.explore()
    assert len(second.steps) > len(forward.steps)  # the second backward walks the first backward's ops too
    for h, h2 in zip(hv, hv2):
        torch.testing.assert_close(h, h2, rtol=0, atol=1e-12)
