"""Identities on real tensors (torchtrace/ops/identities.py): conj, resolve_*, real, angle, fftshift."""
import pytest
import torch
from helpers import check_op, double_backward_matches, non_contiguous

import torchtrace as tt

_gen = torch.Generator().manual_seed(0)
X = torch.randn(3, 4, generator=_gen, dtype=torch.float64)
EDGES = torch.tensor([-2.0, -0.0, 0.0, 1.5, float("inf"), -float("inf")], dtype=torch.float64)

IDENTITIES = [torch.conj, torch.Tensor.conj, torch.conj_physical, torch.Tensor.conj_physical, torch.resolve_conj,
              torch.Tensor.resolve_conj, torch.resolve_neg, torch.Tensor.resolve_neg, torch.real]


@pytest.mark.parametrize("op", IDENTITIES, ids=lambda f: f.__qualname__)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_identity_rules(op, dtype):
    x = X.to(dtype)
    check_op(lambda t: op(t) * t, x)  # the input used twice
    check_op(lambda t: op(t).exp(), non_contiguous(x))
    check_op(lambda t: op(t) * 3, torch.tensor(0.5, dtype=dtype))  # 0-d


@pytest.mark.parametrize("op", [torch.angle, torch.Tensor.angle])
def test_angle_is_constant_on_real_tensors(op):
    check_op(lambda t: op(t) * t, X)
    x = tt.tracer(EDGES.clone(), requires_grad=True)
    torch_x = EDGES.clone().requires_grad_()
    op(torch_x).sum().backward()
    op(x).sum().backward()
    assert torch.equal(x.grad, torch_x.grad)
    assert torch.equal(op(x).detach(), op(EDGES))


@pytest.mark.parametrize("op", [torch.fft.fftshift, torch.fft.ifftshift])
@pytest.mark.parametrize("dim", [None, 0, 1, (0, 1), (-1,)])
@pytest.mark.parametrize("shape", [(5, 4), (3, 7), (1, 1)])
def test_fftshift_rolls(op, dim, shape):
    x = torch.randn(*shape, generator=_gen, dtype=torch.float64)
    weights = torch.randn(*shape, generator=_gen, dtype=torch.float64)
    check_op(lambda t: op(t, dim=dim) * weights, x)
    check_op(lambda t: op(t, dim) * weights, non_contiguous(x))


def test_double_backward_through_identities():
    double_backward_matches(lambda t: torch.conj(t) ** 3 + torch.fft.fftshift(t) ** 2, X)


@pytest.mark.parametrize("op", [torch.conj, torch.real, torch.angle, torch.resolve_neg, torch.fft.fftshift])
def test_complex_refused(op):
    z = tt.tracer(torch.randn(3, dtype=torch.complex64), requires_grad=True)
    with pytest.raises(tt.UnsupportedOperationError, match="complex tensors are not supported — torchtrace"):
        op(z)
