"""Gradient rules of torchtrace/ops/linalg_decompositions.py: cholesky, qr, eigh, svd, pinv, lstsq.

Inputs that must be symmetric are made symmetric inside the checked function, so finite differences stay valid;
losses of singular / eigen vectors are sign-invariant (products such as U diag(S) V^T, or U * U), as the
vectors themselves are defined only up to sign.
"""
import pytest
import torch
from helpers import check_op, double_backward_matches, float_tolerances, non_contiguous
from linalg_cases import DTYPES, loose_tolerances, rand, spd

import torchtrace as tt
from torchtrace.errors import UnsupportedOperationError

T = torch.Tensor
linalg = torch.linalg


def sym(x):
    return x + x.mT


# ---------------------------------------------------------------------------------------------------- Cholesky

CHOLESKY = [
    ("lower", lambda x: linalg.cholesky(spd(x)), (3, 3)),
    ("upper", lambda x: linalg.cholesky(spd(x), upper=True), (2, 3, 3)),
    ("torch.cholesky", lambda x: torch.cholesky(spd(x)), (2, 3, 3)),
    ("Tensor.cholesky upper", lambda x: spd(x).cholesky(upper=True), (3, 3)),
    ("cholesky_ex", lambda x: linalg.cholesky_ex(spd(x)).L, (2, 2, 3, 3)),
    ("cholesky_ex upper", lambda x: linalg.cholesky_ex(spd(x), upper=True)[0], (4, 4)),
    ("1x1", lambda x: linalg.cholesky(spd(x)), (1, 1)),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fn, shape", [c[1:] for c in CHOLESKY], ids=[c[0] for c in CHOLESKY])
def test_cholesky(fn, shape, dtype):
    check_op(fn, rand(*shape, dtype=dtype), **float_tolerances(dtype))


def test_cholesky_of_a_raw_matrix_matches_torch():
    """Only the lower triangle is read; torch returns a symmetric gradient, and so do we."""
    check_op(linalg.cholesky, non_contiguous(spd(rand(3, 3))), gradcheck=False)


def test_cholesky_double_backward():
    double_backward_matches(lambda x: linalg.cholesky(spd(x)), rand(3, 3))


# ----------------------------------------------------------------------------------------------------------- QR

QR = [
    ("square", lambda a: linalg.qr(a), (3, 3)),
    ("tall", lambda a: linalg.qr(a), (2, 5, 3)),
    ("wide", lambda a: linalg.qr(a), (3, 5)),
    ("wide batched", lambda a: linalg.qr(a), (2, 2, 4)),
    ("complete square", lambda a: linalg.qr(a, mode="complete"), (3, 3)),
    ("complete wide", lambda a: linalg.qr(a, "complete"), (2, 3, 4)),
    ("only R", lambda a: linalg.qr(a).R, (4, 3)),
    ("only Q", lambda a: linalg.qr(a).Q, (4, 3)),
    ("torch.qr", lambda a: torch.qr(a), (4, 3)),
    ("Tensor.qr some=False wide", lambda a: a.qr(some=False), (2, 3)),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fn, shape", [c[1:] for c in QR], ids=[c[0] for c in QR])
def test_qr(fn, shape, dtype):
    check_op(fn, rand(*shape, dtype=dtype), **float_tolerances(dtype))


def test_qr_double_backward():
    double_backward_matches(lambda a: linalg.qr(a).Q, rand(4, 3))


@pytest.mark.parametrize("fn, match", [
    (lambda a: linalg.qr(a, mode="r").R, "mode='r'"),
    (lambda a: linalg.qr(a, mode="complete").Q, "mode='complete' and nrows > ncols"),
    (lambda a: torch.qr(a, some=False).R, "torch.qr: .*mode='complete'"),
], ids=["mode r", "complete tall", "torch.qr complete tall"])
def test_qr_refusals_follow_torch(fn, match):
    a = tt.tracer(rand(4, 3), requires_grad=True)
    with pytest.raises(UnsupportedOperationError, match=match):
        fn(a).sum().backward()
    ref = rand(4, 3).requires_grad_()
    with pytest.raises(RuntimeError):  # torch refuses the same derivatives
        fn(ref).sum().backward()


# ---------------------------------------------------------------------------------------------------------- eigh

EIGH = [
    ("eigenvalues", lambda x: linalg.eigh(sym(x)).eigenvalues, (3, 3)),
    ("eigenvectors (sign-invariant)", lambda x: linalg.eigh(sym(x)).eigenvectors ** 2, (2, 3, 3)),
    ("both", lambda x: (lambda w, v: (w, v * v[..., :1, :]))(*linalg.eigh(sym(x))), (2, 4, 4)),
    ("reconstruction", lambda x: (lambda w, v: (v * w.exp().unsqueeze(-2)) @ v.mT)(*linalg.eigh(sym(x))), (3, 3)),
    ("UPLO=U", lambda x: linalg.eigh(sym(x), UPLO="U").eigenvectors.abs(), (3, 3)),
    ("eigvalsh", lambda x: linalg.eigvalsh(sym(x)), (2, 3, 3)),
    ("eigvalsh UPLO=U", lambda x: linalg.eigvalsh(sym(x), "U"), (4, 4)),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fn, shape", [c[1:] for c in EIGH], ids=[c[0] for c in EIGH])
def test_eigh(fn, shape, dtype):
    check_op(fn, rand(*shape, dtype=dtype), **float_tolerances(dtype))


def test_eigh_raw_matrix_matches_torch():
    """Only one triangle is read, yet torch's gradient is the full symmetric matrix; so is ours."""
    a = rand(3, 3)
    check_op(lambda a: linalg.eigh(a).eigenvalues, a, gradcheck=False)
    check_op(lambda a: linalg.eigvalsh(a, UPLO="U"), a, gradcheck=False)


def test_eigh_repeated_eigenvalues_follow_torch():
    """Eigenvalues alone: finite gradient. Eigenvectors of a repeated eigenvalue: inf/NaN, as torch."""
    a = torch.eye(3, dtype=torch.float64)
    x = tt.tracer(a, requires_grad=True)
    linalg.eigh(x).eigenvalues.sum().backward()
    torch.testing.assert_close(x.grad, torch.eye(3, dtype=torch.float64))
    x = tt.tracer(a, requires_grad=True)
    (linalg.eigh(x).eigenvectors ** 2).sum().backward()
    ref = a.clone().requires_grad_()
    (linalg.eigh(ref).eigenvectors ** 2).sum().backward()
    assert not x.grad.isfinite().all() and not ref.grad.isfinite().all()
    torch.testing.assert_close(x.grad.isfinite(), ref.grad.isfinite())


def test_eigh_double_backward():
    double_backward_matches(lambda x: linalg.eigh(sym(x)).eigenvectors ** 2, rand(3, 3))
    double_backward_matches(lambda x: linalg.eigvalsh(sym(x)) ** 2, rand(3, 3))


# ----------------------------------------------------------------------------------------------------------- SVD

def usv(out):
    """A sign-invariant function of all three factors."""
    u, s, vh = out
    k = s.shape[-1]
    return (u[..., :, :k] * s.unsqueeze(-2).exp()) @ vh[..., :k, :], s, u[..., :, :k] ** 2


SVD = [
    ("square", lambda a: usv(linalg.svd(a)), (3, 3)),
    ("tall reduced", lambda a: usv(linalg.svd(a, full_matrices=False)), (2, 5, 3)),
    ("wide reduced", lambda a: usv(linalg.svd(a, False)), (3, 5)),
    ("tall full_matrices", lambda a: usv(linalg.svd(a)), (5, 3)),
    ("wide full_matrices", lambda a: usv(linalg.svd(a, full_matrices=True)), (2, 3, 4)),
    ("only S", lambda a: linalg.svd(a).S, (4, 3)),
    ("only Vh (sign-invariant)", lambda a: linalg.svd(a, full_matrices=False).Vh ** 2, (3, 4)),
    ("svdvals", linalg.svdvals, (2, 4, 3)),
    ("svdvals wide", linalg.svdvals, (3, 5)),
    ("torch.svd", lambda a: (lambda u, s, v: ((u * s.exp().unsqueeze(-2)) @ v.mT, s))(*torch.svd(a)), (4, 3)),
    ("Tensor.svd some=False", lambda a: (lambda u, s, v: (u[..., :3] * s.exp().unsqueeze(-2)) @ v.mT)(
        *a.svd(some=False)), (4, 3)),
    ("torch.svd compute_uv=False", lambda a: torch.svd(a, compute_uv=False).S, (2, 3, 4)),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fn, shape", [c[1:] for c in SVD], ids=[c[0] for c in SVD])
def test_svd(fn, shape, dtype):
    check_op(fn, rand(*shape, dtype=dtype), **loose_tolerances(dtype))


def test_svd_repeated_singular_values_follow_torch():
    a = torch.eye(3, dtype=torch.float64)
    for singular_values in (linalg.svdvals, lambda x: linalg.svd(x).S, lambda x: torch.svd(x).S):
        x = tt.tracer(a, requires_grad=True)
        singular_values(x).sum().backward()  # U and V unused: no division by s_j^2 - s_i^2 = 0
        torch.testing.assert_close(x.grad, torch.eye(3, dtype=torch.float64))
    x = tt.tracer(a, requires_grad=True)
    (linalg.svd(x).U ** 2).sum().backward()
    ref = a.clone().requires_grad_()
    (linalg.svd(ref).U ** 2).sum().backward()
    torch.testing.assert_close(x.grad.isfinite(), ref.grad.isfinite())


def test_svd_double_backward():
    double_backward_matches(lambda a: linalg.svd(a, full_matrices=False).U ** 2, rand(4, 3))
    double_backward_matches(lambda a: linalg.svdvals(a) ** 2, rand(3, 4))
    double_backward_matches(lambda a: (lambda u, s, v: (u * s.exp().unsqueeze(-2)) @ v.mT)(*torch.svd(a)), rand(4, 3))
    double_backward_matches(lambda a: torch.svd(a, compute_uv=False).S ** 2, rand(4, 3))


# -------------------------------------------------------------------------------------------------- pinv, lstsq

PINV = [
    ("square", lambda a: linalg.pinv(a), (3, 3)),
    ("tall", lambda a: linalg.pinv(a), (2, 5, 3)),
    ("wide", lambda a: linalg.pinv(a), (3, 5)),
    ("hermitian", lambda a: linalg.pinv(sym(a), hermitian=True), (2, 3, 3)),
    ("atol/rtol", lambda a: linalg.pinv(a, atol=1e-8, rtol=1e-6), (4, 3)),
    ("rcond (positional)", lambda a: linalg.pinv(a, 1e-10), (3, 4)),
    ("rcond hermitian (positional)", lambda a: linalg.pinv(sym(a), 1e-10, True), (3, 3)),
    ("tensor tolerances", lambda a: linalg.pinv(a, atol=torch.tensor(1e-9), rtol=torch.tensor([1e-7, 1e-6])),
     (2, 3, 4)),
    ("torch.pinverse", torch.pinverse, (4, 3)),
    ("Tensor.pinverse rcond", lambda a: a.pinverse(rcond=1e-12), (3, 4)),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fn, shape", [c[1:] for c in PINV], ids=[c[0] for c in PINV])
def test_pinv(fn, shape, dtype):
    check_op(fn, rand(*shape, dtype=dtype), **loose_tolerances(dtype))


def test_pinv_tolerance_tensors_that_require_grad_get_none():
    """torch gives no gradient to atol / rtol (the rank they select is piecewise constant); neither do we."""
    a, rtol = tt.tracer(rand(3, 4), requires_grad=True), tt.tracer(torch.tensor(1e-6), requires_grad=True)
    linalg.pinv(a, rtol=rtol).sum().backward()
    assert a.grad is not None and rtol.grad is None


def test_pinv_of_rank_deficient_matrix():
    """A cut rank: the formula holds on the manifold of fixed rank (torch's convention; no finite differences)."""
    a = rand(4, 2) @ rand(2, 3)
    check_op(lambda a: linalg.pinv(a, rtol=1e-8), a, gradcheck=False)


def test_pinv_double_backward():
    double_backward_matches(linalg.pinv, rand(4, 3))


LSTSQ = [
    ("square", (3, 3), (3, 2)),
    ("tall", (5, 3), (5, 2)),
    ("batched", (2, 5, 3), (2, 5, 2)),
    ("vector rhs", (5, 3), (5,)),
]


@pytest.mark.parametrize("shapes", [c[1:] for c in LSTSQ], ids=[c[0] for c in LSTSQ])
def test_lstsq_solution(shapes):
    a, b = rand(*shapes[0]), rand(*shapes[1])
    check_op(lambda a, b: linalg.lstsq(a, b).solution, a, b)
    check_op(lambda a, b: linalg.lstsq(a, b, driver="gelsd")[0], a, b)


@pytest.mark.parametrize("driver", ["gels", "gelsd", "gelss"])
@pytest.mark.parametrize("shapes", [c[1:] for c in LSTSQ[1:]], ids=[c[0] for c in LSTSQ[1:]])
def test_lstsq_residuals(shapes, driver):
    a, b = rand(*shapes[0]), rand(*shapes[1])
    check_op(lambda a, b: linalg.lstsq(a, b, driver=driver).residuals, a, b)
    check_op(lambda a, b: sum(out.sum() for out in linalg.lstsq(a, b, driver=driver)[:2]), a, b)  # both at once


def test_lstsq_residuals_double_backward():
    double_backward_matches(lambda a, b: linalg.lstsq(a, b, driver="gelsd").residuals, rand(5, 3), rand(5, 2))


def test_lstsq_rank_and_singular_values_are_constants_as_torch():
    """torch marks them non-differentiable (requires_grad False: constants in a loss); torchtrace refused a loss that
    used them. The gradient of a loss using them equals torch's (which finite differences cannot check: they see the
    singular values move)."""
    a, b = tt.tracer(rand(5, 3), requires_grad=True), tt.tracer(rand(5, 2), requires_grad=True)
    out = linalg.lstsq(a, b, driver="gelsd")
    assert not out.singular_values.requires_grad and not out.rank.requires_grad and out.solution.requires_grad
    assert tt.check(lambda a, b: (lambda r: r.solution.sum() + r.singular_values.sum())(
        linalg.lstsq(a, b, driver="gelsd")), rand(5, 3), rand(5, 2)).ok


def test_lstsq_double_backward():
    double_backward_matches(lambda a, b: linalg.lstsq(a, b).solution, rand(5, 3), rand(5, 2))


# -------------------------------------------------------------------------------------------------------- errors

@pytest.mark.parametrize("fn", [linalg.cholesky, linalg.eigh, linalg.svd, linalg.pinv, linalg.qr],
                         ids=["cholesky", "eigh", "svd", "pinv", "qr"])
def test_complex_inputs_are_refused(fn):
    a = tt.tracer(torch.randn(2, 2, dtype=torch.complex128), requires_grad=True)
    with pytest.raises(UnsupportedOperationError, match="complex inputs are not supported"):
        fn(a)
