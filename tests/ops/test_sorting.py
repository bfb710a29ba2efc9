"""Gradient rules of torchtrace/ops/sorting.py (order statistics) against torch autograd and finite differences."""
import math

import pytest
import torch
from helpers import check_op, double_backward_matches, non_contiguous

import torchtrace as tt
from torchtrace.errors import UnsupportedOperationError

T = torch.Tensor
NAN = math.nan
gen = torch.Generator().manual_seed(0)
X = torch.randn(3, 5, generator=gen)  # distinct values
X0 = torch.tensor(0.3)
X3 = torch.randn(2, 3, 4, generator=gen)
TIES = torch.tensor([[2.0, 1.0, 2.0, 2.0, 1.0], [0.5, 0.5, 0.5, 3.0, -1.0], [4.0, 4.0, 1.0, 1.0, 0.0]])
NANS = torch.tensor([[1.0, NAN, 3.0, 0.5, 2.0], [2.0, 5.0, 5.0, -1.0, 0.0], [NAN, NAN, NAN, NAN, NAN]])
Q = torch.tensor([0.0, 0.3, 0.5, 0.75, 1.0])


def case(name, fn, *inputs, gradcheck=True):
    return pytest.param(fn, inputs, gradcheck, id=name)


CASES = [
    case("torch.sort", lambda x: torch.sort(x).values, X),
    case("Tensor.sort dim descending", lambda x: x.sort(0, True)[0], X),
    case("sort keywords stable", lambda x: torch.sort(x, stable=True, dim=-2, descending=True).values, X),
    case("sort ties stable", lambda x: x.sort(stable=True).values * torch.arange(5.0), TIES, gradcheck=False),
    case("sort 0-d", lambda x: x.sort().values, X0),
    case("sort empty", lambda x: x.sort(1).values, torch.zeros(2, 0)),
    case("sort non-contiguous 3-d", lambda x: x.sort(1).values, non_contiguous(X3)),
    case("sort used twice", lambda x: x.sort().values * x, X),
    case("argsort gather", lambda x: x.gather(1, x.argsort(1)), X),
    case("torch.msort", torch.msort, X),
    case("Tensor.msort", T.msort, X3),
    case("torch.topk", lambda x: torch.topk(x, 2).values, X),
    case("topk keywords", lambda x: x.topk(k=2, dim=0, largest=False, sorted=False).values, X),
    case("topk ties", lambda x: x.topk(2).values * torch.tensor([1.0, 2.0]), TIES, gradcheck=False),
    case("topk k=0", lambda x: x.topk(0).values, X),
    case("topk 0-d", lambda x: x.topk(1).values, X0),
    case("torch.kthvalue", lambda x: torch.kthvalue(x, 2).values, X),
    case("kthvalue keepdim negative dim", lambda x: x.kthvalue(2, -2, keepdim=True)[0], X3),
    case("kthvalue ties", lambda x: x.kthvalue(3).values * torch.arange(1.0, 4.0), TIES, gradcheck=False),
    case("kthvalue 0-d", lambda x: x.kthvalue(1).values, X0),
    case("torch.median all", torch.median, X),
    case("median all ties (split evenly)", T.median, TIES, gradcheck=False),
    case("median all NaN", torch.median, NANS, gradcheck=False),
    case("median dim", lambda x: torch.median(x, 1).values, X),
    case("median dim keepdim keywords", lambda x: x.median(dim=0, keepdim=True).values, X),
    case("median dim ties", lambda x: x.median(1).values * torch.arange(1.0, 4.0), TIES, gradcheck=False),
    case("median dim NaN", lambda x: x.median(1).values, NANS, gradcheck=False),
    case("median 0-d", lambda x: x.median(0).values, X0),
    case("nanmedian all", torch.nanmedian, NANS, gradcheck=False),
    case("nanmedian all NaN", torch.nanmedian, torch.full((3,), NAN), gradcheck=False),
    case("nanmedian dim", lambda x: x.nanmedian(1).values, NANS, gradcheck=False),
    case("nanmedian ties", T.nanmedian, TIES, gradcheck=False),
    case("nanmedian dim plain", lambda x: torch.nanmedian(x, -1, True)[0], X),
    case("torch.mode", lambda x: torch.mode(x).values, TIES, gradcheck=False),
    case("mode keywords", lambda x: x.mode(dim=0, keepdim=True).values, TIES, gradcheck=False),
    case("mode distinct", lambda x: x.mode(1).values, X),
]

