"""memory.optimise: the generated code frees values after their last use and computes into dead buffers in place,
without ever changing a value that is still read, an input, a parameter or a tensor saved for backward."""
import torch

import torchtrace as tt
from torchtrace.compiler.memory import Notes, optimise, statements


def _run_twice(fn, *inputs):
    """Gradients of the inputs from eager torchtrace and from the compiled code (second call: generated code)."""
    leaves = [tt.tracer(x.clone(), requires_grad=True) for x in inputs]
    eager_out = fn(*leaves)
    eager = tt.grad(eager_out, leaves)
    compiled = tt.compile(fn, tuple(leaves))
    compiled(*leaves)
    originals = [x.detach().clone() for x in leaves]
    out = compiled(*leaves)
    got = tt.grad(out, leaves)
    for x, before in zip(leaves, originals):  # the compiled code wrote into no input
        assert torch.equal(torch.Tensor.as_subclass(x, torch.Tensor), before)
    torch.testing.assert_close(torch.Tensor.as_subclass(out, torch.Tensor), torch.Tensor.as_subclass(eager_out,
                                                                                                      torch.Tensor))
    for g, e in zip(got, eager):
        torch.testing.assert_close(g, e, rtol=0, atol=0)
    return compiled.code


def test_dead_values_are_deleted_and_dead_buffers_reused():
    code = _run_twice(lambda x: (x.exp() * 2 + 1).sin().sum(), torch.randn(5, 3, dtype=torch.float64))
    assert "del " in code
    assert ".mul_(_2_f64)" in code and ".add_(_1_f64)" in code  # forward: exp's result is dead once multiplied
    backward = code.split("def backward")[1]
    assert "_(" in backward  # the backward's elementwise chain reuses its buffers too


def test_a_value_read_later_is_never_overwritten():
    def f(x):
        a = x.exp()
        b = a * 3  # a is read again below: b must get memory of its own
        return (a + b * b).sum()

    code = _run_twice(f, torch.randn(4, dtype=torch.float64))
    forward = code.split("def backward")[0]
    assert "exp(" in forward and "_3_f64)" in forward and ".mul_(_3_f64)" not in forward


def test_a_live_view_keeps_its_base_from_being_overwritten():
    def f(x):
        a = x.exp()
        first = a[0]  # a view of a, read after a's last direct use
        b = a * 2
        return b.sum() + (first * first).sum()

    code = _run_twice(f, torch.randn(3, 4, dtype=torch.float64))
    assert "_2_f64)" in code.split("def backward")[0] and ".mul_(_2_f64)" not in code.split("def backward")[0]


def test_inputs_parameters_and_saved_tensors_are_not_written():
    torch.manual_seed(0)
    model = tt.nn.Sequential(tt.nn.Linear(3, 4), tt.nn.Tanh(), tt.nn.Linear(4, 2))
    x = torch.randn(6, 3)
    weights = [p.detach().clone() for p in model.parameters()]
    step = tt.compile(lambda inputs: model(inputs).square().sum(), (x,))
    for _ in range(3):
        for p in model.parameters():
            p.grad = None
        step(x).backward()
    got = [p.grad.clone() for p in model.parameters()]
    for p in model.parameters():
        p.grad = None
    model(x).square().sum().backward()
    for g, p, w in zip(got, model.parameters(), weights):
        torch.testing.assert_close(g, p.grad, rtol=0, atol=0)
        assert torch.equal(torch.Tensor.as_subclass(p, torch.Tensor), w)


def test_the_second_operand_of_a_product_can_be_the_buffer():
    code = _run_twice(lambda x, w: (w + x * 2).sin().sum(), torch.randn(4, dtype=torch.float64),
                      torch.randn(4, dtype=torch.float64))
    assert ".add_(w)" in code.split("def backward")[0]  # w + t1 computed as t1.add_(w): w is an input


def test_no_del_inside_a_guard_and_names_read_by_it_stay_alive():
    lines = ["t1 = x.nonzero()", "if t1.shape != (2, 1):", "    raise GuardFailed('t1')", "t2 = t1.sum()"]
    notes = Notes()
    notes.defined.update({"t1": 0, "t2": 3})
    assert statements(lines) == [(0, 0), (1, 2), (3, 3)]
    assert optimise(lines, notes, ["t2"]) == [*lines, "del t1"]
