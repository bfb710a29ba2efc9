"""What compiled code is specialised on is checked on every call: a changed value re-traces, never replays."""
import pytest
import torch

import torchtrace as tt


def _line_of(fn, text: str) -> int:
    import inspect

    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, line in enumerate(lines) if text in line)


def branchy(x, w):
    y = x * w
    if y.sum() > 0:  # the branch
        return y.exp().sum()
    return (y * 3).sum()


def test_a_changed_branch_retraces_with_a_warning_naming_the_line():
    w = tt.ones(3, requires_grad=True)
    f = tt.compile(branchy, (torch.ones(3), w))
    assert "raise GuardFailed" in f.code
    f(torch.ones(3), w)
    with pytest.warns(UserWarning, match=rf"test_compile_guards.py:{_line_of(branchy, 'the branch')}"):
        negative = f(-torch.ones(3), w)
    negative.backward()
    torch.testing.assert_close(negative, torch.tensor(-9.0))
    torch.testing.assert_close(w.grad, torch.full((3,), -3.0))
    w.grad = None
    again = f(-torch.ones(3), w)  # the second specialisation now replays
    assert again.grad_fn.name.startswith("Compiled_")
    again.backward()
    torch.testing.assert_close(w.grad, torch.full((3,), -3.0))
    assert len(f.specialisations[next(iter(f.specialisations))]) == 2
    assert "bool(" in repr(f) and "test_compile_guards.py" in repr(f)


@pytest.mark.parametrize("read", [
    lambda t: t.sum().item() > 0,
    lambda t: bool(t.sum() > 0),
    lambda t: t.tolist()[0] > 0,
    lambda t: int(t.sum()) > 0,
])
def test_every_python_read_of_a_value_is_a_guard(read):
    def f(x):
        return x.exp().sum() if read(x) else x.sin().sum()

    compiled = tt.compile(f, (torch.ones(2),))
    compiled(torch.ones(2))
    with pytest.warns(UserWarning, match="re-tracing"):
        got = compiled(-torch.ones(2))
    torch.testing.assert_close(got, f(-torch.ones(2)))


@pytest.mark.parametrize("change", [
    lambda x: x.double(), lambda x: x[:2], lambda x: x.clone().requires_grad_(True), lambda x: tt.as_tracer(x)])
def test_shape_dtype_requires_grad_and_type_select_their_own_code(change):
    f = tt.compile(lambda x: (x * 2).sum(), (torch.ones(3),))
    other = change(torch.ones(3))
    f(other)
    assert len(f.specialisations) == 2
    torch.testing.assert_close(f(other), (other * 2).sum())


def test_python_scalars_and_training_flags_are_guards():
    drop = tt.nn.Dropout(0.5)
    f = tt.compile(lambda x, k: drop(x) * k, (torch.ones(4), 2.0))
    f(torch.ones(4), 3.0)
    assert len(f.specialisations) == 2
    drop.eval()
    torch.testing.assert_close(f(torch.ones(4), 3.0), torch.full((4,), 3.0))  # eval: identity, a fresh trace
    assert sum(map(len, f.specialisations.values())) == 3


def test_after_a_few_specialisations_it_runs_eagerly_with_a_warning():
    f = tt.compile(lambda x: x * x.sum().item(), (torch.ones(2),))
    with pytest.warns(UserWarning):
        for i in range(12):
            torch.testing.assert_close(f(torch.full((2,), float(i))), torch.full((2,), 2.0 * i * i))
    assert max(map(len, f.specialisations.values())) == 8


def test_a_read_inside_a_rule_backward_is_checked_at_run_time():
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
    y = f(x)
    y.backward(torch.ones(2))
    with pytest.raises(RuntimeError, match="specialised on a value a rule read"):
        f(x).backward(-torch.ones(2))


def test_a_shape_that_depends_on_values_is_a_guard():
    w = tt.ones(4, requires_grad=True)

    def f(x):
        return (x[x > 0] * w[: int((x > 0).sum())]).sum()

    compiled = tt.compile(f, (torch.tensor([1.0, -1.0, 2.0, 3.0]),))
    assert ".shape != (3,)" in compiled.code
    x = torch.tensor([1.0, 2.0, -3.0, -4.0])
    with pytest.warns(UserWarning, match="re-tracing"):
        compiled(x)
    compiled(x).backward()
    torch.testing.assert_close(w.grad, torch.tensor([1.0, 2.0, 0.0, 0.0]))
