"""Nested inputs and outputs, factories and random ops as eager, in-place ops, Python state, check_inputs."""
import pytest
import torch

import torchtrace as tt


def test_dict_tuple_and_list_inputs_and_outputs():
    w = tt.randn(3, requires_grad=True)

    def f(batch, pair):
        a, b = pair
        out = batch["x"] * w + a
        return {"out": out, "stats": (out.sum(), [b * 2])}

    example = ({"x": torch.randn(3)}, (torch.randn(3), torch.randn(2)))
    compiled = tt.compile(f, example)
    assert "def forward(batch_x, pair_0, pair_1, params):" in compiled.code  # every tensor argument, read or not
    got = compiled(*example)
    assert set(got) == {"out", "stats"} and isinstance(got["stats"][1], list)
    got["stats"][0].backward()
    gw = w.grad.clone()
    w.grad = None
    f(*example)["stats"][0].backward()
    torch.testing.assert_close(gw, w.grad)
    torch.testing.assert_close(got["stats"][1][0], example[1][1] * 2)
    assert not got["stats"][1][0].requires_grad  # it did not depend on w


def test_factories_run_on_every_call():
    w = tt.randn(4, requires_grad=True)

    def f(x):
        n = x.shape[0]
        return x * w * torch.arange(n) + torch.randn(n) + torch.zeros(n, device=x.device)

    compiled = tt.compile(f, (torch.ones(4),))
    first, second = compiled(torch.ones(4)), compiled(torch.ones(4))
    assert not torch.equal(first, second)  # randn is drawn on every call, never frozen
    torch.manual_seed(3)
    got = compiled(torch.ones(4))
    torch.manual_seed(3)
    assert torch.equal(got, f(torch.ones(4)))


def test_random_ops_give_eager_values_under_the_same_seed():
    drop = tt.nn.Dropout(0.5)
    w = tt.randn(6, requires_grad=True)

    def f(x):
        return (drop(x * w) * torch.rand(6)).sum()

    compiled = tt.compile(f, (torch.ones(6),))
    results = []
    for fn in (f, compiled, compiled):
        torch.manual_seed(7)
        w.grad = None
        out = fn(torch.ones(6))
        out.backward()
        results.append((out.detach(), w.grad.clone()))
    for out, grad in results[1:]:
        torch.testing.assert_close(out, results[0][0], rtol=0, atol=0)
        torch.testing.assert_close(grad, results[0][1], rtol=0, atol=0)


def test_in_place_ops_appear_as_their_out_of_place_twins():
    w = tt.randn(3, requires_grad=True)

    def f(x):
        y = x * w
        y.add_(1)
        return torch.nn.functional.relu(y, inplace=True).sum()

    compiled = tt.compile(f, (torch.randn(3),))
    assert "torch.Tensor.add_: in place, recorded as its out-of-place twin" in compiled.code
    assert "torch.nn.functional.relu(inplace=True): in place" in compiled.code
    x = torch.randn(3)
    namespace: dict = {}
    exec(compiled.code, namespace)  # the code computes what the function does
    (out,), _ = namespace["forward"](x, {"w": w.detach().as_subclass(torch.Tensor)})
    torch.testing.assert_close(out, f(x.clone()).detach().as_subclass(torch.Tensor))
    compiled(x).backward()
    gw = w.grad.clone()
    w.grad = None
    f(x).backward()
    torch.testing.assert_close(gw, w.grad)


def test_a_round_trip_through_numpy_is_simply_python():
    w = tt.randn(3, requires_grad=True)
    f = tt.compile(lambda x: torch.from_numpy((x * w).detach().numpy()) * w, (torch.randn(3),))
    for _ in range(3):
        x = torch.randn(3)
        torch.testing.assert_close(f(x), (x * w).detach() * w, rtol=0, atol=0)


SCALE = {"value": 1.0}


class Scaled(tt.Function):
    """y = x -> dy/dx = s (s read from Python state: a rule the recorded code cannot follow)"""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return g * SCALE["value"]


def test_a_rule_reading_python_state_in_backward_reads_it_on_every_backward():
    def f(x):
        return Scaled.apply(x).sum()

    x = tt.randn(3, requires_grad=True)
    compiled = tt.compile(f, (x,), check_inputs=[(tt.randn(3, requires_grad=True),)])  # agrees: no error
    SCALE["value"] = 2.0
    try:
        compiled.check(tt.randn(3, requires_grad=True))  # the rule's backward runs as written: still agrees
        compiled(x).backward()
        torch.testing.assert_close(x.grad, torch.full((3,), 2.0))
    finally:
        SCALE["value"] = 1.0


def test_a_function_that_changes_python_state_counts_on_every_call():
    state = {"n": 0}
    w = tt.ones(2, requires_grad=True)

    def f(x):
        state["n"] += 1
        return x * w * state["n"]  # a Python counter: the function runs, so it counts

    compiled = tt.compile(f, (torch.ones(2),))
    for n in (1, 2, 3):
        torch.testing.assert_close(compiled(torch.ones(2)), torch.full((2,), float(n)))


