"""Gradient rules of torchtrace/ops/linalg_functions.py: matrix_exp / power, norms, cond, multi_dot, vecdot,
vander, householder_product, ormqr, tensorinv / tensorsolve, linalg.diagonal."""
import math

import pytest
import torch
from helpers import check_op, double_backward_matches, float_tolerances, non_contiguous
from linalg_cases import DTYPES, loose_tolerances, rand, well_conditioned

import torchtrace as tt
from torchtrace.errors import UnsupportedOperationError

T = torch.Tensor
linalg = torch.linalg


# ------------------------------------------------------------------------------------------ exponential, powers

POWERS = [
    ("matrix_exp", linalg.matrix_exp, (3, 3)),
    ("matrix_exp batched", linalg.matrix_exp, (2, 3, 3)),
    ("torch.matrix_exp", torch.matrix_exp, (2, 2)),
    ("Tensor.matrix_exp", T.matrix_exp, (2, 1, 3, 3)),
    ("power 0", lambda a: linalg.matrix_power(a, 0) * a, (3, 3)),
    ("power 1", lambda a: linalg.matrix_power(a, 1), (3, 3)),
    ("power 3", lambda a: linalg.matrix_power(a, 3), (2, 3, 3)),
    ("power -1", lambda a: linalg.matrix_power(a, -1), (3, 3)),
    ("power -3", lambda a: linalg.matrix_power(a, -3), (2, 3, 3)),
    ("torch.matrix_power", lambda a: torch.matrix_power(a, 2), (3, 3)),
    ("Tensor.matrix_power", lambda a: a.matrix_power(n=-2), (3, 3)),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fn, shape", [c[1:] for c in POWERS], ids=[c[0] for c in POWERS])
def test_matrix_exp_and_power(fn, shape, dtype):
    a = well_conditioned(*shape, dtype=dtype) / shape[-1]
    check_op(fn, a, **float_tolerances(dtype))


@pytest.mark.parametrize("fn", [linalg.matrix_exp, lambda a: linalg.matrix_power(a, 3),
                                lambda a: linalg.matrix_power(a, -2)], ids=["exp", "power 3", "power -2"])
def test_matrix_exp_and_power_double_backward(fn):
    double_backward_matches(fn, well_conditioned(3, 3) / 3)


# -------------------------------------------------------------------------------------------------------- norms

MATRIX_ORDS = ["fro", "nuc", 2, -2, 1, -1, math.inf, -math.inf]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ord", MATRIX_ORDS, ids=str)
def test_matrix_norm_every_ord(ord, dtype):
    check_op(lambda a: linalg.matrix_norm(a, ord), rand(2, 3, 4, dtype=dtype), **float_tolerances(dtype))


@pytest.mark.parametrize("ord", MATRIX_ORDS, ids=str)
@pytest.mark.parametrize("dim, keepdim", [((0, 2), False), ((2, 0), True), ((-1, -3), True)], ids=str)
def test_matrix_norm_dims(ord, dim, keepdim):
    check_op(lambda a: linalg.matrix_norm(a, ord, dim, keepdim), non_contiguous(rand(3, 2, 4)))


def test_matrix_norm_dtype_and_ties():
    check_op(lambda a: linalg.matrix_norm(a, dtype=torch.float64), rand(3, 3, dtype=torch.float32), gradcheck=False)
    tied = torch.tensor([[1.0, -2.0], [2.0, 1.0]], dtype=torch.float64)  # equal column and row sums
    for ord in (1, -1, math.inf, -math.inf):
        check_op(lambda a: linalg.matrix_norm(a, ord), tied, gradcheck=False)
    check_op(lambda a: linalg.matrix_norm(a, 2), torch.eye(3, dtype=torch.float64), gradcheck=False)
    check_op(lambda a: linalg.matrix_norm(a), torch.zeros(2, 2, dtype=torch.float64), gradcheck=False)


@pytest.mark.parametrize("ord", [1, -1, math.inf, -math.inf, 2, -2])
def test_a_gradient_split_between_tied_norms_is_exact_in_float64(ord):
    """Three tied columns (rows, singular values) share the gradient: 1/3 each, in float64 as torch gives it (the
    share was computed from a bool mask, in float32: 0.3333333432674408)."""
    tied = torch.ones(3, 3, dtype=torch.float64) if abs(ord) != 2 else torch.eye(3, dtype=torch.float64)
    ours = tt.as_tracer(tied.clone(), requires_grad=True)
    linalg.matrix_norm(ours, ord).backward()
    theirs = tied.clone().requires_grad_()
    linalg.matrix_norm(theirs, ord).backward()
    assert torch.equal(ours.grad.as_subclass(torch.Tensor), theirs.grad)


LINALG_NORM = [
    ("default (flattened 2-norm)", {}, (2, 3, 4)),
    ("vector ord", {"ord": 3}, (4,)),
    ("vector dim", {"ord": 1, "dim": 1}, (2, 3)),
    ("vector inf dim tuple", {"ord": math.inf, "dim": (0,)}, (3, 2)),
    ("matrix default ord", {"dim": (0, 1)}, (3, 4, 2)),
    ("matrix nuc", {"ord": "nuc"}, (3, 4)),
    ("matrix 2 keepdim", {"ord": 2, "dim": (-2, -1), "keepdim": True}, (2, 3, 3)),
    ("matrix -inf", {"ord": -math.inf}, (3, 4)),
    ("matrix fro over batch", {"ord": "fro", "dim": (1, 2)}, (2, 3, 4)),
]


@pytest.mark.parametrize("kwargs, shape", [c[1:] for c in LINALG_NORM], ids=[c[0] for c in LINALG_NORM])
def test_linalg_norm(kwargs, shape):
    check_op(lambda a: linalg.norm(a, **kwargs), rand(*shape))


@pytest.mark.parametrize("kwargs", [{"p": "nuc"}, {"p": "nuc", "dim": (0, 2), "keepdim": True}, {"p": "fro"},
                                    {"p": 3, "dim": 1}], ids=str)
def test_torch_norm_with_nuclear(kwargs):
    check_op(lambda a: torch.norm(a, **kwargs), rand(3, 4, 2) if "dim" in kwargs else rand(3, 4))
    check_op(lambda a: a.norm(**kwargs), rand(3, 4, 2) if "dim" in kwargs else rand(3, 4))


@pytest.mark.parametrize("ord", ["fro", "nuc", 2, -2, math.inf], ids=str)
def test_matrix_norm_double_backward(ord):
    double_backward_matches(lambda a: linalg.matrix_norm(a, ord), rand(3, 4) if ord != math.inf else rand(3, 3))


def ours_or(reference):
    """Our rule on tracers; under torch autograd an equivalent composite (where torch's own backward fails)."""
    return lambda ours: lambda *xs: ours(*xs) if isinstance(xs[0], tt.tracer) else reference(*xs)


def cond_reference(p):
    """torch 2.13's cond backward for these norms fails (an in-place error inside torch): its definition instead."""
    return lambda a: linalg.matrix_norm(a, p) * linalg.matrix_norm(linalg.inv(a), p)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("p", [None, 2, -2, "fro", "nuc", 1, -1, math.inf, -math.inf], ids=str)
def test_cond(p, dtype):
    fn = lambda a: linalg.cond(a, p)  # noqa: E731
    if p not in (None, 2, -2, "nuc"):
        fn = ours_or(cond_reference(p))(fn)
    check_op(fn, well_conditioned(2, 3, 3, dtype=dtype), **loose_tolerances(dtype))


def test_cond_non_square_and_double_backward():
    check_op(linalg.cond, rand(4, 3))
    check_op(lambda a: linalg.cond(a, -2), rand(2, 3, 5))
    double_backward_matches(linalg.cond, well_conditioned(3, 3))
    double_backward_matches(lambda a: linalg.cond(a, "nuc"), well_conditioned(3, 3))


# ------------------------------------------------------------------------------------------------- products

MULTI_DOT = [
    ("two matrices", [(2, 3), (3, 4)]),
    ("four matrices", [(2, 3), (3, 4), (4, 1), (1, 5)]),
    ("vector first", [(3,), (3, 4), (4, 2)]),
    ("vector last", [(2, 3), (3, 4), (4,)]),
    ("vectors at both ends", [(3,), (3, 4), (4,)]),
    ("two vectors", [(3,), (3,)]),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shapes", [c[1] for c in MULTI_DOT], ids=[c[0] for c in MULTI_DOT])
def test_multi_dot(shapes, dtype):
    check_op(lambda *ms: linalg.multi_dot(list(ms)), *(rand(*s, dtype=dtype) for s in shapes),
             **float_tolerances(dtype))


def test_multi_dot_tuple_used_twice_and_double_backward():
    a, b = rand(3, 3), rand(3, 2)
    check_op(lambda a, b: linalg.multi_dot((a, a, b)), a, b)
    double_backward_matches(lambda a, b: linalg.multi_dot([a, a, b]), a, b)


@pytest.mark.skipif(not hasattr(torch, "chain_matmul"), reason="torch.chain_matmul was removed")
@pytest.mark.filterwarnings("ignore:torch.chain_matmul is deprecated")
@pytest.mark.parametrize("shapes", [[(2, 3), (3, 4), (4, 2)], [(2, 3), (3, 4)], [(2, 3)]], ids=str)
def test_chain_matmul(shapes):
    check_op(torch.chain_matmul, *(rand(*s) for s in shapes))


VECDOT = [
    ("vectors", [(3,), (3,)], {}),
    ("batched", [(2, 3), (2, 3)], {}),
    ("broadcast", [(2, 1, 3), (4, 3)], {}),
    ("dim=0", [(3, 2), (3, 2)], {"dim": 0}),
    ("dim=-2 broadcast", [(3, 2), (2, 3, 1)], {"dim": -2}),
]


@pytest.mark.parametrize("shapes, kwargs", [c[1:] for c in VECDOT], ids=[c[0] for c in VECDOT])
def test_vecdot(shapes, kwargs):
    check_op(lambda x, y: linalg.vecdot(x, y, **kwargs), *(rand(*s) for s in shapes))


def test_vecdot_same_input_twice():
    check_op(lambda x: linalg.vecdot(x, x), rand(2, 3))


# ------------------------------------------------------------------------------------------------------- vander

def legacy_vander_reference(x, N=None, increasing=False):
    """torch 2.13's torch.vander backward fails (an in-place error inside torch): linalg.vander instead."""
    v = linalg.vander(x, N=x.shape[-1] if N is None else N)
    return v if increasing else v.flip(-1)


VANDER = [
    ("linalg default N", lambda x: linalg.vander(x), (3,)),
    ("linalg batched N=4", lambda x: linalg.vander(x, N=4), (2, 3)),
    ("linalg N=2", lambda x: linalg.vander(x, N=2), (3,)),
    ("torch.vander", ours_or(legacy_vander_reference)(torch.vander), (4,)),
    ("torch.vander N increasing", ours_or(lambda x: legacy_vander_reference(x, 3, True))(
        lambda x: torch.vander(x, N=3, increasing=True)), (4,)),
    ("torch.vander N=5", ours_or(lambda x: legacy_vander_reference(x, 5))(lambda x: torch.vander(x, 5)), (3,)),
]


@pytest.mark.parametrize("fn, shape", [c[1:] for c in VANDER], ids=[c[0] for c in VANDER])
def test_vander(fn, shape):
    check_op(fn, rand(*shape))


def test_vander_at_zero_and_double_backward():
    x = torch.tensor([0.0, 1.5, -2.0], dtype=torch.float64)
    check_op(lambda x: linalg.vander(x, N=4), x)
    double_backward_matches(lambda x: linalg.vander(x, N=4), rand(3))


# ------------------------------------------------------------------------------------------ Householder product

HOUSEHOLDER = [
    ("square", (3, 3), (3,)),
    ("tall", (5, 3), (3,)),
    ("fewer reflectors", (5, 3), (2,)),
    ("batched", (2, 4, 3), (2, 3)),
    ("single column", (4, 1), (1,)),
]


@pytest.mark.parametrize("shapes", [c[1:] for c in HOUSEHOLDER], ids=[c[0] for c in HOUSEHOLDER])
def test_householder_product(shapes):
    a, tau = rand(*shapes[0]), rand(*shapes[1])
    check_op(linalg.householder_product, a, tau)
    check_op(torch.orgqr, a, tau)


@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("batch", [(), (2,)])
def test_ormqr(left, transpose, batch):
    a, tau = rand(*batch, 5, 3), rand(*batch, 3)
    c = rand(*batch, 5, 4) if left else rand(*batch, 4, 5)
    check_op(lambda *t: torch.ormqr(*t, left=left, transpose=transpose), a, tau, c)
    check_op(lambda *t: t[0].ormqr(*t[1:], left, transpose), a, tau, c)


def test_ormqr_of_a_qr_multiplies_by_q_and_double_backward():
    reflectors, tau = torch.geqrf(rand(4, 4))
    c = rand(4, 2)
    torch.testing.assert_close(torch.ormqr(reflectors, tau, c), torch.linalg.householder_product(reflectors, tau) @ c)
    check_op(torch.ormqr, reflectors, tau, c)
    double_backward_matches(lambda a, t, x: torch.ormqr(a, t, x, transpose=True), rand(4, 3), rand(3), rand(4, 2))


def test_householder_product_of_a_qr_and_double_backward():
    reflectors, tau = torch.geqrf(rand(4, 3))  # the reflectors of a real QR decomposition
    check_op(lambda a, tau: a.orgqr(tau), reflectors, tau)
    double_backward_matches(linalg.householder_product, rand(4, 3), rand(3))


# ---------------------------------------------------------------------------------------- tensorinv, tensorsolve

@pytest.mark.parametrize("shape, ind", [((4, 6, 8, 3), 2), ((6, 2, 3), 1), ((2, 3, 6), 2)], ids=str)
def test_tensorinv(shape, ind):
    a = well_conditioned(math.prod(shape[:ind]), math.prod(shape[ind:])).reshape(shape)
    check_op(lambda a: linalg.tensorinv(a, ind=ind), a)


@pytest.mark.parametrize("a_shape, b_shape, dims", [((2, 3, 6), (2, 3), None), ((6, 2, 3), (6,), None),
                                                    ((2, 3, 6), (6,), (0, 1)), ((3, 6, 2), (6,), (0, 2))], ids=str)
def test_tensorsolve(a_shape, b_shape, dims):
    n = math.prod(b_shape)
    a = well_conditioned(n, n).reshape(a_shape)
    check_op(lambda a, b: linalg.tensorsolve(a, b, dims=dims), a, rand(*b_shape))


def test_tensor_inverse_double_backward():
    double_backward_matches(lambda a: linalg.tensorinv(a, 1), well_conditioned(6, 6).reshape(6, 2, 3))
    double_backward_matches(linalg.tensorsolve, well_conditioned(6, 6).reshape(2, 3, 6), rand(2, 3))


# ------------------------------------------------------------------------------------------------ linalg.diagonal

@pytest.mark.parametrize("kwargs", [{}, {"offset": 1}, {"offset": -1, "dim1": 0, "dim2": 2}], ids=str)
def test_linalg_diagonal(kwargs):
    check_op(lambda a: linalg.diagonal(a, **kwargs), rand(2, 3, 4))


# -------------------------------------------------------------------------------------------------------- errors

@pytest.mark.parametrize("fn", [linalg.matrix_exp, linalg.matrix_norm, lambda a: linalg.multi_dot([a, a])],
                         ids=["matrix_exp", "matrix_norm", "multi_dot"])
def test_complex_inputs_are_refused(fn):
    a = tt.tracer(torch.randn(2, 2, dtype=torch.complex128), requires_grad=True)
    with pytest.raises(UnsupportedOperationError, match="complex inputs are not supported"):
        fn(a)


# -------------------------------------------------------------------------------------------- conjugate transposes

@pytest.mark.parametrize("fn, shape", [(lambda a: a.mH, (2, 3, 4)), (T.adjoint, (3, 4)), (torch.adjoint, (2, 2, 3)),
                                       (lambda a: a.H, (3, 4))], ids=["mH", "Tensor.adjoint", "torch.adjoint", "H"])
def test_conjugate_transposes_of_real_matrices(fn, shape):
    check_op(fn, rand(*shape))
