"""Gradient rules of torchtrace/ops/reduction.py and softmax.py: every rule and alias against torch autograd."""
import math

import pytest
import torch
import torch.nn.functional as F
from helpers import check_op, double_backward_matches, non_contiguous
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import torchtrace as tt
import torchtrace.ops.softmax  # noqa: F401  (registers softmax / log_softmax until ops/__init__ imports it)
from torchtrace.ops.reduction import expand_reduced, reduced_dims

T = torch.Tensor
DTYPES = [torch.float32, torch.float64]
INF = math.inf

gen = torch.Generator().manual_seed(0)
X = torch.randn(3, 4, generator=gen)  # distinct values: no ties unless a case builds them
X0 = torch.tensor(0.7)  # a 0-d input
X3 = torch.randn(2, 3, 4, generator=gen)
ZEROS = torch.tensor([[1.5, 0.0, -2.0, 0.5], [0.7, 1.2, -0.8, 2.0], [0.0, 0.0, 3.0, -1.0]])  # rows: 1, 0, 2 zeros
TIES = torch.tensor([[1.0, 3.0, 3.0, 0.5], [2.0, 3.0, -1.0, 3.0], [0.0, 0.0, -2.0, 0.0]])
B = torch.randn(4, generator=gen)  # broadcasts against X


def case(name, fn, *inputs, gradcheck=True):
    return pytest.param(fn, inputs, gradcheck, id=name)


def run(fn, inputs, gradcheck, dtype):
    inputs = [x.to(dtype) for x in inputs]
    tolerance = {"rtol": 1e-4, "atol": 1e-5} if dtype == torch.float32 else {}
    check_op(fn, *inputs, gradcheck=gradcheck, **tolerance)


SUM_MEAN = [
    case("torch.sum all", torch.sum, X),
    case("Tensor.sum all", T.sum, X),
    case("sum dim int", lambda x: x.sum(1), X),
    case("sum negative dim", lambda x: torch.sum(x, -1), X),
    case("sum tuple dims", lambda x: x.sum((0, -1)), X3),
    case("sum list dims keepdim", lambda x: torch.sum(x, [0, 2], keepdim=True), X3),
    case("sum keepdim", lambda x: x.sum(dim=0, keepdim=True), X),
    case("sum dtype", lambda x: x.sum(1, dtype=torch.float64), X),
    case("sum dtype all", lambda x: torch.sum(x, dtype=torch.float64), X),
    case("sum empty dims = all", lambda x: torch.sum(x, ()), X),
    case("sum numpy names", lambda x: x.sum(axis=1, keepdims=True), X),
    case("sum input keyword", lambda x: torch.sum(input=x, dim=0), X),
    case("sum 0-d", lambda x: x.sum(), X0),
    case("sum 0-d dim", lambda x: x.sum(-1, keepdim=True), X0),
    case("sum non-contiguous", lambda x: x.sum(0), non_contiguous(X)),
    case("sum used twice", lambda x: x.sum(1) * x.sum(1), X),
    case("torch.mean all", torch.mean, X),
    case("Tensor.mean all", T.mean, X),
    case("mean dim", lambda x: x.mean(-1), X),
    case("mean keepdim", lambda x: torch.mean(x, 0, keepdim=True), X),
    case("mean tuple dims", lambda x: x.mean((0, 2)), X3),
    case("mean dtype", lambda x: torch.mean(x, 1, dtype=torch.float64), X),
    case("mean numpy names", lambda x: torch.mean(x, axis=0), X),
    case("mean 0-d", lambda x: x.mean(), X0),
    case("mean non-contiguous", lambda x: x.mean(1), non_contiguous(X)),
    case("mean used twice", lambda x: x.mean(0) - x.mean(), X),
]

PROD = [
    case("torch.prod all", torch.prod, X),
    case("Tensor.prod all", T.prod, X),
    case("prod dim", lambda x: x.prod(1), X),
    case("prod negative dim keepdim", lambda x: torch.prod(x, -2, keepdim=True), X),
    case("prod dtype", lambda x: torch.prod(x, dtype=torch.float64), X),
    case("prod dim dtype", lambda x: x.prod(0, dtype=torch.float64), X),
    case("prod one zero all", lambda x: x[:2].prod(), ZEROS),
    case("prod several zeros all", torch.prod, ZEROS),
    case("prod zeros along dim", lambda x: x.prod(1), ZEROS),
    case("prod zeros along dim 0", lambda x: x.prod(0, keepdim=True), ZEROS),
    case("prod all zeros", lambda x: (x * 0).prod(1), X),
    case("prod 0-d", lambda x: x.prod(), X0),
    case("prod 0-d dim", lambda x: x.prod(0), X0),
    case("prod 0-d zero", lambda x: (x * 0).prod(0), X0),
    case("prod non-contiguous", lambda x: x.prod(0), non_contiguous(X)),
    case("prod used twice", lambda x: x.prod(1) * x.sum(1), X),
]

