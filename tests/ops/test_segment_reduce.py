"""torch.segment_reduce (torchtrace/ops/segment_reduce.py) against torch autograd and finite differences."""
import pytest
import torch
from helpers import check_op

import torchtrace as tt

X = torch.randn(6, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
TIES = torch.tensor([1.0, 3.0, 3.0, -2.0, 0.0, 0.0], dtype=torch.float64)


@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min", "prod"])
@pytest.mark.parametrize("spans, initial", [
    ({"lengths": torch.tensor([2, 0, 3, 1])}, 0.5), ({"offsets": torch.tensor([0, 1, 1, 6])}, -3.0),
    ({"lengths": torch.tensor([2, 3, 1])}, None), ({"offsets": torch.tensor([0, 4, 6])}, 0.5)])
def test_segments(reduce, spans, initial):
    check_op(lambda x: torch.segment_reduce(x, reduce, **spans, initial=initial).sin(), X)


@pytest.mark.parametrize("reduce", ["max", "min", "prod"])
def test_ties_and_zeros_as_torch(reduce):
    ours = tt.tracer(TIES.clone(), requires_grad=True)
    theirs = TIES.clone().requires_grad_()
    for x in (ours, theirs):
        torch.segment_reduce(x, reduce, lengths=torch.tensor([3, 3])).backward(torch.tensor([1.0, 1.0],
                                                                                          dtype=torch.float64))
    assert torch.equal(ours.grad, theirs.grad)


def test_batched_lengths():
    lengths = torch.tensor([[1, 2], [3, 0], [0, 3]])
    check_op(lambda x: torch.segment_reduce(x, "mean", lengths=lengths, axis=1, initial=0.0), X[:3])


def test_indices_refused():
    x = tt.tracer(X, requires_grad=True)
    with pytest.raises(tt.UnsupportedOperationError, match="torch.segment_reduce: indices= is not supported"):
        torch.segment_reduce(x, "sum", indices=torch.tensor([0, 0, 1, 1, 2, 2]))
