"""Gradient rules of torchtrace/ops/distances.py: cdist, pdist, cov, corrcoef, renorm."""
import math

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_every_rule_exercised, check_case, check_case_double_backward, check_op

import torchtrace as tt

T = torch.Tensor
DTYPES = [torch.float64, torch.float32]
NORMS = [0, 0.5, 1, 1.5, 2, 3, math.inf]
FWEIGHTS = torch.tensor([1, 2, 1, 3, 1])

CASES = {
    "torch.cdist": (lambda a, b: torch.cdist(a, b), [(3, 4), (5, 4)]),
    "torch.cdist batched, broadcast": (lambda a, b: torch.cdist(a, b, 1.5), [(2, 1, 3, 4), (3, 5, 4)]),
    "torch.cdist matmul mode": (lambda a, b: torch.cdist(a, b, compute_mode="use_mm_for_euclid_dist"),
                                [(3, 4), (2, 4)]),
    "torch.cdist p keyword, no matmul": (
        lambda a, b: torch.cdist(a, b, p=3.0, compute_mode="donot_use_mm_for_euclid_dist"), [(2, 3, 2), (2, 4, 2)]),
    "torch.cdist empty": (lambda a, b: torch.cdist(a, b) + 1, [(0, 3), (2, 3)]),
    "torch.pdist": (lambda x: torch.pdist(x), [(4, 3)]),
    "F.pdist p": (lambda x: F.pdist(x, p=1.0), [(4, 3)]),
    "F.pdist one row": (lambda x: F.pdist(x) + 1, [(1, 3)]),
    "torch.cov": (lambda x: torch.cov(x), [(3, 5)]),
    "Tensor.cov 1-D correction=0": (lambda x: x.cov(correction=0), [(5,)]),
    "torch.cov fweights": (lambda x: torch.cov(x, fweights=FWEIGHTS), [(3, 5)]),
    "torch.cov aweights": (lambda x, w: torch.cov(x, aweights=w.abs() + 0.1), [(3, 5), (5,)]),
    "Tensor.cov both weights, correction=2": (lambda x, w: x.cov(correction=2, fweights=FWEIGHTS, aweights=w * w + 0.1),
                                              [(3, 5), (5,)]),
    "torch.cov one variable": (lambda x: torch.cov(x), [(1, 4)]),
    "torch.corrcoef": (lambda x: torch.corrcoef(x), [(3, 5)]),
    "Tensor.corrcoef 1-D": (lambda x: x.corrcoef() * x.sum(), [(5,)]),
    "torch.renorm": (lambda x: torch.renorm(x, 2, 0, 1.0), [(3, 4)]),
    "Tensor.renorm p=1 dim 1": (lambda x: x.renorm(1, 1, 1.5), [(3, 4)]),
    "Tensor.renorm p=inf negative dim": (lambda x: x.renorm(p=math.inf, dim=-1, maxnorm=0.5), [(2, 3, 4)]),
    "torch.renorm p=3, nothing too large": (lambda x: torch.renorm(x, 3, 0, 100.0), [(3, 4)]),
    "used twice: cdist of x with itself": (lambda x: torch.cdist(x, x * 2), [(3, 2)]),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", list(CASES))
def test_rule_matches_torch(name, dtype):
    check_case(*CASES[name], dtype)


@pytest.mark.parametrize("name", [n for n in CASES if len(CASES[n][1][0]) >= 2 and min(CASES[n][1][0]) > 1])
def test_rule_on_non_contiguous_input(name):
    check_case(*CASES[name], contiguous=False)


# coincident points, zero coordinates and (p = inf) tied coordinates: torch's conventions, where finite
# differences have no single answer (so only tt.check against torch there)
POINTS = torch.tensor([[0.0, 0.0, 0.0], [1.0, 2.0, -2.0], [1.0, 1.0, 0.5], [0.0, 0.0, 0.0]], dtype=torch.float64)
OTHERS = torch.tensor([[0.0, 0.0, 0.0], [0.0, 1.0, 0.0]], dtype=torch.float64)


@pytest.mark.parametrize("p", NORMS)
@pytest.mark.parametrize("mode", ["use_mm_for_euclid_dist_if_necessary", "donot_use_mm_for_euclid_dist"])
def test_cdist_at_coincident_points_follows_torch(p, mode):
    check_op(lambda a, b: torch.cdist(a, b, p, mode), POINTS, OTHERS, gradcheck=False)


@pytest.mark.parametrize("p", NORMS)
def test_pdist_at_coincident_points_follows_torch(p):
    check_op(lambda a: torch.pdist(a, p), POINTS, gradcheck=False)


@pytest.mark.parametrize("p", NORMS)
def test_cdist_and_pdist_away_from_ties_and_zeros(p):
    a, b = torch.randn(2, 3, 4, dtype=torch.float64), torch.randn(2, 5, 4, dtype=torch.float64)
    check_op(lambda a, b: torch.cdist(a, b, p), a, b)
    check_op(lambda a: F.pdist(a, p), a[0])


def test_cdist_at_a_coincident_point_gives_zero_gradient():
    a = tt.tracer(torch.zeros(1, 2), requires_grad=True)
    torch.cdist(a, torch.zeros(1, 2)).sum().backward()
    assert torch.equal(a.grad, torch.zeros(1, 2))


def test_renorm_with_tied_largest_entries_shares_them_as_torch():
    x = torch.tensor([[3.0, -3.0, 1.0], [1.0, 1.0, 0.0]], dtype=torch.float64)
    check_op(lambda x: x.renorm(math.inf, 0, 2.0), x, gradcheck=False)


def test_cov_with_keyword_weights_when_nothing_needs_a_gradient():
    x, w = tt.tracer(torch.randn(2, 4)), tt.tracer(torch.rand(4))
    assert torch.cov(x, aweights=w).shape == (2, 2)


def test_renorm_in_place_is_recorded():
    def fn(x):
        y = x * 1
        y.renorm_(2, 0, 0.5)
        return y * x

    check_op(fn, torch.randn(3, 4, dtype=torch.float64))


def test_every_distances_rule_is_exercised(dispatched):
    assert_every_rule_exercised(dispatched, "torchtrace.ops.distances", CASES)


DOUBLE_BACKWARD = {
    "cov with aweights": (lambda x, w: torch.cov(x * x, aweights=w * w + 0.5) ** 2, [(2, 4), (4,)]),
    "corrcoef": (lambda x, w: torch.corrcoef(x * w) ** 2, [(3, 4), (4,)]),
    "renorm": (lambda x, w: torch.renorm(x * w, 2, 0, 0.5) ** 2, [(3, 4), (4,)]),
}


@pytest.mark.parametrize("name", list(DOUBLE_BACKWARD))
def test_double_backward_matches_torch(name):
    check_case_double_backward(*DOUBLE_BACKWARD[name])


def second_derivatives(fn, inputs, torchtrace):
    """Gradient of sum(first gradients squared): by torchtrace (create_graph) or by torch autograd."""
    if torchtrace:
        xs = [tt.tracer(x, requires_grad=True) for x in inputs]
        grads = tt.grad(fn(*xs).sum(), xs, create_graph=True)
        return [g.as_subclass(T) for g in tt.grad(sum((g * g).sum() for g in grads), xs)]
    xs = [x.clone().requires_grad_(True) for x in inputs]
    grads = torch.autograd.grad(fn(*xs).sum(), xs, create_graph=True)
    return list(torch.autograd.grad(sum((g * g).sum() for g in grads), xs))


def pairwise(a, b, p):
    return torch.linalg.vector_norm(a.unsqueeze(-2) - b.unsqueeze(-3), p, -1)


@pytest.mark.parametrize("p", [1.5, 2, 3])
def test_cdist_and_pdist_second_derivatives_match_torch_on_the_explicit_formula(p):
    """torch has no second derivative of cdist / pdist: compare with its autograd of ||a_i - b_j||_p written out."""
    a, b = torch.randn(3, 2, dtype=torch.float64), torch.randn(4, 2, dtype=torch.float64)
    if p >= 2:  # a coordinate difference of exactly 0 (for p < 2 the second derivative is infinite there)
        a[0, 0] = b[1, 0] = a[2, 0]
    ours = second_derivatives(lambda a, b: torch.cdist(a, b, p) ** 3, [a, b], torchtrace=True)
    theirs = second_derivatives(lambda a, b: pairwise(a, b, p) ** 3, [a, b], torchtrace=False)
    for x, y in zip(ours, theirs):
        torch.testing.assert_close(x, y)
    i, j = torch.triu_indices(3, 3, 1)
    (ours,) = second_derivatives(lambda a: torch.pdist(a, p) ** 3, [a], torchtrace=True)
    (theirs,) = second_derivatives(lambda a: torch.linalg.vector_norm(a[i] - a[j], p, -1) ** 3, [a], torchtrace=False)
    torch.testing.assert_close(ours, theirs)