MAX_MIN = [
    case("torch.max all", torch.max, X),
    case("Tensor.max all", T.max, X),
    case("torch.min all", torch.min, X),
    case("Tensor.min all", T.min, X),
    case("max all ties split evenly", torch.max, TIES, gradcheck=False),
    case("min all ties split evenly", torch.min, TIES, gradcheck=False),
    case("max dim", lambda x: torch.max(x, 1), X),
    case("max dim values", lambda x: x.max(-1).values, X),
    case("max dim keepdim", lambda x: x.max(dim=0, keepdim=True), X),
    case("max dim positional keepdim", lambda x: T.max(x, 1, True)[0], X),
    case("max dim ties -> the returned index", lambda x: x.max(1).values, TIES, gradcheck=False),
    case("min dim", lambda x: torch.min(x, 0), X),
    case("min dim keepdim", lambda x: x.min(-1, keepdim=True).values, X),
    case("max numpy names", lambda x: x.max(axis=1, keepdims=True).values, X),
    case("max 0-d", torch.max, X0),
    case("max 0-d dim", lambda x: torch.max(x, 0).values, X0),
    case("min 0-d dim keepdim", lambda x: x.min(-1, keepdim=True)[0], X0),
    case("max non-contiguous", lambda x: x.max(0).values, non_contiguous(X)),
    case("max binary", lambda a, b: torch.max(a, b), X, X.flip(0)),
    case("Tensor.max binary", lambda a, b: a.max(b), X, X.flip(1)),
    case("max binary keyword other", lambda a, b: torch.max(a, other=b), X, X.flip(0)),
    case("max binary broadcast", lambda a, b: torch.max(a, b), X, B),
    case("max binary ties halve", lambda a, b: torch.max(a, b), TIES, TIES.flip(1), gradcheck=False),
    case("min binary", lambda a, b: torch.min(a, b), X, X.flip(0)),
    case("Tensor.min binary broadcast", lambda a, b: b.min(a), X, B),
    case("min binary ties halve", lambda a, b: a.min(b), TIES, TIES.flip(0), gradcheck=False),
    case("max binary used twice", lambda x: torch.max(x, x), X),
    case("max used twice", lambda x: x.max() * x.min(1).values, X),
    case("torch.amax", lambda x: torch.amax(x, 1), X),
    case("Tensor.amax all", T.amax, X),
    case("amax tuple keepdim", lambda x: x.amax((0, -1), keepdim=True), X3),
    case("amax ties split evenly", lambda x: x.amax(1), TIES, gradcheck=False),
    case("amax all ties", lambda x: x.amax(), TIES, gradcheck=False),
    case("torch.amin", lambda x: torch.amin(x, -1, keepdim=True), X),
    case("Tensor.amin", lambda x: x.amin(0), X),
    case("amin ties split evenly", lambda x: x.amin(0), TIES, gradcheck=False),
    case("amax 0-d", lambda x: x.amax(), X0),
    case("amin non-contiguous", lambda x: x.amin(1), non_contiguous(X)),
]

LOGSUMEXP = [
    case("torch.logsumexp", lambda x: torch.logsumexp(x, 1), X),
    case("Tensor.logsumexp keepdim", lambda x: x.logsumexp(-1, keepdim=True), X),
    case("special.logsumexp tuple", lambda x: torch.special.logsumexp(x, (0, 2)), X3),
    case("logsumexp large values", lambda x: torch.logsumexp(x * 100, 0), X),
    case("logsumexp 0-d", lambda x: x.logsumexp(0), X0),
    case("logsumexp non-contiguous", lambda x: x.logsumexp(0), non_contiguous(X)),
    case("logsumexp used twice", lambda x: x.logsumexp(1) * x.logsumexp(1), X),
]

VAR_STD = [
    case(f"{name} {label}", (lambda op, a, k: lambda x: op(x, *a, **k))(op, args, kwargs), X)
    for name, op in [("torch.var", torch.var), ("Tensor.var", T.var), ("torch.std", torch.std), ("Tensor.std", T.std)]
    for label, args, kwargs in [
        ("all", (), {}),
        ("dim", (1,), {}),
        ("negative dim keepdim", (-1,), {"keepdim": True}),
        ("tuple dims", ((0, 1),), {}),
        ("unbiased False", (), {"unbiased": False}),
        ("positional unbiased", (False,), {}),
        ("dim unbiased keepdim positional", (0, False, True), {}),
        ("dim unbiased keyword", (1,), {"unbiased": True}),
        ("correction 0", (1,), {"correction": 0}),
        ("correction 2 keepdim", (0,), {"correction": 2, "keepdim": True}),
        ("correction 0.5", (), {"dim": 1, "correction": 0.5}),
        ("numpy names", (), {"axis": 1, "keepdims": True}),
    ]
] + [
    case("var 0-d correction 0", lambda x: x.var(correction=0), X0),
    case("std 0-d correction 0", lambda x: torch.std(x, 0, correction=0), X0),
    case("std of constant rows is 0", lambda x: (x * 0 + 1).std(1), X),
    case("var non-contiguous", lambda x: x.var(0), non_contiguous(X)),
    case("std non-contiguous", lambda x: x.std(1), non_contiguous(X)),
    case("var used twice", lambda x: x.var(1) * x.std(1), X),
]

