"""Gradient rules of torchtrace/ops/scans.py (cumprod, cummax, cummin, logcumsumexp) against torch autograd."""
import math

import pytest
import torch
from helpers import check_op, double_backward_matches, non_contiguous

import torchtrace as tt

T = torch.Tensor
INF, NAN = math.inf, math.nan
gen = torch.Generator().manual_seed(0)
X = torch.randn(3, 5, generator=gen)
X0 = torch.tensor(0.8)
X3 = torch.randn(2, 3, 4, generator=gen)
ZEROS = torch.tensor([[1.5, 0.0, -2.0, 0.5, 3.0], [0.7, 1.2, -0.8, 2.0, 0.0], [0.0, 2.0, 0.0, -1.0, 0.5],
                      [0.0, 0.0, 0.0, 0.0, 0.0]])  # rows: one zero, one zero last, two zeros, all zeros
TIES = torch.tensor([[1.0, 3.0, 3.0, 0.5, 3.0], [2.0, 2.0, -1.0, 2.0, 4.0]])
EDGES = torch.tensor([[1.0, -INF, 2.0, INF, 0.0], [-INF, -INF, 0.5, 1.0, NAN]])


def case(name, fn, *inputs, gradcheck=True):
    return pytest.param(fn, inputs, gradcheck, id=name)


