"""Gradient rules of torchtrace/ops/linalg_inverse.py: inv, det family, solves, the LU family, cholesky_solve."""
import pytest
import torch
from helpers import check_op, double_backward_matches, float_tolerances, non_contiguous
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from linalg_cases import DTYPES, rand, spd, well_conditioned

import torchtrace as tt
from torchtrace.errors import UnsupportedOperationError

T = torch.Tensor
linalg = torch.linalg


def lower(x, unit=False):
    """A well-conditioned lower-triangular matrix made from x inside the checked function."""
    n = x.shape[-1]
    mask = torch.ones(n, n, dtype=x.dtype).tril(-1 if unit else 0)
    return x * mask + (1 if unit else n) * torch.eye(n, dtype=x.dtype)


def upper(x, unit=False):
    return lower(x.mT, unit).mT


# -------------------------------------------------------------------------------------- inverse and determinants

SQUARE = [
    ("inv", linalg.inv, [(3, 3)]),
    ("inv batched", linalg.inv, [(2, 3, 3)]),
    ("inv 2 batch dims", linalg.inv, [(2, 1, 2, 2)]),
    ("torch.inverse", torch.inverse, [(3, 3)]),
    ("Tensor.inverse", T.inverse, [(2, 3, 3)]),
    ("inv_ex", lambda a: linalg.inv_ex(a).inverse, [(2, 3, 3)]),
    ("inv_ex check_errors", lambda a: linalg.inv_ex(a, check_errors=True)[0], [(3, 3)]),
    ("det", linalg.det, [(3, 3)]),
    ("det batched", linalg.det, [(2, 4, 4)]),
    ("torch.det", torch.det, [(2, 2)]),
    ("Tensor.det", T.det, [(2, 3, 3)]),
    ("det 1x1", linalg.det, [(1, 1)]),
    ("slogdet logabsdet", lambda a: linalg.slogdet(a).logabsdet, [(2, 3, 3)]),
    ("slogdet both", lambda a: linalg.slogdet(a), [(3, 3)]),
    ("torch.slogdet", lambda a: torch.slogdet(a)[1], [(3, 3)]),
    ("Tensor.slogdet", lambda a: a.slogdet()[1], [(2, 3, 3)]),
    ("logdet", torch.logdet, [(2, 3, 3)]),
    ("Tensor.logdet", T.logdet, [(3, 3)]),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fn, shapes", [c[1:] for c in SQUARE], ids=[c[0] for c in SQUARE])
def test_inverse_and_determinants(fn, shapes, dtype):
    check_op(fn, *(well_conditioned(*s, dtype=dtype) for s in shapes), **float_tolerances(dtype))


def test_inverse_non_contiguous_and_used_twice():
    a = non_contiguous(well_conditioned(3, 3))
    check_op(lambda a: linalg.inv(a) @ a + linalg.det(a) * a, a)


def test_det_of_negative_and_singular_matrices():
    """det's gradient is the cofactor matrix, also where det A = 0 (torch's create_graph formula, via the SVD)."""
    check_op(linalg.det, -well_conditioned(3, 3))
    singular = torch.tensor([[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [1.0, 1.0, 1.0]], dtype=torch.float64)
    x = tt.tracer(singular, requires_grad=True)
    linalg.det(x).backward()
    ours = x.grad
    ref = singular.clone().requires_grad_()
    (theirs,) = torch.autograd.grad(linalg.det(ref), ref, create_graph=True)
    torch.testing.assert_close(ours, theirs.detach())
    assert tt.gradcheck(linalg.det, singular)
    batch = torch.stack([singular, well_conditioned(3, 3)])  # one singular, one regular matrix
    assert tt.gradcheck(linalg.det, batch)


def test_logdet_of_negative_determinant_is_nan_with_zero_gradient():
    a = torch.tensor([[0.0, 1.0], [1.0, 0.0]], dtype=torch.float64)
    check_op(torch.logdet, a, gradcheck=False)
    x = tt.tracer(a, requires_grad=True)
    torch.logdet(x).backward()
    assert torch.equal(x.grad, torch.zeros(2, 2, dtype=torch.float64))


def test_slogdet_of_singular_matrix_gives_inf_as_torch():
    a = torch.tensor([[1.0, 2.0], [2.0, 4.0]], dtype=torch.float64)
    check_op(lambda a: linalg.slogdet(a).logabsdet, a, gradcheck=False)


@pytest.mark.parametrize("fn", [linalg.inv, linalg.det, lambda a: linalg.slogdet(a)[1], torch.logdet],
                         ids=["inv", "det", "slogdet", "logdet"])
def test_inverse_double_backward(fn):
    double_backward_matches(fn, well_conditioned(2, 3, 3))


def test_det_double_backward_singular():
    a = torch.tensor([[1.0, 2.0], [2.0, 4.0]], dtype=torch.float64) + 0.0
    double_backward_matches(linalg.det, a)


@pytest.mark.parametrize("n", [2, 3])
def test_the_second_derivative_of_det_at_the_zero_matrix_is_its_polynomials(n):
    """At A = 0 every singular value is 0: a cofactor differentiated through the SVD gave [[1, 0], [0, 1]] for the 2x2
    second derivative d(sum dA)/dA, where det = ad - bc has [[1, -1], [-1, 1]] (torch: NaN). Up to 3x3 the cofactor
    is its polynomial: exact; checked by central differences of the first derivative (torch.func's, at A +- h)."""
    zero = torch.zeros(n, n, dtype=torch.float64)
    a = tt.as_tracer(zero.clone(), requires_grad=True)
    (g,) = tt.grad(linalg.det(a), a, create_graph=True)
    (second,) = tt.grad(g.sum(), a, allow_unused=True, materialize_grads=True)
    first = torch.func.grad(linalg.det)
    h, expected = 1e-4, torch.zeros(n * n, dtype=torch.float64)
    for i in range(n * n):
        step = torch.zeros(n * n, dtype=torch.float64)
        step[i] = h
        step = step.view(n, n)
        expected[i] = (first(zero + step).sum() - first(zero - step).sum()) / (2 * h)
    torch.testing.assert_close(second.as_subclass(torch.Tensor), expected.view(n, n), rtol=0, atol=1e-10)
    if n == 2:
        assert second.tolist() == [[1.0, -1.0], [-1.0, 1.0]]


# ------------------------------------------------------------------------------------------------------- solve

SOLVES = [
    ("matrix rhs", lambda a, b: linalg.solve(a, b), [(3, 3), (3, 2)]),
    ("vector rhs", lambda a, b: linalg.solve(a, b), [(3, 3), (3,)]),
    ("batched vector rhs", lambda a, b: linalg.solve(a, b), [(2, 3, 3), (2, 3)]),
    ("batched", lambda a, b: linalg.solve(a, b), [(2, 3, 3), (2, 3, 4)]),
    ("broadcast A", lambda a, b: linalg.solve(a, b), [(3, 3), (2, 3, 4)]),
    ("broadcast B", lambda a, b: linalg.solve(a, b), [(2, 3, 3), (3, 4)]),
    ("broadcast 1-sized batch", lambda a, b: linalg.solve(a, b), [(1, 3, 3), (2, 3, 1)]),
    ("left=False", lambda a, b: linalg.solve(a, b, left=False), [(3, 3), (2, 3)]),
    ("left=False batched", lambda a, b: linalg.solve(a, b, left=False), [(2, 3, 3), (2, 4, 3)]),
    ("solve_ex", lambda a, b: linalg.solve_ex(a, b).result, [(2, 3, 3), (2, 3, 2)]),
    ("solve_ex left=False", lambda a, b: linalg.solve_ex(a, b, left=False)[0], [(3, 3), (2, 3)]),
    ("keyword B", lambda a, b: linalg.solve(a, B=b), [(3, 3), (3, 2)]),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fn, shapes", [c[1:] for c in SOLVES], ids=[c[0] for c in SOLVES])
def test_solve(fn, shapes, dtype):
    a, b = well_conditioned(*shapes[0], dtype=dtype), rand(*shapes[1], dtype=dtype)
    check_op(fn, a, b, **float_tolerances(dtype))


def test_solve_only_one_operand_requires_grad():
    a, b = well_conditioned(3, 3), rand(3, 2)
    check_op(lambda b: linalg.solve(a, b), b)
    check_op(lambda a: linalg.solve(a, b), a)


@pytest.mark.parametrize("left", [True, False])
def test_solve_double_backward(left):
    double_backward_matches(lambda a, b: linalg.solve(a, b, left=left), well_conditioned(2, 3, 3), rand(2, 3, 3))


# ------------------------------------------------------------------------------------------ triangular solves

TRIANGULAR = [
    ("lower", dict(upper=False), lower, [(3, 3), (3, 2)]),
    ("upper", dict(upper=True), upper, [(3, 3), (3, 2)]),
    ("lower right", dict(upper=False, left=False), lower, [(3, 3), (2, 3)]),
    ("upper right batched", dict(upper=True, left=False), upper, [(2, 3, 3), (2, 4, 3)]),
    ("unit lower", dict(upper=False, unitriangular=True), lambda x: lower(x, True), [(3, 3), (3, 2)]),
    ("unit upper right", dict(upper=True, left=False, unitriangular=True), lambda x: upper(x, True),
     [(2, 3, 3), (3, 3)]),
    ("broadcast", dict(upper=True), upper, [(3, 3), (2, 3, 2)]),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("options, make, shapes", [c[1:] for c in TRIANGULAR], ids=[c[0] for c in TRIANGULAR])
def test_solve_triangular(options, make, shapes, dtype):
    a, b = rand(*shapes[0], dtype=dtype), rand(*shapes[1], dtype=dtype)
    check_op(lambda a, b: linalg.solve_triangular(make(a), b, **options), a, b, **float_tolerances(dtype))


def test_solve_triangular_reads_one_triangle():
    """A raw (full) A: only its triangle is read, so finite differences see zero gradient elsewhere."""
    a, b = well_conditioned(3, 3), rand(3, 2)
    check_op(lambda a, b: linalg.solve_triangular(a, b, upper=True), a, b)
    check_op(lambda a, b: linalg.solve_triangular(a, b, upper=False, unitriangular=True), a, b)


@pytest.mark.parametrize("options", [dict(), dict(upper=False), dict(transpose=True), dict(unitriangular=True),
                                     dict(upper=False, transpose=True, unitriangular=True)], ids=str)
def test_legacy_triangular_solve(options):
    a, b = well_conditioned(2, 3, 3), rand(2, 3, 2)
    check_op(lambda b, a: torch.triangular_solve(b, a, **options), b, a)
    check_op(lambda b, a: b.triangular_solve(a, **options).solution, b, a)


def test_solve_triangular_double_backward():
    double_backward_matches(lambda a, b: linalg.solve_triangular(lower(a), b, upper=False), rand(3, 3), rand(3, 2))


# --------------------------------------------------------------------------------------------------- LU family

def packed(out):
    return out[0]


LU = [
    ("lu_factor", lambda a: linalg.lu_factor(a).LU, [(3, 3)]),
    ("lu_factor batched", lambda a: linalg.lu_factor(a)[0], [(2, 4, 4)]),
    ("lu_factor wide", lambda a: linalg.lu_factor(a)[0], [(2, 3, 5)]),
    ("lu_factor tall", lambda a: linalg.lu_factor(a)[0], [(5, 3)]),
    ("lu_factor_ex", lambda a: linalg.lu_factor_ex(a).LU, [(2, 3, 3)]),
    ("torch.lu", lambda a: torch.lu(a)[0], [(2, 3, 3)]),
    ("torch.lu get_infos", lambda a: torch.lu(a, get_infos=True)[0], [(3, 3)]),
    ("Tensor.lu", lambda a: a.lu()[0], [(3, 4)]),
    ("lu L and U", lambda a: linalg.lu(a)[1:], [(2, 3, 3)]),
    ("lu wide", lambda a: linalg.lu(a)[1:], [(3, 5)]),
    ("lu tall", lambda a: linalg.lu(a)[1:], [(2, 5, 3)]),
    ("lu only U", lambda a: linalg.lu(a).U, [(4, 4)]),
    ("lu_unpack", lambda a: torch.lu_unpack(*linalg.lu_factor(a))[1:], [(2, 3, 3)]),
    ("lu_unpack wide", lambda a: torch.lu_unpack(*linalg.lu_factor(a))[1:], [(3, 5)]),
    ("lu_unpack tall only L", lambda a: torch.lu_unpack(*linalg.lu_factor(a)).L, [(5, 3)]),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fn, shapes", [c[1:] for c in LU], ids=[c[0] for c in LU])
def test_lu(fn, shapes, dtype):
    check_op(fn, *(rand(*s, dtype=dtype) for s in shapes), **float_tolerances(dtype))


LU_SOLVE = [
    ("left", dict(), [(3, 3), (3, 2)]),
    ("adjoint", dict(adjoint=True), [(2, 3, 3), (2, 3, 2)]),
    ("right", dict(left=False), [(3, 3), (2, 3)]),
    ("right adjoint", dict(left=False, adjoint=True), [(2, 3, 3), (2, 4, 3)]),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("options, shapes", [c[1:] for c in LU_SOLVE], ids=[c[0] for c in LU_SOLVE])
def test_lu_solve(options, shapes, dtype):
    a, b = rand(*shapes[0], dtype=dtype), rand(*shapes[1], dtype=dtype)

    def fn(a, b):
        lu, pivots = linalg.lu_factor(a)
        return linalg.lu_solve(lu, pivots, b, **options)

    check_op(fn, a, b, **float_tolerances(dtype))


def test_lu_solve_with_a_given_factorisation():
    """The LU factor as the input itself (not computed inside): its gradient is the packed dL + dU."""
    lu, pivots = linalg.lu_factor(well_conditioned(3, 3))
    b = rand(3, 2)
    check_op(lambda lu, b: linalg.lu_solve(lu, pivots, b), lu, b)
    check_op(lambda b, lu: torch.lu_solve(b, lu, pivots), b, lu)
    check_op(lambda b, lu: b.lu_solve(lu, pivots), b, lu)


def test_lu_unpack_of_a_given_factor():
    lu, pivots = linalg.lu_factor(rand(4, 3))
    check_op(lambda lu: torch.lu_unpack(lu, pivots)[1:], lu)
    check_op(lambda lu: torch.lu_unpack(lu, pivots, unpack_pivots=False).U, lu)


def test_lu_double_backward():
    double_backward_matches(lambda a: linalg.lu_factor(a)[0], well_conditioned(3, 3))

    def solve(a, b):
        return linalg.lu_solve(*linalg.lu_factor(a), b)

    double_backward_matches(solve, well_conditioned(3, 3), rand(3, 2))


# ----------------------------------------------------------------------------------------- Cholesky factor given

@pytest.mark.parametrize("upper_", [False, True])
@pytest.mark.parametrize("shapes", [[(3, 2), (3, 3)], [(2, 3, 2), (2, 3, 3)], [(3, 2), (2, 3, 3)]], ids=str)
def test_cholesky_solve(shapes, upper_):
    b, x = rand(*shapes[0]), rand(*shapes[1])

    def fn(b, x):
        factor = linalg.cholesky(spd(x), upper=upper_)
        return torch.cholesky_solve(b, factor, upper_)

    check_op(fn, b, x)
    triangle = upper if upper_ else lower
    check_op(lambda b, x: T.cholesky_solve(b, triangle(x), upper=upper_), b, x)
    # a raw factor: torch's gradient covers the whole matrix (as if A = L L^T used all of L); so does ours
    check_op(lambda b, f: T.cholesky_solve(b, f, upper=upper_), b, triangle(x), gradcheck=False)


@pytest.mark.parametrize("upper_", [False, True])
def test_cholesky_inverse(upper_):
    x = rand(2, 3, 3)
    check_op(lambda x: torch.cholesky_inverse(linalg.cholesky(spd(x), upper=upper_), upper_), x)
    triangle = upper if upper_ else lower
    check_op(lambda x: triangle(x).cholesky_inverse(upper=upper_), x[0])
    check_op(lambda f: f.cholesky_inverse(upper=upper_), triangle(x[0]), gradcheck=False)


def test_cholesky_solve_double_backward():
    double_backward_matches(lambda b, f: torch.cholesky_solve(b, f), rand(3, 2), lower(rand(3, 3)))


# ------------------------------------------------------------------------------------------- generated batch shapes

@settings(max_examples=15, deadline=None)
@given(a_batch=st.lists(st.integers(1, 2), max_size=2), b_batch=st.lists(st.integers(1, 2), max_size=2),
       n=st.integers(2, 3), k=st.integers(1, 2), left=st.booleans())
def test_solve_and_inverse_over_generated_batch_shapes(a_batch, b_batch, n, k, left):
    """A and B batch dims broadcast against each other (the engine sums dA / dB back to their shapes)."""
    assume(len(b_batch) != len(a_batch) - 1)  # else torch may read B as a batch of vectors
    a = well_conditioned(*a_batch, n, n)
    b = rand(*b_batch, *((n, k) if left else (k, n)))
    check_op(lambda a, b: linalg.solve(a, b, left=left) + linalg.det(a)[..., None, None], a, b, gradcheck=False)
    check_op(lambda a: linalg.inv(a), a, gradcheck=False)


# -------------------------------------------------------------------------------------------------------- errors

@pytest.mark.parametrize("fn", [linalg.inv, linalg.det, lambda a: linalg.solve(a, a)], ids=["inv", "det", "solve"])
def test_complex_inputs_are_refused(fn):
    a = tt.tracer(torch.randn(2, 2, dtype=torch.complex128), requires_grad=True)
    with pytest.raises(UnsupportedOperationError, match="complex inputs are not supported"):
        fn(a)


def test_lu_without_pivoting_is_refused_on_the_cpu_as_torch_refuses_it():
    """(tests/test_cuda.py checks its gradient where torch has it, on CUDA)"""
    for leaf in (torch.eye(3).requires_grad_(), tt.as_tracer(torch.eye(3), requires_grad=True)):
        with pytest.raises(RuntimeError, match="LU without pivoting is not implemented on the CPU"):
            torch.linalg.lu(leaf, pivot=False)


def test_the_permutation_of_an_lu_needs_no_gradient_as_torchs():
    """P of torch.linalg.lu and torch.lu_unpack is a constant: torch marks it as needing no gradient, and so does
    torchtrace (it needed one, with a grad_fn); L and U keep torch's gradients."""
    a = torch.randn(4, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    ours, theirs = tt.as_tracer(a.clone(), requires_grad=True), a.clone().requires_grad_()
    for x in (ours, theirs):
        p, lower, upper = torch.linalg.lu(x)
        unpacked = torch.lu_unpack(*torch.linalg.lu_factor(x[:3]))
        assert [t.requires_grad for t in (p, lower, upper, *unpacked)] == [False, True, True, False, True, True]
        (lower.sin().sum() + upper.pow(2).sum() + unpacked[1].sum()).backward()
    torch.testing.assert_close(ours.grad.as_subclass(torch.Tensor), theirs.grad)


def test_the_second_derivative_of_det_at_a_singular_matrix_whose_det_rounds_to_a_tiny_number_is_exact():
    """[[.1, .2, .3], [.4, .5, .6], [.7, .8, .9]] is singular, but its det comes out 3.3e-18: the regular formula
    d A^-T then cancels ~1e18 against ~1e-18 in its derivative, and d(dA[0, 0])/dA was [.03, -.375, .19, ...] for the
    exact [0, 0, 0, 0, .9, -.8, 0, -.6, .5] (the cofactor a11 a22 - a12 a21 differentiated). With create_graph a 3x3
    takes the polynomial cofactor; the first derivative agrees with torch's."""
    a0 = torch.tensor([[0.1, 0.2, 0.3], [0.4, 0.5, 0.6], [0.7, 0.8, 0.9]], dtype=torch.float64)
    a = tt.as_tracer(a0.clone(), requires_grad=True)
    (g,) = tt.grad(linalg.det(a), a, create_graph=True)
    (second,) = tt.grad(g[0, 0], a)
    exact = torch.tensor([[0.0, 0.0, 0.0], [0.0, 0.9, -0.8], [0.0, -0.6, 0.5]], dtype=torch.float64)
    torch.testing.assert_close(second.as_subclass(torch.Tensor), exact, rtol=0, atol=1e-15)
    ref = a0.clone().requires_grad_()
    (theirs,) = torch.autograd.grad(linalg.det(ref), ref)
    torch.testing.assert_close(g.detach().as_subclass(torch.Tensor), theirs, rtol=0, atol=1e-15)