NORMS = [
    case("Tensor.norm", T.norm, X),
    case("torch.norm", torch.norm, X),
    case("norm p=2 dim", lambda x: x.norm(2, 1), X),
    case("norm p=1", lambda x: torch.norm(x, 1), X),
    case("norm p=1 dim keepdim", lambda x: x.norm(p=1, dim=-1, keepdim=True), X),
    case("norm p=inf", lambda x: torch.norm(x, INF), X),
    case("norm p=-inf dim", lambda x: x.norm(-INF, 0), X),
    case("norm p=inf ties", lambda x: x.norm(INF, 1), TIES, gradcheck=False),
    case("norm fro", lambda x: torch.norm(x, "fro"), X),
    case("norm fro dims", lambda x: x.norm("fro", (0, 1)), X3),
    case("norm fro dim keepdim", lambda x: torch.norm(x, p="fro", dim=1, keepdim=True), X),
    case("norm p=3", lambda x: x.norm(3, 0), X),
    case("norm p=1.5", lambda x: x.norm(1.5), X),
    case("norm p=0.5", lambda x: x.norm(0.5, 1), X),
    case("norm p=0", lambda x: x.norm(0), X),
    case("norm dtype", lambda x: torch.norm(x, dtype=torch.float64), X),
    case("norm p=2 at zero", lambda x: (x * 0).norm(), X, gradcheck=False),
    case("norm p=2 at zero along dim", lambda x: x.norm(dim=1), ZEROS * torch.tensor([[1.0], [1.0], [0.0]]),
         gradcheck=False),
    case("norm p=1 with zeros", lambda x: x.norm(1), ZEROS, gradcheck=False),
    case("norm p=0.5 with zeros", lambda x: x.norm(0.5, 1), ZEROS, gradcheck=False),
    case("norm p=3 at zero", lambda x: (x * 0).norm(3), X, gradcheck=False),
    case("norm 0-d", lambda x: x.norm(), X0),
    case("norm non-contiguous", lambda x: x.norm(dim=0), non_contiguous(X)),
    case("norm used twice", lambda x: x / x.norm(dim=1, keepdim=True), X),
    case("vector_norm", torch.linalg.vector_norm, X),
    case("vector_norm ord dim", lambda x: torch.linalg.vector_norm(x, 1, -1), X),
    case("vector_norm ord inf keepdim", lambda x: torch.linalg.vector_norm(x, INF, 0, True), X),
    case("vector_norm keywords", lambda x: torch.linalg.vector_norm(x, ord=3, dim=(0, 2), keepdim=True), X3),
    case("vector_norm ord 0.5", lambda x: torch.linalg.vector_norm(x, ord=0.5), X),
    case("vector_norm negative ord", lambda x: torch.linalg.vector_norm(x, ord=-1.5, dim=1), X),
    case("vector_norm dtype", lambda x: torch.linalg.vector_norm(x, dtype=torch.float64), X),
    case("vector_norm at zero", lambda x: torch.linalg.vector_norm(x * 0, 2, 0), X, gradcheck=False),
]

CUMSUM = [
    case("torch.cumsum", lambda x: torch.cumsum(x, 1), X),
    case("Tensor.cumsum negative dim", lambda x: x.cumsum(-2), X),
    case("cumsum dtype", lambda x: torch.cumsum(x, 0, dtype=torch.float64), X),
    case("Tensor.cumsum dtype", lambda x: x.cumsum(1, dtype=torch.float64), X),
    case("cumsum 3-d", lambda x: x.cumsum(dim=1), X3),
    case("cumsum 0-d", lambda x: x.cumsum(0), X0),
    case("cumsum non-contiguous", lambda x: x.cumsum(1), non_contiguous(X)),
    case("cumsum used twice", lambda x: x.cumsum(0) * x, X),
]

