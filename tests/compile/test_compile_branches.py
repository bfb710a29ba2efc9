"""Branches, value reads, new shapes and dtypes: a call that goes another way diverges, gives eager's result, and its
path joins the program as a branch (the scenarios a guard once re-traced on)."""
import pytest
import torch

import torchtrace as tt


def branchy(x, w):
    y = x * w
    if y.sum() > 0:  # the branch
        return y.exp().sum()
    return (y * 3).sum()


def test_a_changed_branch_diverges_and_becomes_a_second_path():
    w = tt.ones(3, requires_grad=True)
    f = tt.compile(branchy, (torch.ones(3), w))
    f(torch.ones(3), w)
    negative = f(-torch.ones(3), w)  # diverges after `x * w` and the read: nothing runs twice
    negative.backward()
    torch.testing.assert_close(negative, torch.tensor(-9.0))
    torch.testing.assert_close(w.grad, torch.full((3,), -3.0))
    w.grad = None
    again = f(-torch.ones(3), w)  # the second path now replays
    assert again._tt_node.name == "CompiledCallBackward"  # grad_fn is its statement's node
    again.backward()
    torch.testing.assert_close(w.grad, torch.full((3,), -3.0))
    paths = f.program.paths()
    assert len(paths) == 2 and paths[0][:2] == paths[1][:2] and paths[0][-2:] != paths[1][-2:]
    assert "2 path(s)" in repr(f)


@pytest.mark.parametrize("read", [
    lambda t: t.sum().item() > 0,
    lambda t: bool(t.sum() > 0),
    lambda t: t.tolist()[0] > 0,
    lambda t: int(t.sum()) > 0,
])
def test_every_python_read_of_a_value_is_simply_python(read):
    def f(x):
        return x.exp().sum() if read(x) else x.sin().sum()

    x = tt.ones(2, requires_grad=True)
    compiled = tt.compile(f, (x,))
    for sign in (1, -1, 1, -1):
        v = tt.as_tracer(sign * torch.ones(2), requires_grad=True)
        got = compiled(v)
        torch.testing.assert_close(got, f(v))
    assert len(compiled.program.paths()) == 2


@pytest.mark.parametrize("change", [
    lambda x: x.double(), lambda x: x[:2], lambda x: x.clone().requires_grad_(True), lambda x: tt.as_tracer(x)])
def test_shape_dtype_and_requires_grad_of_an_input_select_their_own_path(change):
    f = tt.compile(lambda x: (x * 2).sum(), (torch.ones(3),))
    w = tt.ones(3, requires_grad=True)
    f(w)
    other = change(torch.ones(3))
    for _ in range(2):
        torch.testing.assert_close(f(other), (other * 2).sum())
    same_leaf = other.requires_grad and other.shape == (3,) and other.dtype == torch.float32
    assert len(f.program.paths()) == (1 if same_leaf else 2)  # a call recording nothing is an empty path


def test_python_numbers_and_training_flags_are_read_on_every_call():
    drop = tt.nn.Dropout(0.5)
    x = tt.ones(4, requires_grad=True)
    f = tt.compile(lambda v, k: drop(v) * k, (x, 2.0))
    for k in (2.0, 3.0, -0.0):
        torch.manual_seed(0)
        got = f(x, k)
        torch.manual_seed(0)
        assert torch.equal(got, drop(x) * k)
    drop.eval()
    torch.testing.assert_close(f(x, 3.0), torch.full((4,), 3.0))  # eval: the identity, as eager
    assert len(f.program.paths()) == 2


def test_a_read_inside_a_rule_backward_runs_on_every_backward():
    class Picky(tt.Function):
        """y = x -> dy/dx = 1 if g sums positive else 2 (a rule that reads a value in backward)"""

        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            return g if g.sum() > 0 else g * 2

    x = tt.ones(2, requires_grad=True)
    f = tt.compile(lambda v: Picky.apply(v), (x,))
    f(x).backward(torch.ones(2))
    x.grad = None
    f(x).backward(-torch.ones(2))
    torch.testing.assert_close(x.grad, torch.full((2,), -2.0))


def test_a_shape_that_depends_on_values_gives_eagers_gradient():
    w = tt.ones(4, requires_grad=True)

    def f(x):
        return (x[x > 0] * w[: int((x > 0).sum())]).sum()

    compiled = tt.compile(f, (torch.tensor([1.0, -1.0, 2.0, 3.0]),))
    compiled(torch.tensor([1.0, -1.0, 2.0, 3.0]))
    x = torch.tensor([1.0, 2.0, -3.0, -4.0])
    compiled(x).backward()
    torch.testing.assert_close(w.grad, torch.tensor([1.0, 2.0, 0.0, 0.0]))
