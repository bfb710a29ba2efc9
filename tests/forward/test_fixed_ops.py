"""The ops whose forward mode was wrong when it was built from reverse mode: tt.jacobian in both modes equals
torch.func.jacfwd / jacrev, and finite differences where the function is smooth (float64)."""
import pytest
import torch
import torch.nn.functional as F

import torchtrace as tt


def finite_jacobian(f, x, eps=1e-6):
    """Central differences: column k is (f(x + eps e_k) - f(x - eps e_k)) / 2 eps."""
    flat = x.reshape(-1)
    columns = []
    for k in range(flat.numel()):
        step = torch.zeros_like(flat)
        step[k] = eps
        columns.append(((f((flat + step).view(x.shape)) - f((flat - step).view(x.shape))) / (2 * eps)).reshape(-1))
    return torch.stack(columns, -1).view(*f(x).shape, *x.shape)


def assert_jacobians(f, x, smooth=True):
    forward, reverse = tt.jacobian(f, x, mode="forward"), tt.jacobian(f, x, mode="reverse")
    torch.testing.assert_close(forward, torch.func.jacfwd(f)(x))
    torch.testing.assert_close(reverse, torch.func.jacrev(f)(x))
    if smooth:
        torch.testing.assert_close(forward, finite_jacobian(f, x), rtol=1e-5, atol=1e-6)


def test_logcumsumexp_tangent_is_finite_and_right():
    torch.manual_seed(0)
    x = torch.randn(3, 5, dtype=torch.float64)
    x[0, 2] = -40.0  # a tangent far below the running maximum must not underflow into 0 / 0
    f = lambda t: torch.logcumsumexp(t, 1)  # noqa: E731
    assert torch.isfinite(tt.jvp(f, (x,), (torch.ones_like(x),))[1]).all()
    assert_jacobians(f, x)


def test_eigh_eigenvectors_and_eigenvalues():
    torch.manual_seed(1)
    a = torch.randn(4, 4, dtype=torch.float64)
    vectors = lambda t: torch.linalg.eigh(t + t.mT).eigenvectors  # noqa: E731
    values = lambda t: torch.linalg.eigh(t + t.mT).eigenvalues  # noqa: E731
    assert tt.jacobian(vectors, a, mode="forward").abs().max() > 0.1
    assert_jacobians(values, a)
    # eigenvectors are defined up to sign: compare the Jacobians with torch, and finite differences of a
    # sign-fixed version (each vector's largest entry positive, as the sign is locally constant)
    assert_jacobians(vectors, a, smooth=False)
    signs = torch.sign(vectors(a).gather(0, vectors(a).abs().argmax(0, keepdim=True)))
    torch.testing.assert_close(tt.jacobian(lambda t: vectors(t) * signs, a, mode="forward"),
                               finite_jacobian(lambda t: vectors(t) * signs, a), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("output", [0, 1])
def test_lstsq_gels_solution_and_residuals(output):
    torch.manual_seed(2)
    a, b = torch.randn(5, 3, dtype=torch.float64), torch.randn(5, 2, dtype=torch.float64)
    for which, x in ((0, a), (1, b)):
        def f(t):
            args = (t, b) if which == 0 else (a, t)
            return torch.linalg.lstsq(*args, driver="gels")[output]

        assert_jacobians(f, x)
    residuals_jacobian = tt.jacobian(lambda t: torch.linalg.lstsq(t, b, driver="gels")[1], a, mode="forward")
    assert residuals_jacobian.abs().max() > 0.1  # was all zeros


@pytest.mark.parametrize("unpool, shape, indices, kernel", [
    (F.max_unpool1d, (1, 2, 4), [[[0, 0, 3, 3], [1, 1, 2, 5]]], 2),
    (F.max_unpool2d, (1, 1, 2, 2), [[[[0, 0], [5, 5]]]], 2),
    (F.max_unpool3d, (1, 1, 2, 1, 1), [[[[[0]], [[0]]]]], 1),
])
def test_max_unpool_with_overlapping_indices(unpool, shape, indices, kernel):
    torch.manual_seed(3)
    x = torch.randn(shape, dtype=torch.float64)
    index = torch.tensor(indices)
    f = lambda t: unpool(t, index, kernel)  # noqa: E731
    forward = tt.jacobian(f, x, mode="forward")
    torch.testing.assert_close(forward, torch.func.jacfwd(f)(x))
    torch.testing.assert_close(tt.jacobian(f, x, mode="reverse"), torch.func.jacrev(f)(x))
    torch.testing.assert_close(forward, finite_jacobian(f, x), rtol=1e-5, atol=1e-6)
