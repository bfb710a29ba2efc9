"""F.linear_cross_entropy (torchtrace/nn/linear_cross_entropy.py) against torch autograd and finite differences."""
import pytest
import torch
import torch.nn.functional as F
from helpers import check_op, double_backward_matches
from torch.nn.modules.linear_cross_entropy_options import LinearCrossEntropyOptions

import torchtrace as tt

_gen = torch.Generator().manual_seed(0)
X = torch.randn(5, 3, generator=_gen, dtype=torch.float64)
W = torch.randn(4, 3, generator=_gen, dtype=torch.float64)
B = torch.randn(4, generator=_gen, dtype=torch.float64)
T = torch.tensor([0, 3, 1, -100, 2])
PROBS = torch.softmax(torch.randn(5, 4, generator=_gen, dtype=torch.float64), 1)
CLASS_WEIGHT = torch.rand(4, generator=_gen, dtype=torch.float64) + 0.5


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("smoothing", [0.0, 0.2])
def test_class_indices(reduction, smoothing):
    check_op(lambda x, w, b: F.linear_cross_entropy(x, w, T, linear_bias=b, reduction=reduction,
                                                    label_smoothing=smoothing, weight=CLASS_WEIGHT), X, W, B)
    check_op(lambda x, w: F.linear_cross_entropy(x, w, T, ignore_index=-100, reduction=reduction), X, W)


def test_probability_targets_get_a_gradient():
    check_op(lambda x, w, t: F.linear_cross_entropy(x, w, t, linear_bias=B), X, W, PROBS)


def test_single_sample_and_k_dimensional_weight():
    check_op(lambda x, w: F.linear_cross_entropy(x, w, torch.tensor(2)), X[0], W)
    w3 = torch.randn(2, 3, 3, generator=_gen, dtype=torch.float64)
    check_op(lambda x, w: F.linear_cross_entropy(x, w, torch.tensor([[0, 1, 1], [1, 0, 0]])), X[:2], w3)


def test_second_derivatives():
    double_backward_matches(lambda x, w: F.linear_cross_entropy(x, w, T, linear_bias=B), X, W)


def test_chunked_path_gives_first_derivatives_and_refuses_second():
    options = LinearCrossEntropyOptions(batch_chunk_size=2)
    x = tt.tracer(X, requires_grad=True)
    theirs = X.clone().requires_grad_()
    F.linear_cross_entropy(theirs, W, T, options=options).backward()
    (gx,) = tt.grad(F.linear_cross_entropy(x, W, T, options=options), [x], create_graph=True)
    torch.testing.assert_close(gx.as_subclass(torch.Tensor), theirs.grad)
    with pytest.raises(tt.UnsupportedOperationError, match="linear_cross_entropy: with options= .* cannot be diff"):
        tt.grad(gx.sum(), [x])