SOFTMAX = [
    case(f"{name} dim {dim}", (lambda f, d: lambda x: f(x, d))(form, dim), X)
    for name, form in [
        ("torch.softmax", torch.softmax), ("Tensor.softmax", T.softmax), ("F.softmax", F.softmax),
        ("special.softmax", torch.special.softmax), ("torch.log_softmax", torch.log_softmax),
        ("Tensor.log_softmax", T.log_softmax), ("F.log_softmax", F.log_softmax),
        ("special.log_softmax", torch.special.log_softmax),
    ]
    for dim in (0, -1)
] + [
    case("torch.softmax dtype positional", lambda x: torch.softmax(x, 1, torch.float64), X),
    case("Tensor.softmax dtype keyword", lambda x: x.softmax(1, dtype=torch.float64), X),
    case("F.softmax dtype", lambda x: F.softmax(x, dim=1, dtype=torch.float64), X),
    case("F.softmax _stacklevel positional", lambda x: F.softmax(x, 1, 5, torch.float64), X),
    case("F.log_softmax dtype", lambda x: F.log_softmax(x, 0, dtype=torch.float64), X),
    case("special.log_softmax dtype", lambda x: torch.special.log_softmax(x, 1, dtype=torch.float64), X),
    case("softmax 3-d middle dim", lambda x: x.softmax(1), X3),
    case("log_softmax 3-d", lambda x: F.log_softmax(x, dim=-1), X3),
    case("softmax 0-d", lambda x: torch.softmax(x, 0), X0),
    case("log_softmax 0-d", lambda x: x.log_softmax(-1), X0),
    case("softmax large values", lambda x: torch.softmax(x * 50, 1), X),
    case("softmax non-contiguous", lambda x: F.softmax(x, 0), non_contiguous(X)),
    case("log_softmax non-contiguous", lambda x: x.log_softmax(1), non_contiguous(X)),
    case("softmax used twice", lambda x: x.softmax(1) * x.log_softmax(1), X),
    case("softmax numpy name", lambda x: x.softmax(axis=1), X),
    case("softmax input keyword", lambda x: torch.softmax(input=x, dim=1), X),
    case("F.softmin", lambda x: F.softmin(x, 1), X),
    case("F.softmin dtype", lambda x: F.softmin(x, dim=0, dtype=torch.float64), X),
    case("F.softmin 3-d", lambda x: F.softmin(x, -1), X3),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("fn, inputs, gradcheck", SUM_MEAN + PROD)
def test_sum_mean_prod(fn, inputs, gradcheck, dtype):
    run(fn, inputs, gradcheck, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("fn, inputs, gradcheck", MAX_MIN)
def test_max_min(fn, inputs, gradcheck, dtype):
    run(fn, inputs, gradcheck, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("fn, inputs, gradcheck", LOGSUMEXP + VAR_STD + NORMS + CUMSUM)
def test_logsumexp_var_std_norm_cumsum(fn, inputs, gradcheck, dtype):
    run(fn, inputs, gradcheck, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("fn, inputs, gradcheck", SOFTMAX)
def test_softmax_log_softmax(fn, inputs, gradcheck, dtype):
    run(fn, inputs, gradcheck, dtype)


MULTI_DIM = {
    "sum": lambda x, d, k: x.sum(d, keepdim=k),
    "mean": lambda x, d, k: torch.mean(x, d, keepdim=k),
    "amax": lambda x, d, k: x.amax(d, keepdim=k),
    "amin": lambda x, d, k: torch.amin(x, d, k),
    "logsumexp": lambda x, d, k: x.logsumexp(d, keepdim=k),
    "var": lambda x, d, k: x.var(d, correction=0, keepdim=k),
    "std": lambda x, d, k: torch.std(x, d, correction=0, keepdim=k),
    "norm": lambda x, d, k: x.norm(dim=d, keepdim=k),
    "vector_norm 3": lambda x, d, k: torch.linalg.vector_norm(x, 3, d, k),
}
ONE_DIM = {
    "prod": lambda x, d, k: x.prod(d, keepdim=k),
    "max": lambda x, d, k: x.max(d, keepdim=k),
    "min": lambda x, d, k: torch.min(x, d, k).values,
    "cumsum": lambda x, d, k: x.cumsum(d),
    "softmax": lambda x, d, k: x.softmax(d),
    "log_softmax": lambda x, d, k: F.log_softmax(x, d),
}


@st.composite
def shape_and_dims(draw, one_dim):
    shape = draw(st.lists(st.integers(1, 4), min_size=0, max_size=3))
    ndim = max(len(shape), 1)
    if one_dim:
        return shape, draw(st.integers(-ndim, ndim - 1))
    dims = draw(st.lists(st.integers(0, ndim - 1), min_size=1, max_size=ndim, unique=True))
    return shape, tuple(d - ndim if draw(st.booleans()) else d for d in dims) if shape else tuple(dims[:1])


@settings(max_examples=60, deadline=None)
@given(data=st.data(), keepdim=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_random_shapes_and_dims(data, keepdim, seed):
    name = data.draw(st.sampled_from(sorted(MULTI_DIM) + sorted(ONE_DIM)))
    shape, dims = data.draw(shape_and_dims(one_dim=name in ONE_DIM))
    fn = {**MULTI_DIM, **ONE_DIM}[name]
    assume(not (name == "norm" and len(dims) > 2))  # torch itself: the default 'fro' norm takes at most 2 dims
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    check_op(lambda x: fn(x, dims, keepdim), x)


# --------------------------------------------------------------------------------------------- exact behaviour


def leaf(data):
    return tt.tracer(data, requires_grad=True, dtype=torch.float64)


def test_full_max_splits_the_gradient_among_ties():
    x = leaf([1.0, 3.0, 3.0, 3.0, 2.0])
    x.max().backward()
    assert torch.allclose(x.grad, torch.tensor([0, 1, 1, 1, 0], dtype=torch.float64) / 3)


def test_max_along_dim_sends_the_gradient_to_the_returned_index():
    x = leaf([[1.0, 3.0, 3.0], [5.0, 5.0, 0.0]])
    values, indices = torch.max(x, 1)
    values.sum().backward()
    expected = torch.zeros(2, 3, dtype=torch.float64)
    expected[torch.arange(2), indices.as_subclass(torch.Tensor)] = 1
    assert torch.equal(x.grad, expected) and x.grad.sum().item() == 2


def test_max_along_dim_returns_torch_return_types():
    x = leaf(X)
    out = x.max(1)
    assert isinstance(out, torch.return_types.max) and out.values.grad_fn.name == "MaxBackward"
    assert out.indices.dtype == torch.int64 and out.indices.grad_fn is None
    assert isinstance(x.min(0), torch.return_types.min)


def test_binary_max_and_min_halve_the_gradient_on_ties():
    a, b = leaf([1.0, 2.0, 3.0]), leaf([1.0, 3.0, 2.0])
    (torch.max(a, b) + torch.min(a, b)).sum().backward()
    assert a.grad.tolist() == [1.0, 1.0, 1.0] and b.grad.tolist() == [1.0, 1.0, 1.0]
    a.grad = b.grad = None
    torch.max(a, b).sum().backward()
    assert a.grad.tolist() == [0.5, 0.0, 1.0] and b.grad.tolist() == [0.5, 1.0, 0.0]


@pytest.mark.parametrize("data, expected", [
    ([2.0, 0.0, 3.0, 4.0], [0.0, 24.0, 0.0, 0.0]),  # one zero: only it gets the product of the others
    ([2.0, 0.0, 3.0, 0.0], [0.0, 0.0, 0.0, 0.0]),  # two zeros: every partial product contains a zero
    ([2.0, 0.5, 3.0, 4.0], [6.0, 24.0, 4.0, 3.0]),
])
def test_prod_gradient_with_zeros(data, expected):
    x = leaf(data)
    x.prod().backward()
    assert x.grad.tolist() == expected
    assert not torch.isnan(x.grad).any()


def test_norm_gradient_at_zero_is_zero_like_torch():
    for fn in (lambda x: x.norm(), lambda x: torch.linalg.vector_norm(x, 1), lambda x: x.norm(0.5), lambda x: x.std()):
        x = leaf([0.0, 0.0, 0.0])
        fn(x).backward()
        assert x.grad.tolist() == [0.0, 0.0, 0.0]


def test_softmax_rows_have_zero_gradient_for_a_constant_upstream():
    x = leaf(X)
    x.softmax(1).sum().backward()
    assert torch.allclose(x.grad, torch.zeros_like(x.grad), atol=1e-12)


def test_node_names():
    x = leaf(X)
    names = {f.__name__: f(x).grad_fn.name for f in (torch.sum, torch.mean, torch.prod, torch.amax, torch.var,
                                                      torch.std, torch.norm, torch.linalg.vector_norm)}
    assert names["sum"] == "SumBackward" and names["mean"] == "MeanBackward" and names["std"] == "StdBackward"
    assert names["norm"] == "NormBackward" and names["linalg_vector_norm"] == "VectorNormBackward"
    assert F.log_softmax(x, 1).grad_fn.name == "LogSoftmaxBackward" and x.cumsum(0).grad_fn.name == "CumsumBackward"


ALIASES = [
    torch.sum, T.sum, torch.mean, T.mean, torch.prod, T.prod, torch.max, T.max, torch.min, T.min,
    torch.amax, T.amax, torch.amin, T.amin, torch.logsumexp, T.logsumexp, torch.special.logsumexp,
    torch.var, T.var, torch.std, T.std, torch.norm, T.norm, torch.linalg.vector_norm, torch.cumsum, T.cumsum,
    torch.softmax, T.softmax, F.softmax, torch.special.softmax,
    torch.log_softmax, T.log_softmax, F.log_softmax, torch.special.log_softmax, F.softmin,
]


def test_every_alias_is_registered():
    registered = set(tt.supported_ops())
    missing = [getattr(f, "__qualname__", repr(f)) for f in ALIASES if f not in registered]
    assert not missing


@pytest.mark.parametrize("dim, ndim, expected", [
    (None, 3, (0, 1, 2)), ((), 2, (0, 1)), (-1, 3, (2,)), ((2, -3), 3, (0, 2)), ([1], 2, (1,)), (0, 0, ()), (-1, 0, ()),
])
def test_reduced_dims(dim, ndim, expected):
    assert reduced_dims(dim, ndim) == expected


def test_expand_reduced_restores_dropped_dims():
    g = torch.arange(3.0)
    assert expand_reduced(g, torch.Size([2, 3, 4]), (0, -1), False).shape == (2, 3, 4)
    assert torch.equal(expand_reduced(g, torch.Size([2, 3, 4]), (0, 2), False)[1, :, 3], g)
    assert expand_reduced(torch.tensor(2.0), torch.Size([]), 0, False).shape == ()


# ---------------------------------------------------------------------------------------------------- errors


def test_out_argument_is_refused():
    with pytest.raises(RuntimeError, match="out="):
        torch.linalg.vector_norm(leaf(X), out=torch.empty((), dtype=torch.float64))


def test_softmax_without_dim_warns_and_picks_torchs_dim():
    for data in (X, X3):
        x = leaf(data)
        with pytest.warns(UserWarning, match="Implicit dimension"):
            y = F.softmax(x)
        with pytest.warns(UserWarning, match="Implicit dimension"):
            expected = F.softmax(data.double())
        assert torch.allclose(y.as_subclass(torch.Tensor), expected)
        with pytest.warns(UserWarning, match="Implicit dimension"):
            check_op(lambda x: F.log_softmax(x), data)


def test_torch_norm_on_a_tracer_that_needs_no_gradient():
    x = tt.tracer(X)
    assert torch.allclose(torch.norm(x).as_subclass(torch.Tensor), torch.norm(X))


# ------------------------------------------------------------------------------------------- double backward

DOUBLE = {
    "sum": lambda x: x * x.sum(-1, keepdim=True),
    "sum squared": lambda x: x.sum(0) ** 2,
    "mean": lambda x: x.mean(1) ** 2,
    "mean keepdim": lambda x: x * x.mean((0, 1), keepdim=True),
    "softmax": lambda x: torch.softmax(x, -1),
    "F.softmax dim 0": lambda x: F.softmax(x, 0),
    "log_softmax": lambda x: x.log_softmax(1),
    "softmin": lambda x: F.softmin(x, 1),
    "F.log_softmax dim 0": lambda x: F.log_softmax(x, dim=0),
    "logsumexp": lambda x: torch.logsumexp(x, 1),
    "logsumexp keepdim": lambda x: x.logsumexp(0, keepdim=True),
    "softmax by hand": lambda x: x.exp() / x.exp().sum(-1, keepdim=True),
    "prod": lambda x: x.prod(1),
    "prod all": lambda x: x.prod(),
    "var": lambda x: x.var(1),
    "std": lambda x: x.std(0, correction=0),
    "norm": lambda x: x.norm(dim=1),
    "norm p=3": lambda x: torch.linalg.vector_norm(x, 3),
    "cumsum": lambda x: x.cumsum(1) ** 2,
    "amax": lambda x: x.amax(1) ** 2,
    "max dim": lambda x: x.max(0).values ** 2,
}


@pytest.mark.parametrize("fn", DOUBLE.values(), ids=DOUBLE.keys())
def test_double_backward(fn):
    double_backward_matches(fn, X.double())


@pytest.mark.parametrize("data", [ZEROS[:2], ZEROS, torch.tensor([[0.0, 2.0, 0.0], [0.0, 0.0, 0.0]])],
                         ids=["at most one zero per row", "two zeros in a row", "all zeros"])
@pytest.mark.parametrize("dim", [None, 0, 1])
def test_prod_double_backward_with_zeros(data, dim):
    double_backward_matches(lambda x: x.prod() if dim is None else x.prod(dim), data.double())


NAN = math.nan
NANS = torch.tensor([[1.0, NAN, 3.0, 0.5], [2.0, 5.0, 5.0, -1.0], [NAN, NAN, NAN, NAN]])
EDGES = torch.tensor([[1.0, NAN, 3.0], [2.0, 5.0, 5.0], [INF, 1.0, -INF], [-INF, -INF, 0.0]])
ONE_ROW_ZERO = torch.tensor([[1.0, NAN, 3.0], [INF, 2.0, -1.0], [0.0, 2.0, 4.0]])  # torch's prod formula: a zero


def edge(name, fn, x):
    return case(name, fn, x, gradcheck=False)


NAN_REDUCTIONS = [
    case("torch.nansum", torch.nansum, X),
    case("Tensor.nansum dim keepdim", lambda x: x.nansum(1, keepdim=True), X),
    case("nansum tuple dims dtype", lambda x: torch.nansum(x, (0, -1), dtype=torch.float64), X3),
    edge("nansum NaN", lambda x: x.nansum(-1), NANS),
    edge("nansum all NaN", torch.nansum, NANS),
    case("nansum 0-d", torch.nansum, X0),
    case("nansum empty", lambda x: x.nansum(1), torch.zeros(2, 0)),
    case("torch.nanmean", torch.nanmean, X),
    case("Tensor.nanmean dim", lambda x: x.nanmean(dim=0, keepdim=True), X),
    edge("nanmean NaN, all-NaN row", lambda x: x.nanmean(1), NANS),
    edge("nanmean NaN all", T.nanmean, NANS),
    case("nanmean 0-d", lambda x: x.nanmean(-1), X0),
    case("torch.var_mean", lambda x: torch.var_mean(x)[0] + 2 * torch.var_mean(x)[1], X),
    case("var_mean dim unbiased keepdim", lambda x: torch.var_mean(x, 1, False, True)[0] * 3, X),
    case("var_mean unbiased only", lambda x: torch.var_mean(x, False)[1] * torch.var_mean(x, False)[0], X),
    case("var_mean correction keywords", lambda x: sum(torch.var_mean(x, dim=(0, 2), correction=2)), X3),
    case("var_mean mean only", lambda x: torch.var_mean(x, -1)[1], X),
    edge("var_mean 1 element", lambda x: sum(torch.var_mean(x)), torch.tensor([2.0])),
    case("torch.std_mean", lambda x: torch.std_mean(x)[0] + 2 * torch.std_mean(x)[1], X),
    case("std_mean dim correction 0", lambda x: sum(torch.std_mean(x, -2, correction=0, keepdim=True)), X),
    edge("std_mean constant rows", lambda x: torch.std_mean(x, 1)[0], torch.ones(2, 3)),
    edge("var all dims, 0-d NaN (torch: inf)", torch.var, torch.tensor(NAN)),
    edge("var correction > N (torch: NaN at the mean)", lambda x: torch.var(x, correction=2), torch.tensor([2.0])),
    edge("var dim, N = correction", lambda x: x.var(0), torch.tensor([[2.0, 3.0]])),
    edge("std all dims N = correction", torch.std, torch.tensor([2.0])),
    case("torch.aminmax", lambda x: torch.aminmax(x)[0] - 2 * torch.aminmax(x).max, X),
    case("Tensor.aminmax dim keepdim", lambda x: sum(x.aminmax(dim=-1, keepdim=True)), X3),
    edge("aminmax ties", lambda x: torch.aminmax(x, dim=1).min + 3 * torch.aminmax(x, dim=1).max, TIES),
    edge("aminmax NaN (torch: NaN)", lambda x: sum(torch.aminmax(x, dim=1)), NANS),
    case("aminmax 0-d", lambda x: sum(torch.aminmax(x)), X0),
]

REDUCTION_EDGES = [
    edge("amax NaN slice gives NaN", lambda x: x.amax(1), EDGES),
    edge("amax all with NaN", torch.amax, EDGES),
    edge("amax () with NaN", lambda x: x.amax(()), EDGES),
    edge("amin NaN keepdim", lambda x: x.amin(-1, keepdim=True), EDGES),
    edge("amax 0-d NaN", torch.amax, torch.tensor(NAN)),
    edge("max all with NaN: g to the NaN", torch.max, EDGES),
    edge("max dim with NaN: g at the NaN index", lambda x: x.max(1).values, EDGES),
    edge("min dim with NaN", lambda x: torch.min(x, 0, keepdim=True).values, EDGES),
    edge("prod NaN/inf, a zero elsewhere", lambda x: x.prod(1), EDGES),
    edge("prod NaN/inf, no zero", lambda x: x.prod(1), EDGES[:3]),
    edge("prod NaN/inf, zero in another row", lambda x: x.prod(-1, keepdim=True), ONE_ROW_ZERO),
    edge("prod all 0-d NaN", torch.prod, torch.tensor(NAN)),
    edge("prod all two zeros and inf (torch: 0)", torch.prod, torch.tensor([0.0, INF, 0.0])),
    edge("prod all one zero and inf", torch.prod, torch.tensor([0.0, INF, 2.0])),
    edge("logsumexp NaN/inf", lambda x: x.logsumexp(1), EDGES),
    edge("logsumexp all", lambda x: x.logsumexp((0, 1)), EDGES),
    edge("var/std NaN/inf", lambda x: x.var(1) + x.std(1), EDGES),
    edge("norms NaN/inf", lambda x: sum(torch.linalg.vector_norm(x, p, 1) for p in (1, 2, 3, 0.5, INF, -INF)), EDGES),
    edge("softmax NaN/inf", lambda x: x.softmax(1) * torch.arange(1.0, 4.0), EDGES),
    edge("log_softmax NaN/inf", lambda x: F.log_softmax(x, 0) * torch.arange(1.0, 4.0), EDGES),
    edge("cumsum NaN/inf", lambda x: x.cumsum(1), EDGES),
    edge("softmax/log_softmax/logsumexp rows of -inf, inf", lambda x: x.softmax(1) + x.log_softmax(-1)
         + x.logsumexp(1, keepdim=True), torch.tensor([[-INF, -INF], [INF, INF], [INF, -INF], [0.0, -INF]])),
    edge("maximum/minimum NaN and ties", lambda x: torch.maximum(x, x.flip(0)) + 2 * torch.minimum(x, x.flip(1)),
         EDGES),
    case("amax/var/logsumexp negative tuple dims keepdim", lambda x: x.amax((-1, 0), True)
         + x.var((-1, 0), keepdim=True) + x.logsumexp([0, -1], True), X3),
    edge("sum/mean/prod empty", lambda x: x.sum(1) + x.mean(0).sum() + x.prod(1), torch.zeros(2, 0)),
]


@pytest.mark.filterwarnings("ignore:.*degrees of freedom is <= 0")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("fn, inputs, gradcheck", NAN_REDUCTIONS + REDUCTION_EDGES)
def test_nan_reductions_var_mean_aminmax_and_edges(fn, inputs, gradcheck, dtype):
    run(fn, inputs, gradcheck, dtype)


@pytest.mark.parametrize("fn", [
    lambda x: torch.nansum(x, 1) ** 2, lambda x: x.nanmean(0) ** 2, lambda x: sum(torch.var_mean(x, 1)) ** 2,
    lambda x: torch.std_mean(x, 0)[0] * torch.std_mean(x, 0)[1], lambda x: torch.aminmax(x, dim=1).max ** 2,
])
def test_double_backward_nan_reductions_var_mean(fn):
    double_backward_matches(fn, X.double())


@pytest.mark.parametrize("fn, same", [
    (lambda x: x.var(()), torch.var), (lambda x: x.std([]), torch.std),
    (lambda x: sum(torch.var_mean(x, ())), lambda x: sum(torch.var_mean(x))),
    (lambda x: sum(torch.std_mean(x, dim=[], correction=0)), lambda x: sum(torch.std_mean(x, correction=0))),
])
def test_var_std_over_empty_dims_is_the_full_reduction(fn, same):
    """torch's var_backward treats dim=() as one element per output (gradient +-inf) although the forward reduces
    every dim; the gradient here is the full reduction's, which torch autograd gives for dim=None."""
    x = X.double().clone().requires_grad_()
    same(x).backward()
    ours = tt.tracer(X.double().clone(), requires_grad=True)
    fn(ours).backward()
    torch.testing.assert_close(ours.grad.as_subclass(torch.Tensor), x.grad)
    assert tt.gradcheck(fn, X.double())


@pytest.mark.parametrize("fn", [
    lambda x: torch.linalg.vector_norm(x, 0),
    lambda x: torch.linalg.vector_norm(x.reshape(2, 3), 0, dim=1).sum(),
    lambda x: torch.norm(x, 0),
    lambda x: x.norm(p=0),
    lambda x: torch.linalg.norm(x, 0),
    lambda x: F.pairwise_distance(x.reshape(2, 3), torch.ones(2, 3), p=0.0).sum(),
], ids=["vector_norm", "vector_norm dim", "torch.norm", "Tensor.norm", "linalg.norm", "pairwise_distance"])
def test_p0_norm_sends_no_gradient_as_torch(fn):
    """||x||_0 counts the nonzero elements: flat (finite differences: 0); torch's backward sends nothing, so .grad
    stays None, and with another term it is that term's gradient alone."""
    values = torch.tensor([0.0, 1.5, -2.0, 0.0, 3.0, -0.5], dtype=torch.float64)
    assert tt.gradcheck(fn, values.clone())
    for extra in (False, True):
        theirs, ours = values.clone().requires_grad_(True), tt.tracer(values.clone(), requires_grad=True)
        for x in (theirs, ours):
            (fn(x) + (x * x).sum() if extra else fn(x)).backward()
        assert (theirs.grad is None) == (ours.grad is None) == (not extra)
        if extra:
            torch.testing.assert_close(ours.grad.as_subclass(torch.Tensor), theirs.grad)


@pytest.mark.filterwarnings("ignore:var_mean|std_mean")
@pytest.mark.parametrize("op", [torch.var_mean, torch.std_mean])
def test_the_mean_of_var_mean_with_no_degree_of_freedom_left_keeps_its_gradient(op):
    """One element per output and correction 1: var / std is NaN and so is its gradient, but a loss of the mean alone
    has the mean's gradient (torch leaves the unused output out; torchtrace's 0 * inf made it NaN), in reverse mode,
    forward mode and compiled."""
    x = torch.tensor([[1.0], [2.0], [4.0]], dtype=torch.float64)
    loss = lambda x: (op(x, 1)[1] ** 2).sum()  # noqa: E731
    ref = x.clone().requires_grad_()
    loss(ref).backward()
    torch.testing.assert_close(ref.grad, 2 * x)  # d/dx x^2 (the mean of one element is the element)
    ours = tt.as_tracer(x.clone(), requires_grad=True)
    loss(ours).backward()
    torch.testing.assert_close(ours.grad.as_subclass(torch.Tensor), ref.grad)
    compiled = tt.compile(loss, (ours,))
    for _ in range(3):  # recorded, then replayed
        ours.grad = None
        compiled(ours).backward()
        torch.testing.assert_close(ours.grad.as_subclass(torch.Tensor), ref.grad)
    tangent = torch.ones_like(x)
    expected = torch.func.jvp(lambda x: op(x, 1), (x,), (tangent,))[1]
    torch.testing.assert_close(tt.jvp(lambda x: op(x, 1), (x,), (tangent,))[1], expected, equal_nan=True)


@pytest.mark.parametrize("spelling", ["vector_norm", "Tensor.norm"])
@pytest.mark.parametrize("p", [1, 3, float("inf"), 0.5, 2])
def test_a_complex_vector_norms_gradient_is_torchs_and_finite_differences(p, spelling):
    """d||z||_p / dz = sgn(z) |z|^(p-1) / ||z||^(p-1) (torch's convention for a real function of a complex z: the
    derivative along the real part plus i times along the imaginary part). It used sign(z), which torch refuses for
    complex numbers: every order but 2 raised torch's message about torch.sign, an op the user never called."""
    z0 = torch.tensor([1 + 2j, -3 + 0.5j, 0.25 - 1j], dtype=torch.complex128)

    def norm(z):
        return torch.linalg.vector_norm(z, ord=p) if spelling == "vector_norm" else z.norm(p=p)

    ours = tt.tracer(z0.clone(), requires_grad=True)
    norm(ours).backward()
    theirs = z0.clone().requires_grad_()
    norm(theirs).backward()
    torch.testing.assert_close(ours.grad.as_subclass(torch.Tensor), theirs.grad)
    eps, finite = 1e-6, torch.zeros_like(z0)
    for i in range(len(z0)):
        for direction in (1, 1j):
            step = torch.zeros_like(z0)
            step[i] = eps * direction
            slope = (norm(z0 + step) - norm(z0 - step)) / (2 * eps)
            finite[i] += slope * direction
    torch.testing.assert_close(ours.grad.as_subclass(torch.Tensor), finite, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("p", ["x", "inf", "max"])
def test_torch_norm_of_an_order_torch_does_not_know_raises_torchs_error(p):
    """An order torch.norm does not take is torch's RuntimeError, word for word, on a tracer that needs a gradient
    (it was torchtrace's own 'no gradient rule' before torch could say what is wrong)."""
    x = torch.rand(3, 4)
    with pytest.raises(RuntimeError) as theirs:
        x.clone().requires_grad_().norm(p=p)
    with pytest.raises(RuntimeError) as ours:
        tt.tracer(x, requires_grad=True).norm(p=p)
    assert str(ours.value) == str(theirs.value)