CASES = [
    case("torch.cumprod", lambda x: torch.cumprod(x, 1), X),
    case("Tensor.cumprod negative dim", lambda x: x.cumprod(-2), X3),
    case("cumprod dtype keyword", lambda x: x.cumprod(dim=0, dtype=torch.float64), X),
    case("cumprod one zero, two zeros, all zeros", lambda x: x.cumprod(1) * torch.arange(1.0, 6.0), ZEROS),
    case("cumprod zeros along dim 0", lambda x: x.cumprod(0), ZEROS),
    case("cumprod 0-d", lambda x: x.cumprod(0), X0),
    case("cumprod size-1 dim", lambda x: x.cumprod(1), torch.zeros(3, 1)),
    case("cumprod empty", lambda x: x.cumprod(1), torch.zeros(2, 0)),
    case("cumprod non-contiguous", lambda x: x.cumprod(0), non_contiguous(X)),
    case("cumprod used twice", lambda x: x.cumprod(1) * x, X),
    case("in-place cumprod_", lambda x: (x * 1).cumprod_(1), ZEROS),
    case("torch.cummax", lambda x: torch.cummax(x, 1).values, X),
    case("Tensor.cummax ties", lambda x: x.cummax(dim=1)[0] * torch.arange(1.0, 6.0), TIES, gradcheck=False),
    case("cummax inf NaN", lambda x: x.cummax(1).values, EDGES, gradcheck=False),
    case("cummin", lambda x: torch.cummin(x, -1).values, X3),
    case("cummin ties", lambda x: x.cummin(0).values * torch.arange(1.0, 6.0), TIES, gradcheck=False),
    case("cummin inf NaN", lambda x: x.cummin(1).values, EDGES, gradcheck=False),
    case("cummax 0-d", lambda x: x.cummax(0).values, X0),
    case("torch.logcumsumexp", lambda x: torch.logcumsumexp(x, 1), X),
    case("Tensor.logcumsumexp dim 0", lambda x: x.logcumsumexp(dim=0) * torch.arange(1.0, 6.0), X),
    case("logcumsumexp mixed-sign grads", lambda x: x.logcumsumexp(-1) * torch.tensor([1.0, -2.0, 0.0, 3.0]), X3),
    case("logcumsumexp large values", lambda x: x.logcumsumexp(1), X * 300),
    case("logcumsumexp -inf/inf/NaN", lambda x: x.logcumsumexp(1), EDGES, gradcheck=False),
    case("logcumsumexp 0-d", lambda x: x.logcumsumexp(0), X0),
    case("logcumsumexp empty", lambda x: x.logcumsumexp(0), torch.zeros(0, 3)),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("fn, inputs, gradcheck", CASES)
def test_scans(fn, inputs, gradcheck, dtype):
    tolerance = {"rtol": 1e-4, "atol": 1e-5} if dtype == torch.float32 else {}
    check_op(fn, *[x.to(dtype) for x in inputs], gradcheck=gradcheck, **tolerance)


def test_cummax_indices_carry_no_gradient():
    values, indices = tt.tracer(X.clone(), requires_grad=True).cummax(1)
    assert values.requires_grad and not indices.requires_grad


@pytest.mark.parametrize("fn, x", [
    (lambda x: x.cumprod(1), X), (lambda x: x.cumprod(1), ZEROS), (lambda x: x.cumprod(0), ZEROS),
    (lambda x: x.cummax(1).values ** 2, X), (lambda x: x.logcumsumexp(1), X),
])
def test_double_backward(fn, x):
    double_backward_matches(fn, x.double())



@pytest.mark.parametrize("values", [
    [NAN, 0.0, 3.0], [1.0, 0.0, NAN], [0.0, NAN, 2.0], [NAN, 0.0, 0.0], [2.0, 0.0, NAN, 0.0],
    [2.0, 0.0, 3.0, 0.0, NAN], [INF, 0.0, 2.0], [3.0, 0.0, INF, 2.0], [NAN, 2.0, 3.0],
], ids=str)
@pytest.mark.parametrize("create_graph", [False, True])
def test_cumprod_over_nan_and_inf_selects_terms_as_torch(values, create_graph):
    """cumprod of [1, 0, nan]: torch gets [g_0, nan, 0], never multiplying a NaN past the zero by 0."""
    g = torch.tensor([-0.5, 0.5, 1.5, -0.5, 2.0][:len(values)], dtype=torch.float64)
    theirs = torch.tensor(values, dtype=torch.float64, requires_grad=True)
    (expected,) = torch.autograd.grad(torch.cumprod(theirs, 0), theirs, g, create_graph=create_graph)
    ours = tt.tracer(values, dtype=torch.float64, requires_grad=True)
    (got,) = tt.grad(torch.cumprod(ours, 0), ours, g, create_graph=create_graph)
    torch.testing.assert_close(got.detach().as_subclass(torch.Tensor), expected.detach(), equal_nan=True)


def test_cumprod_second_derivative_over_zeros_and_nan_as_torch():
    """create_graph takes torch's own O(n^2) form of cumprod's backward (a product of the elements before k times the
    running products after it, column by column), so a second derivative meets zeros and NaNs where torch's does."""
    values = torch.tensor([[-0.0, 0.0, -2.0], [-2.0, 0.0, NAN], [NAN, -1.5, -1.5], [-1.5, NAN, 0.25]],
                          dtype=torch.float64)
    g = torch.linspace(-1.0, 1.0, 12, dtype=torch.float64).reshape(4, 3)

    def second(x, grad):
        (first,) = grad(torch.cumprod(x, 0), x, g, create_graph=True)
        return grad((first * first).sum(), x)[0]

    expected = second(values.clone().requires_grad_(True), torch.autograd.grad)
    got = second(tt.tracer(values, requires_grad=True), tt.grad)
    torch.testing.assert_close(got, expected, equal_nan=True)


def test_cumprod_second_derivative_at_zeros_matches_finite_differences():
    """d/dx of sum((dL/dx)^2), L = sum(g cumprod(x)), at an x holding zeros: central differences of the first
    derivative (computed by torchtrace) agree with torchtrace's second derivative."""
    x0 = torch.tensor([1.5, 0.0, -2.0, 0.0, 0.5], dtype=torch.float64)
    g = torch.tensor([0.5, -1.0, 2.0, 0.25, -0.75], dtype=torch.float64)

    def energy(x):
        (first,) = tt.grad(torch.cumprod(x, 0), x, g, create_graph=True)
        return (first * first).sum()

    x = tt.tracer(x0, requires_grad=True)
    (got,) = tt.grad(energy(x), x)
    eps = 1e-6
    numeric = torch.stack([(energy(tt.tracer(x0 + eps * e, requires_grad=True)).detach()
                            - energy(tt.tracer(x0 - eps * e, requires_grad=True)).detach()) / (2 * eps)
                           for e in torch.eye(5, dtype=torch.float64)])
    torch.testing.assert_close(got, numeric.as_subclass(torch.Tensor), atol=1e-6, rtol=1e-6)
