"""Gradient rules of torchtrace/ops/differences.py: diff, gradient, trapezoid / trapz, cumulative_trapezoid, cross."""
import warnings

import pytest
import torch
from helpers import assert_every_rule_exercised, check_case, check_case_double_backward, check_op
from hypothesis import given, settings
from hypothesis import strategies as st

import torchtrace as tt

T = torch.Tensor
DTYPES = [torch.float64, torch.float32]


def coords(*values):
    return torch.tensor(values, dtype=torch.float64)


CASES = {
    # diff
    "torch.diff": (lambda x: torch.diff(x), [(3, 4)]),
    "Tensor.diff n=2 dim=0": (lambda x: x.diff(n=2, dim=0), [(4, 3)]),
    "torch.diff prepend append": (lambda x, p, a: torch.diff(x, 2, -1, p, a), [(3, 4), (3, 2), (3, 1)]),
    "torch.diff prepend keyword": (lambda x, p: torch.diff(x, prepend=p), [(3, 4), (3, 2)]),
    "Tensor.diff append keyword, dim 0": (lambda x, a: x.diff(dim=0, append=a), [(2, 3), (1, 3)]),
    "torch.diff n=0 ignores prepend": (lambda x, p: torch.diff(x, 0, 0, p) * x, [(2, 3), (1, 3)]),
    "torch.diff n as long as the input": (lambda x: torch.diff(x, n=4) + 0, [(3, 4)]),
    "torch.diff n longer than input and prepend": (lambda x, p: torch.diff(x, n=5, prepend=p) + 0, [(2, 2), (2, 1)]),
    "torch.diff 1-D": (lambda x: torch.diff(x, 3), [(5,)]),
    # gradient
    "torch.gradient": (lambda x: torch.gradient(x), [(3, 4)]),
    "torch.gradient 1-D": (lambda x: torch.gradient(x)[0] * x, [(4,)]),
    "torch.gradient spacing dim edge_order=2": (lambda x: torch.gradient(x, spacing=2.0, dim=1, edge_order=2),
                                                [(3, 4)]),
    "torch.gradient spacing list": (lambda x: torch.gradient(x, spacing=[2.0, 0.5], edge_order=2), [(3, 4)]),
    "torch.gradient negative dims": (lambda x: torch.gradient(x, dim=[-1, 0]), [(3, 2, 4)]),
    "torch.gradient coordinates": (lambda x: torch.gradient(x, spacing=(coords(0, 1, 3, 4.5),), dim=-1, edge_order=2),
                                   [(3, 4)]),
    "torch.gradient coordinates per dim": (lambda x: torch.gradient(x, spacing=(coords(0, 1, 3), coords(0, 1, 3, 4.5))),
                                           [(3, 4)]),
    # trapezoid rule
    "torch.trapezoid": (lambda y: torch.trapezoid(y), [(3, 4)]),
    "torch.trapezoid dx dim": (lambda y: torch.trapezoid(y, dx=0.5, dim=0), [(3, 4)]),
    "torch.trapezoid 1-D x": (lambda y, x: torch.trapezoid(y, x), [(3, 4), (4,)]),
    "torch.trapezoid 1-D x along dim 0": (lambda y, x: torch.trapezoid(y, x, dim=0), [(3, 4), (3,)]),
    "torch.trapezoid x keyword, same shape": (lambda y, x: torch.trapezoid(y, x=x, dim=0), [(3, 4), (3, 4)]),
    "torch.trapezoid x broadcast": (lambda y, x: torch.trapezoid(y, x), [(3, 4), (1, 4)]),
    "torch.trapezoid one sample": (lambda y: torch.trapezoid(y) + y.sum(-1), [(3, 1)]),
    "torch.trapezoid no samples": (lambda y: torch.trapezoid(y) + 1, [(3, 0)]),
    "torch.trapz x": (lambda y, x: torch.trapz(y, x), [(3, 4), (4,)]),
    "torch.trapz dx": (lambda y: torch.trapz(y, dx=2.0, dim=0), [(3, 4)]),
    "torch.cumulative_trapezoid": (lambda y: torch.cumulative_trapezoid(y), [(3, 4)]),
    "torch.cumulative_trapezoid 1-D x dim 0": (lambda y, x: torch.cumulative_trapezoid(y, x, dim=0), [(4, 3), (4,)]),
    "torch.cumulative_trapezoid x same shape": (lambda y, x: torch.cumulative_trapezoid(y, x), [(2, 4), (2, 4)]),
    "torch.cumulative_trapezoid dx": (lambda y: torch.cumulative_trapezoid(y, dx=0.3), [(5,)]),
    "torch.cumulative_trapezoid one sample": (lambda y: torch.cumulative_trapezoid(y) + 0, [(3, 1)]),
    # cross product
    "torch.cross dim": (lambda a, b: torch.cross(a, b, dim=1), [(2, 3), (2, 3)]),
    "Tensor.cross negative dim": (lambda a, b: a.cross(b, -1), [(4, 3), (4, 3)]),
    "torch.linalg.cross": (lambda a, b: torch.linalg.cross(a, b), [(2, 3), (2, 3)]),
    "torch.linalg.cross broadcast, dim": (lambda a, b: torch.linalg.cross(a, b, dim=0), [(3, 2), (3, 1)]),
    "torch.linalg.cross parallel vectors": (lambda a: torch.linalg.cross(a, 2 * a), [(2, 3)]),
    # an input used twice
    "used twice: diff and trapezoid": (lambda y: torch.diff(y) * torch.trapezoid(y, y, dim=-1).unsqueeze(-1),
                                       [(2, 4)]),
    "used twice: cross with itself": (lambda a: torch.linalg.cross(a, a.flip(-1)), [(2, 3)]),
}


