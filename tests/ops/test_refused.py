"""Callables refused on purpose (torchtrace/ops/refused.py): a clear message with gradients, torch's result without."""
import pytest
import torch
import torch.nn.functional as F

import torchtrace as tt

A = torch.randn(5, 3, dtype=torch.float64)


@pytest.mark.parametrize("op, match", [
    (lambda a: torch.svd_lowrank(a, q=2), r"svd_lowrank: gradients through the randomized low-rank SVD .* — use"),
    (lambda a: torch.pca_lowrank(a, q=2), r"pca_lowrank: gradients through the randomized low-rank PCA .* — centre"),
])
def test_lowrank_refused_with_gradients(op, match):
    with pytest.raises(tt.UnsupportedOperationError, match=match):
        op(tt.tracer(A, requires_grad=True))


def test_lowrank_runs_without_gradients():
    torch.manual_seed(0)
    ours = torch.svd_lowrank(tt.tracer(A), q=2)
    torch.manual_seed(0)
    theirs = torch.svd_lowrank(A, q=2)
    assert all(torch.equal(a.as_subclass(torch.Tensor), b) for a, b in zip(ours, theirs))


def test_multi_head_attention_forward_points_at_the_module():
    x = tt.tracer(torch.randn(3, 2, 4), requires_grad=True)
    w, b = torch.randn(12, 4), torch.randn(12)
    out_w, out_b = torch.randn(4, 4), torch.randn(4)
    with pytest.raises(tt.UnsupportedOperationError, match=r"head_attention_forward: .* tt.nn.MultiheadAttention"):
        F.multi_head_attention_forward(x, x, x, 4, 2, w, b, None, None, False, 0.0, out_w, out_b)


@pytest.mark.parametrize("op", [
    lambda x, w: torch.histogram(x, 4).hist,
    lambda x, w: x.histogram(torch.linspace(-2.0, 2.0, 5, dtype=torch.float64)).hist,
    lambda x, w: torch.histogramdd(x.reshape(3, 2), [2, 2]).hist,
    lambda x, w: torch.bincount(torch.tensor([0, 1, 1, 2, 0, 3]), weights=w),
    lambda x, w: torch.tensor([0, 1, 1, 0, 2, 2]).bincount(w),
    lambda x, w: torch.unique(x.round()),
    lambda x, w: x.round().unique(sorted=True, return_counts=True)[0],
    lambda x, w: torch.unique_consecutive(x.round()),
    lambda x, w: x.round().unique_consecutive(return_inverse=True)[0],
    lambda x, w: x // 0.5,
    lambda x, w: 2.0 // (x.abs() + 0.25),
    lambda x, w: torch.floor_divide(x, w + 0.5),
    lambda x, w: x.floor_divide(3),
])
def test_ops_torch_does_not_differentiate_run_and_refuse_backward_as_torch(op):
    """A histogram of an activation for a log runs, as in torch; a backward through it raises, as in torch."""
    values = torch.randn(6, dtype=torch.float64)
    weights = torch.rand(6, dtype=torch.float64)
    x, w = tt.tracer(values.clone(), requires_grad=True), tt.tracer(weights.clone(), requires_grad=True)
    rx, rw = values.clone().requires_grad_(), weights.clone().requires_grad_()
    ours, theirs = op(x, w), op(rx, rw)
    assert torch.equal(ours.as_subclass(torch.Tensor), theirs.detach())
    assert ours.requires_grad == theirs.requires_grad
    (x.sum() + w.sum()).backward()  # the watched value is not in the loss: backward runs
    assert torch.equal(x.grad, torch.ones(6, dtype=torch.float64))
    with pytest.raises(RuntimeError, match="not implemented"):
        (theirs.sum() + rx.sum() + rw.sum()).backward()
    with pytest.raises(tt.UnsupportedOperationError, match="no derivative for it either"):
        (ours.sum() + x.sum() + w.sum()).backward()


def test_uniques_integer_results_carry_no_gradient_and_can_be_used():
    """x.unique(return_inverse=True)[1] is an index (no gradient, as in torch): a loss reading it with x back-propagates
    through x alone: d/dx sum(inv * x) = inv."""
    values = torch.tensor([1.0, 3.0, 3.0, -2.0], dtype=torch.float64)
    for x in (values.clone().requires_grad_(), tt.tracer(values, requires_grad=True)):
        unique, inverse = x.unique(return_inverse=True)
        assert unique.requires_grad and not inverse.requires_grad and inverse.tolist() == [1, 2, 2, 0]
        (inverse.to(x.dtype) * x).sum().backward()
        assert x.grad.tolist() == [1.0, 2.0, 2.0, 0.0]
