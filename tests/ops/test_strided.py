"""torch.as_strided and its twins: gradients by memory positions, against torch autograd and finite differences."""
import pytest
import torch

import torchtrace as tt
from tests.helpers import check_op, double_backward_matches

CASES = {
    "overlapping windows": lambda x: torch.as_strided(x, (3, 4), (2, 1)),  # each row reads 2 elements of the next
    "one element many times": lambda x: x.as_strided((2, 2), (1, 1)),
    "with an offset": lambda x: torch.as_strided(x, (2,), (3,), 1),
    "stride zero": lambda x: torch.as_strided(x, (3, 2), (0, 1)),
    "transposed": lambda x: x.as_strided((3, 4), (1, 3)) * torch.arange(12.0, dtype=x.dtype).reshape(3, 4),
    "copy": lambda x: torch.as_strided_copy(x, (2, 3), (3, 1), 2) ** 2,
    "of a slice": lambda x: torch.as_strided(x[2:], (2, 2), (1, 2), 3),
    "of a transposed input": lambda x: torch.as_strided(x.reshape(3, 4).t(), (2, 2), (4, 1)),
}


@pytest.mark.parametrize("fn", CASES.values(), ids=CASES.keys())
def test_as_strided_gradients(fn):
    check_op(fn, torch.rand(12) + 0.5)


def test_as_strided_second_derivatives():
    double_backward_matches(lambda x: CASES["overlapping windows"](x) ** 2, torch.rand(12, dtype=torch.float64))


def test_an_input_overlapping_itself_is_refused():
    x = tt.tracer(torch.rand(3), requires_grad=True)
    with pytest.raises(tt.UnsupportedOperationError, match="torch.as_strided: the input overlaps itself"):
        torch.as_strided(x.expand(2, 3), (2,), (1,))


def test_reading_memory_outside_the_input_is_refused():
    x = tt.tracer(torch.rand(12), requires_grad=True)
    with pytest.raises(tt.UnsupportedOperationError, match="torch.as_strided: the result reads memory outside"):
        torch.as_strided(x[2:], (2, 2), (1, 2), 0)


def test_as_strided_scatter_is_refused_because_torch_has_no_right_gradient_to_match():
    plain = torch.rand(12, dtype=torch.float64, requires_grad=True)
    src = torch.rand(3, dtype=torch.float64, requires_grad=True)
    assert not torch.autograd.gradcheck(lambda a, b: torch.as_strided_scatter(a, b, (3,), (1,)), (plain, src),
                                        raise_exception=False)
    x = tt.tracer(torch.rand(12), requires_grad=True)
    with pytest.raises(tt.UnsupportedOperationError, match="torch.as_strided_scatter: not differentiable"):
        torch.as_strided_scatter(x, torch.zeros(3), (3,), (1,))
    assert torch.as_strided_scatter(x.detach(), torch.zeros(3), (3,), (1,)).shape == (12,)  # fine without gradient