QUANTILE = [
    case(f"{name} {mode} {label}", fn, x, gradcheck=ok)
    for mode in ("linear", "lower", "higher", "midpoint", "nearest")
    for name, op in (("quantile", torch.quantile), ("nanquantile", torch.nanquantile))
    for label, fn, x, ok in (
        ("q float dim None", lambda x, op=op, mode=mode: op(x, 0.3, interpolation=mode), X, True),
        ("q tensor dim", lambda x, op=op, mode=mode: op(x, Q.to(x.dtype), 1, interpolation=mode), X, True),
        ("q 0-d keepdim", lambda x, op=op, mode=mode: op(x, torch.tensor(0.4, dtype=x.dtype), -1, True,
                                                          interpolation=mode), X3, True),
        ("dim None keepdim", lambda x, op=op, mode=mode: op(x, Q.to(x.dtype), None, True, interpolation=mode), X, True),
        ("ties", lambda x, op=op, mode=mode: op(x, Q.to(x.dtype), 1, interpolation=mode), TIES, False),
        ("NaN", lambda x, op=op, mode=mode: op(x, Q.to(x.dtype), 1, interpolation=mode), NANS, False),
        ("0-d", lambda x, op=op, mode=mode: op(x, 0.5, 0, interpolation=mode), X0, True),
    )
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("fn, inputs, gradcheck", CASES + QUANTILE)
def test_order_statistics(fn, inputs, gradcheck, dtype):
    check_op(fn, *[x.to(dtype) for x in inputs], gradcheck=gradcheck)


def test_tensor_quantile_method():
    check_op(lambda x: x.quantile(Q.double(), dim=0), X.double())
    check_op(lambda x: x.nanquantile(0.25, 1, keepdim=True, interpolation="midpoint"), NANS.double(), gradcheck=False)


@pytest.mark.parametrize("mode", ["linear", "nearest", "midpoint"])
def test_quantile_gradient_to_q(mode):
    q = torch.tensor([0.1, 0.6, 0.9], dtype=torch.float64)
    check_op(lambda x, q: torch.quantile(x, q, 1, interpolation=mode), X.double(), q)


def test_named_tuple_outputs():
    x = tt.tracer(X.clone(), requires_grad=True)
    values, indices = x.sort(1)
    assert not indices.is_floating_point()
    out = torch.topk(x, 2)
    (out.values.sum() + values[:, 0].sum()).backward()
    expected = X.clone().requires_grad_()
    (torch.topk(expected, 2).values.sum() + expected.sort(1).values[:, 0].sum()).backward()
    torch.testing.assert_close(x.grad.as_subclass(torch.Tensor), expected.grad)


def test_quantile_out_refused():
    with pytest.raises(UnsupportedOperationError, match=r"torch.quantile: out= cannot be recorded .* — assign"):
        torch.quantile(tt.tracer(X.clone(), requires_grad=True), 0.5, out=torch.empty(()))


@pytest.mark.parametrize("fn", [
    lambda x: x.sort(1).values ** 2, lambda x: x.topk(2).values ** 2, lambda x: x.median() ** 2,
    lambda x: x.kthvalue(2).values ** 2, lambda x: torch.quantile(x, Q.double(), 1) ** 2,
])
def test_double_backward(fn):
    double_backward_matches(fn, X.double())


@pytest.mark.parametrize("mode", ["linear", "lower", "higher", "nearest", "midpoint"])
@pytest.mark.parametrize("dim", [0, None])
def test_quantile_ties_follow_torchs_sort(mode, dim):
    x = torch.tensor([[1.0, 2.0], [1.0, 2.0], [3.0, 2.0], [1.0, 0.0]]).repeat(5, 1)
    check_op(lambda x: torch.quantile(x, torch.tensor([0.1, 0.33, 0.5, 0.8]), dim, interpolation=mode), x,
             gradcheck=False)
    check_op(lambda x: torch.nanquantile(x, 0.4, dim, interpolation=mode), x.where(x != 3, math.nan),
             gradcheck=False)