def test_an_input_returned_as_an_output_still_gets_its_gradient():
    f = tt.compile(lambda a: (a, a.argmax(), a * 2), (tt.randn(3, requires_grad=True),))
    a = tt.randn(3, requires_grad=True)
    same, index, double = f(a)
    assert index.dtype == torch.int64 and not index.requires_grad
    (same.sum() + double.sum()).backward()
    torch.testing.assert_close(a.grad, torch.full((3,), 3.0))


def test_compiled_under_no_grad_is_plain_inference_code():
    model = tt.nn.Sequential(tt.nn.Linear(3, 4), tt.nn.ReLU())
    x = torch.randn(2, 3)
    with tt.no_grad():
        f = tt.compile(model, (x,))
        out = f(x)
    assert f.program.paths() == [[]]  # nothing records a gradient: nothing to check, the calls simply run
    torch.testing.assert_close(out, model(x).detach())


def test_multi_output_ops_views_and_item_assignment():
    w = tt.randn(4, 3, requires_grad=True)

    def f(x):
        a, b = (x * w).split(2)
        biggest = torch.max(a, dim=1)
        y = torch.stack(list(torch.cat([a, b.T.T], 0).unbind(0)))
        q = y.clone()
        q[0] = 5.0
        return biggest.values.sum() + q.sum() + y.chunk(3, dim=1)[1].sum() + y.mT.sum(), biggest.indices

    x = torch.randn(4, 3)
    compiled = tt.compile(f, (x,))
    with pytest.raises(tt.UnsupportedOperationError, match=r"writes into a tensor in place \(`t\[i\] = v`\)"):
        compiled.code  # (its code read q before the write: the numbers of the code were silently not eager's)
    loss, indices = compiled(x)
    loss.backward()
    got = w.grad.clone()
    w.grad = None
    expected, expected_indices = f(x)
    expected.backward()
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(got, w.grad)
    assert torch.equal(indices, expected_indices)


def test_changing_an_input_that_needs_a_gradient_in_place_changes_it_as_eager():
    w = tt.randn(3, requires_grad=True)

    def f(x):
        x.mul_(2)
        return x.sum()

    compiled = tt.compile(f, (w * 1,))
    for _ in range(2):
        x = w * 1
        compiled(x).backward()
        assert torch.equal(x, w * 2)
    torch.testing.assert_close(w.grad, torch.full((3,), 4.0))


def test_a_buffer_changed_in_place_without_gradient_is_changed_by_every_call():
    counter = torch.zeros(())

    def f(x):
        counter.add_(1)
        return x * 2

    compiled = tt.compile(f, (tt.randn(2, requires_grad=True),))
    compiled(tt.randn(2, requires_grad=True))
    compiled(tt.randn(2, requires_grad=True))
    assert counter.item() == 2.0


@pytest.mark.parametrize("program", ["view_then_base_changed", "view_changed"])
def test_recorded_in_place_changes_shared_with_a_view_give_eagers_gradient(program):
    def f(x):
        y = x * 1
        v = y[1:]
        (y if program == "view_then_base_changed" else v).mul_(x[0])
        return (v * v).sum()

    compiled = tt.compile(f, (tt.randn(3, requires_grad=True),))
    for seed in range(3):
        x = tt.as_tracer(torch.randn(3, generator=torch.Generator().manual_seed(seed)), requires_grad=True)
        compiled(x).backward()
        got = x.grad.clone()
        x.grad = None
        f(x).backward()
        torch.testing.assert_close(got, x.grad, rtol=0, atol=0)


def test_a_view_of_a_buffer_changed_without_gradient_keeps_sharing_its_memory():
    def f(x):
        y = torch.zeros_like(x)
        v = y[:2]
        y.add_(1)  # not recorded: stays an in-place call on the same memory in the code
        return (v * x[:2]).sum()

    x = tt.randn(3, requires_grad=True)
    compiled = tt.compile(f, (x,))
    compiled(x).backward()
    got = x.grad.clone()
    x.grad = None
    f(x).backward()
    torch.testing.assert_close(got, x.grad)
    assert torch.equal(got[:2], torch.ones(2))


@pytest.mark.parametrize("arguments, error, message", [
    ((5, ()), TypeError, "takes a function"),
    ((None, ()), TypeError, "takes a function"),
    ((lambda x: x, (), None, 1e-5, 2.5), TypeError, "verify"),
    ((lambda x: x, (), None, 1e-5, -1), ValueError, "verify"),
    ((lambda x: x, (), None, -1.0), ValueError, "check_tolerance"),
])
def test_compile_refuses_arguments_of_the_wrong_kind_when_called(arguments, error, message):
    """Each was accepted: the error came at the first call (or verify=2.5 ran three checks and left -0.5)."""
    with pytest.raises(error, match=message):
        tt.compile(*arguments)
