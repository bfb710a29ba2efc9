"""F.normalize, F.cosine_similarity (torch.cosine_similarity), F.pairwise_distance (torch.pairwise_distance) and
the CosineSimilarity / PairwiseDistance modules."""
import math

import pytest
import torch
import torch.nn.functional as F
from helpers import check_op, double_backward_matches, float_tolerances, non_contiguous
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import mutually_broadcastable_shapes

import torchtrace as tt
import torchtrace.nn as nn

torch.manual_seed(0)
X, Y = torch.randn(3, 4), torch.randn(3, 4)
ZERO_ROWS = torch.tensor([[0.0, 0.0, 0.0, 0.0], [1e-9, 0.0, 0.0, 0.0], [1.0, 2.0, 0.0, -1.0]])  # 0, below eps, normal


@pytest.mark.parametrize("fn", [
    F.normalize,
    lambda x: F.normalize(x, 1.0, 0),
    lambda x: F.normalize(x, math.inf),
    lambda x: F.normalize(x, 3, -1, 1e-3),
    lambda x: F.normalize(x, 0.5),
    lambda x: F.normalize(x, p=1.5, dim=0, eps=10.0),  # eps above every norm: x / eps
    lambda x: F.normalize(x * x, dim=1) + x,
])
@pytest.mark.parametrize("x", [X, X.double(), non_contiguous(X)])
def test_normalize(fn, x):
    check_op(fn, x, **float_tolerances(x.dtype))


def test_normalize_1d_and_zero_vectors():
    check_op(lambda x: F.normalize(x, dim=0), torch.randn(5))
    check_op(F.normalize, ZERO_ROWS, gradcheck=False)  # 0 and 1e-9 rows: the clamp at eps, torch's choice
    check_op(lambda x: F.normalize(x, eps=0.5), ZERO_ROWS[:2], gradcheck=False)


@pytest.mark.parametrize("fn, inputs", [
    (F.cosine_similarity, (X, Y)),
    (lambda a, b: F.cosine_similarity(a, b, 0), (X, Y)),
    (lambda a, b: F.cosine_similarity(a, b, dim=-1, eps=1e-3), (X, Y)),
    (F.cosine_similarity, (X, Y[:1])),  # broadcast
    (lambda a, b: F.cosine_similarity(a, b, 0), (torch.randn(4), torch.randn(4))),
    (torch.cosine_similarity, (X.double(), Y.double())),
    (F.cosine_similarity, (non_contiguous(X), Y)),
    (lambda a: F.cosine_similarity(a, a * 2 + 1), (X,)),
    (lambda a, b: F.cosine_similarity(a, b, 1), (torch.randn(2, 3, 4), torch.randn(2, 3, 4))),
])
def test_cosine_similarity(fn, inputs):
    check_op(fn, *inputs)


@pytest.mark.parametrize("fn, inputs", [
    (F.cosine_similarity, (ZERO_ROWS, Y)),  # a zero vector and one shorter than eps
    (F.cosine_similarity, (ZERO_ROWS, ZERO_ROWS)),
    (lambda a, b: torch.cosine_similarity(a, b, 1, 1.0), (X * 0.1, Y)),  # eps above the norms
])
def test_cosine_similarity_below_eps_follows_torch(fn, inputs):
    """torch clamps the norms in place under no_grad: its gradient treats max(|x|, eps) as |x| (not finite
    differences' max), so only torch is the reference here."""
    check_op(fn, *inputs, gradcheck=False)


@pytest.mark.parametrize("fn, inputs", [
    (F.pairwise_distance, (X, Y)),
    (lambda a, b: F.pairwise_distance(a, b, 1.0), (X, Y)),
    (lambda a, b: F.pairwise_distance(a, b, math.inf), (X, Y)),
    (lambda a, b: F.pairwise_distance(a, b, 3.0, 1e-3, True), (X, Y)),
    (lambda a, b: F.pairwise_distance(a, b, p=0.5), (X, Y)),
    (F.pairwise_distance, (X, Y[0])),  # broadcast
    (F.pairwise_distance, (torch.randn(4), torch.randn(4))),
    (F.pairwise_distance, (torch.tensor(1.5), torch.tensor(-0.5))),  # 0-d
    (torch.pairwise_distance, (X.double(), Y.double())),
    (lambda a: F.pairwise_distance(a, a * 3), (X,)),
    (lambda a, b: F.pairwise_distance(a, b, keepdim=True), (torch.randn(2, 3, 4), torch.randn(2, 3, 4))),
])
def test_pairwise_distance(fn, inputs):
    check_op(fn, *inputs)


def test_pairwise_distance_of_equal_inputs_follows_torch():
    check_op(F.pairwise_distance, X, X, gradcheck=False)  # |eps| along the dim: finite steps of 1e-6 straddle it
    check_op(lambda a, b: F.pairwise_distance(a, b, 2.0, 0.0), X, X, gradcheck=False)  # exactly 0: gradient 0


@pytest.mark.parametrize("fn", [
    F.normalize, lambda x: F.normalize(x, 1.5, 0), lambda x: F.normalize(x, math.inf),
    lambda x: F.cosine_similarity(x, Y), lambda x: F.pairwise_distance(x, Y),
    lambda x: F.pairwise_distance(x, Y, 3.0),
])
def test_double_backward(fn):
    double_backward_matches(fn, X)


def test_cosine_similarity_double_backward_in_both_inputs():
    double_backward_matches(F.cosine_similarity, X, Y)


@pytest.mark.parametrize("name, args, inputs", [
    ("CosineSimilarity", (), (X, Y)),
    ("CosineSimilarity", (0, 1e-4), (X, Y)),
    ("PairwiseDistance", (), (X, Y)),
    ("PairwiseDistance", (1.0, 1e-3, True), (X, Y)),
])
def test_modules_match_torch(name, args, inputs):
    ours, theirs = getattr(nn, name)(*args), getattr(torch.nn, name)(*args)
    assert isinstance(ours, nn.Module) and repr(ours) == repr(theirs)
    check_op(ours, *inputs)
    out = ours(*(tt.tracer(x, requires_grad=True) for x in inputs))
    torch.testing.assert_close(out.as_subclass(torch.Tensor), theirs(*inputs))
    assert out.grad_fn.module is ours


def test_normalize_out_is_refused():
    with pytest.raises(tt.UnsupportedOperationError, match="normalize: out= cannot be recorded"):
        F.normalize(tt.tracer(X, requires_grad=True), out=torch.empty(3, 4))


@settings(max_examples=40, deadline=None)
@given(shapes=mutually_broadcastable_shapes(num_shapes=2, min_dims=1, max_dims=3, min_side=1, max_side=4),
       which=st.sampled_from(["cosine", "pairwise", "normalize"]), p=st.sampled_from([1.0, 2.0, 3.0, math.inf]),
       dim=st.integers(-1, 0), seed=st.integers(0, 2 ** 16))
def test_random_broadcast_shapes(shapes, which, p, dim, seed):
    generator = torch.Generator().manual_seed(seed)
    a, b = (torch.randn(shape, generator=generator, dtype=torch.float64) for shape in shapes.input_shapes)
    if which == "cosine":
        check_op(lambda a, b: F.cosine_similarity(a, b, dim), a, b)
    elif which == "pairwise":
        check_op(lambda a, b: F.pairwise_distance(a, b, p), a, b)
    else:
        check_op(lambda a: F.normalize(a, p, dim), a)