@pytest.mark.parametrize("name, dtype", [(name, dtype) for name in CASES for dtype in DTYPES
                                         if "coordinates" not in name or dtype == torch.float64],
                         ids=lambda v: str(v))  # coordinates are float64 constants
def test_rule_matches_torch(name, dtype):
    check_case(*CASES[name], dtype)


@pytest.mark.parametrize("name", [n for n in CASES if len(CASES[n][1][0]) >= 2 and min(CASES[n][1][0]) > 1])
def test_rule_on_non_contiguous_input(name):
    check_case(*CASES[name], contiguous=False)


@settings(max_examples=40, deadline=None)
@given(shape=st.lists(st.integers(1, 4), min_size=1, max_size=3), n=st.integers(0, 5), seed=st.integers(0, 2 ** 16),
       dim=st.integers(-3, 2), pad=st.tuples(st.integers(0, 2), st.integers(0, 2)))
def test_diff_random_shapes(shape, n, seed, dim, pad):
    dim = dim % len(shape)
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=generator, dtype=torch.float64)
    before, after = (torch.randn(shape[:dim] + [k] + shape[dim + 1:], generator=generator, dtype=torch.float64)
                     for k in pad)
    check_op(lambda x, b, a: torch.diff(x, n, dim, b, a), x, before, after)


@settings(max_examples=30, deadline=None)
@given(n=st.integers(2, 5), seed=st.integers(0, 2 ** 16), edge_order=st.sampled_from([1, 2]),
       cumulative=st.booleans())
def test_trapezoid_and_gradient_on_random_sample_points(n, seed, edge_order, cumulative):
    generator = torch.Generator().manual_seed(seed)
    y = torch.randn(2, n, generator=generator, dtype=torch.float64)
    points = torch.rand(n, generator=generator, dtype=torch.float64).cumsum(0) + 0.1  # distinct, increasing
    integrate = torch.cumulative_trapezoid if cumulative else torch.trapezoid
    check_op(lambda y, x: integrate(y, x), y, points)
    if n > edge_order:
        check_op(lambda y: torch.gradient(y, spacing=(points,), dim=1, edge_order=edge_order), y)


def test_cross_without_dim_uses_the_first_dim_of_size_3():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch deprecates dim=None
        check_op(lambda a, b: torch.cross(a, b), torch.randn(3, 2, 3, dtype=torch.float64),
                 torch.randn(3, 2, 3, dtype=torch.float64))


def test_gradient_with_coordinates_that_require_grad_is_refused():
    x = tt.tracer(torch.randn(4), requires_grad=True)
    at = tt.tracer(torch.tensor([0.0, 1.0, 2.0, 4.0]), requires_grad=True)
    with pytest.raises(tt.UnsupportedOperationError, match="torch.gradient: a gradient with respect to the spacing"):
        torch.gradient(x, spacing=(at,))
    (y,) = torch.gradient(x, spacing=(at.detach(),))  # plain coordinates are fine
    y.sum().backward()
    assert x.grad.shape == (4,)


@pytest.mark.parametrize("op", [lambda y: torch.gradient(y)[0], lambda y: torch.diff(y, 2)], ids=["gradient", "diff"])
def test_results_are_linear_in_the_input(op):
    x = tt.tracer(torch.randn(5, dtype=torch.float64), requires_grad=True)
    w = torch.randn(op(torch.zeros(5, dtype=torch.float64)).shape, dtype=torch.float64)
    (op(x) * w).sum().backward()
    # a linear map's gradient does not depend on where it is taken
    x2 = tt.tracer(torch.randn(5, dtype=torch.float64) * 10, requires_grad=True)
    (op(x2) * w).sum().backward()
    torch.testing.assert_close(x.grad, x2.grad)


def test_every_differences_rule_is_exercised(dispatched):
    assert_every_rule_exercised(dispatched, "torchtrace.ops.differences", CASES)


DOUBLE_BACKWARD = {
    "diff with prepend": (lambda x, p: torch.diff(x * x, 2, prepend=p * x[:, :1]) ** 2, [(2, 4), (2, 1)]),
    "gradient": (lambda x, w: torch.gradient(x * w, edge_order=2)[1] ** 2, [(3, 4), (4,)]),
    "trapezoid with x": (lambda y, x: torch.trapezoid(y * y, x * x) ** 2, [(2, 4), (4,)]),
    "cumulative_trapezoid": (lambda y, x: torch.cumulative_trapezoid(y ** 2, x, dim=0) ** 2, [(4, 2), (4, 2)]),
    "cross": (lambda a, b: torch.linalg.cross(a * b, b) ** 2, [(2, 3), (2, 3)]),
}


@pytest.mark.parametrize("name", list(DOUBLE_BACKWARD))
def test_double_backward_matches_torch(name):
    check_case_double_backward(*DOUBLE_BACKWARD[name])
