"""Writes into memory that several elements (or a plain tensor) share, as torch writes them: against torch autograd
and central finite differences (tt.check / tt.gradcheck), or torch's refusal where the write cannot be followed."""
import pytest
import torch
import torch.nn.functional as F

import torchtrace as tt
from tests.helpers import check_op

WEIGHTS = torch.tensor([1.0, 10.0, 100.0, 1000.0], dtype=torch.float64)


def fill_overlapping_windows(x):
    b = x * 1.0
    b.unfold(0, 2, 1).fill_(5.0)  # one number into every element: the same whatever order torch writes them in
    return (b * WEIGHTS).sum()


def setitem_a_number_into_overlapping_windows(x):
    b = x * 1.0
    b.unfold(0, 2, 1)[:] = 5.0
    return (b * WEIGHTS).sum()


def setitem_a_row_of_overlapping_windows(x):
    b = x * 1.0
    b.unfold(0, 2, 1)[1] = b[:2] * 2  # the row itself: two elements of their own
    return (b * WEIGHTS).sum()


def setitem_one_element_of_an_expand(x):
    b = x[:1] * 1.0
    e = b.expand(3)
    e[0] = x[1] * 5
    return (b * 3).sum() + (x * WEIGHTS).sum()


def multiply_part_of_an_expand_in_place(x):
    b = x[:1] * 1.0
    e = b.expand(3)
    e[2:] *= 0.5  # e[2:] is one element: torch multiplies it, then writes it back through e[2:] = ...
    return (b * 3).sum() + (x * WEIGHTS).sum()


def non_overlapping_windows(x):
    b = x * 1.0
    b.unfold(0, 2, 2).mul_(x[:2].unsqueeze(0))
    return (b * WEIGHTS).sum()


@pytest.mark.parametrize("fn", [fill_overlapping_windows, setitem_a_number_into_overlapping_windows,
                                setitem_a_row_of_overlapping_windows, setitem_one_element_of_an_expand,
                                multiply_part_of_an_expand_in_place, non_overlapping_windows],
                         ids=lambda f: f.__name__)
def test_writes_into_views_whose_elements_share_memory_as_torch(fn):
    check_op(fn, torch.tensor([1.0, -2.0, 3.0, 4.0], dtype=torch.float64))


@pytest.mark.parametrize("write", [lambda v: v.relu_(), lambda v: v.mul_(3), lambda v: v.add_(1),
                                   lambda v: F.relu(v, inplace=True), lambda v: v.copy_(torch.ones(3, 2)),
                                   lambda v: v.__setitem__(slice(None), torch.ones(3, 2))],
                         ids=["relu_", "mul_", "add_", "relu(inplace=True)", "copy_", "setitem of a tensor"])
def test_an_in_place_op_on_overlapping_windows_is_refused(write):
    """b.unfold(0, 2, 1) holds b[1] and b[2] twice: torch runs the op element after element, so what lands there
    depends on that order (mul_ compounds to 9x; torch's own gradient is then 3x, finite differences 9x). Recorded as
    op(copy) written back, each shared element's gradient was counted once per window (relu_: 200 for 100)."""
    x = tt.tracer(torch.tensor([1.0, -2.0, 3.0, 4.0]), requires_grad=True)
    b = x * 1.0
    with pytest.raises(RuntimeError, match=r"view of shape \(3, 2\) and strides \(1, 1\) whose elements share memory"):
        write(b.unfold(0, 2, 1))


def test_out_into_a_tracer_that_requires_grad_is_refused_as_torch():
    """torch.add(c, 1, out=b[:2]) replaced b's values while b's graph stayed: its gradient was silently the old one."""
    for make_out in (lambda b: b[:2], lambda b: b):
        x = tt.tracer(torch.tensor([1.0, -2.0, 3.0, 4.0]), requires_grad=True)
        b = x * 1.0
        with pytest.raises(tt.UnsupportedOperationError, match="out= cannot be recorded"):
            torch.add(torch.ones(make_out(b).shape), 1, out=make_out(b))
        reference = torch.tensor([1.0, -2.0, 3.0, 4.0], requires_grad=True) * 1.0
        with pytest.raises(RuntimeError, match="out=... arguments don't support automatic differentiation"):
            torch.add(torch.ones(make_out(reference).shape), 1, out=make_out(reference))
    with tt.no_grad():  # nothing is recorded: out= simply runs
        torch.add(torch.ones(2), 1, out=b[:2])
    assert b.tolist() == [2.0, 2.0, 3.0, 4.0]


@pytest.mark.parametrize("destination", [lambda: torch.zeros(4, dtype=torch.long),
                                         lambda: torch.arange(12).reshape(3, 4)[0]], ids=["tensor", "a view"])
def test_an_integer_destination_takes_a_tracers_values_cast_as_torch(destination):
    """An int tensor holds no gradient: the values are cast and nothing is recorded (a view of one was refused, and a
    plain one became a tracer)."""
    x = torch.tensor([1.26, 2.5, -3.7, 4.1], dtype=torch.float64)
    expected = destination()
    expected[:] = x.clone().requires_grad_() * 10
    got = destination()
    got[:] = tt.tracer(x, requires_grad=True) * 10
    got.add_(tt.tracer(x, requires_grad=True).long())
    expected.add_(x.long())
    assert type(got) is torch.Tensor and not got.requires_grad
    assert got.tolist() == expected.tolist() == [13, 27, -40, 45]
