"""Gradient rules of torchtrace/ops/view_copies.py: the *_copy twins of view ops reuse the views' rules."""
import pytest
import torch
from helpers import assert_every_rule_exercised, check_op, double_backward_matches, float_tolerances

import torchtrace as tt

T = torch.Tensor
DTYPES = [torch.float64, torch.float32]

CASES = {
    "torch.view_copy": (lambda x: torch.view_copy(x, (4, -1)), (2, 3, 4)),
    "torch.permute_copy": (lambda x: torch.permute_copy(x, (2, 0, 1)), (2, 3, 4)),
    "torch.expand_copy": (lambda x: torch.expand_copy(x, (2, 3, 4)), (3, 1)),
    "torch.expand_copy implicit": (lambda x: torch.expand_copy(x, [2, -1], implicit=True), (3,)),
    "torch.diagonal_copy": (lambda x: torch.diagonal_copy(x, 1, 0, 2), (3, 2, 4)),
    "torch.select_copy": (lambda x: torch.select_copy(x, -1, 2), (2, 3, 4)),
    "torch.slice_copy": (lambda x: torch.slice_copy(x, 1, 1, None, 2), (2, 5)),
    "torch.slice_copy defaults": (lambda x: torch.slice_copy(x) * x, (3, 2)),
    "torch.squeeze_copy": (lambda x: torch.squeeze_copy(x), (2, 1, 3)),
    "torch.squeeze_copy dim": (lambda x: torch.squeeze_copy(x, -1), (2, 3, 1)),
    "torch.unsqueeze_copy": (lambda x: torch.unsqueeze_copy(x, 0), (2, 3)),
    "torch.t_copy": (lambda x: torch.t_copy(x), (2, 3)),
    "torch.transpose_copy": (lambda x: torch.transpose_copy(x, 0, -1), (2, 3, 4)),
    "torch.unbind_copy": (lambda x: torch.unbind_copy(x, 1), (2, 3)),
    "torch.split_copy": (lambda x: torch.split_copy(x, 2, -1), (2, 5)),
    "torch.split_with_sizes_copy": (lambda x: torch.split_with_sizes_copy(x, [1, 2], 0), (3, 2)),
    "torch.unfold_copy": (lambda x: torch.unfold_copy(x, 1, 3, 2), (2, 7)),
    "torch.narrow_copy": (lambda x: torch.narrow_copy(x, 1, 1, 2), (2, 4)),
    "Tensor.narrow_copy": (lambda x: x.narrow_copy(0, 0, 1), (2, 4)),
    "torch.alias_copy": (lambda x: torch.alias_copy(x) * x, (2, 3)),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", list(CASES))
def test_rule_matches_torch(name, dtype):
    fn, shape = CASES[name]
    check_op(fn, torch.randn(shape, dtype=dtype), **float_tolerances(dtype))


def test_a_copy_twin_does_not_share_memory_with_its_input():
    x = tt.tracer(torch.randn(2, 3), requires_grad=True)
    y = x * 1
    z = torch.view_copy(y, (6,))
    assert z.grad_fn.name == "ViewCopyBackward"
    assert z.data_ptr() != y.data_ptr() and z.is_contiguous()
    (torch.permute_copy(y, (1, 0)) * 2).sum().backward()
    assert torch.equal(x.grad, torch.full((2, 3), 2.0))


def test_detach_copy_carries_no_gradient():
    x = tt.tracer(torch.randn(3), requires_grad=True)
    y = torch.detach_copy(x)
    assert not y.requires_grad and torch.equal(y.as_subclass(T), x.as_subclass(T))


def test_every_view_copy_rule_is_exercised(dispatched):
    for fn, shape in CASES.values():
        fn(tt.tracer(torch.randn(shape), requires_grad=True))
    assert_every_rule_exercised(dispatched, "torchtrace.ops.view_copies")


def test_double_backward_matches_torch():
    def fn(x, w):
        return (torch.permute_copy(x, (1, 0)) * w) ** 2 + torch.slice_copy(x, 0, 1).sum() * torch.t_copy(x) ** 2

    double_backward_matches(fn, torch.randn(2, 3, dtype=torch.float64), torch.randn(2, dtype=torch.float64))
