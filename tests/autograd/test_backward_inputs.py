"""backward(inputs=), tt.grad(is_grads_batched=True) and a write through a detached alias, as torch does them.

Each case runs the same program on tracers and on torch tensors that require grad and compares every .grad (None
included) and every error; the gradients themselves are also checked against central finite differences.
"""
import pytest
import torch

import torchtrace as tt


def _leaves(lib):
    make = (lambda v: torch.tensor(v, dtype=torch.float64, requires_grad=True)) if lib == "torch" else (
        lambda v: tt.tracer(v, dtype=torch.float64, requires_grad=True))
    return make([1.0, 2.0]), make([3.0, -4.0]), make([5.0])


def _program(a, b):
    y = a * b
    y.retain_grad()
    return y, (torch.sin(y) * 2 + a).sum()


def _grads(*tensors):
    return [None if t.grad is None else t.grad.tolist() for t in tensors]


def _run(lib, chosen):
    a, b, c = _leaves(lib)
    y, z = _program(a, b)
    named = {"a": a, "b": b, "c": c, "y": y}
    outcomes = []
    for names in chosen:
        try:
            z.backward(inputs=[named[n] for n in names], retain_graph=True)
            outcomes.append(_grads(a, b, c, y))
        except RuntimeError as error:
            outcomes.append(str(error))
    return outcomes


@pytest.mark.parametrize("chosen", [
    [("a",)], [("b",), ("b",)], [("y",)], [("y", "b")], [("a",), ("y",), ("a", "b", "y")], [("c",)], [()],
])
def test_backward_inputs_accumulates_only_into_them_as_torch(chosen):
    assert _run("tt", chosen) == _run("torch", chosen)


def test_backward_inputs_gradients_equal_finite_differences():
    a, b, _ = _leaves("tt")
    _, z = _program(a, b)
    z.backward(inputs=[b])
    assert a.grad is None

    def loss(b_values):
        return float((torch.sin(a.detach().as_subclass(torch.Tensor) * b_values) * 2).sum())

    eps = 1e-6
    base = b.detach().as_subclass(torch.Tensor)
    numeric = [(loss(base + eps * e) - loss(base - eps * e)) / (2 * eps) for e in torch.eye(2, dtype=torch.float64)]
    assert torch.allclose(b.grad, torch.tensor(numeric, dtype=torch.float64), atol=1e-6)


def test_backward_inputs_of_a_non_leaf_that_is_not_retained_fills_its_grad_as_torch():
    results = []
    for lib in ("torch", "tt"):
        a, _, _ = _leaves(lib)
        h = a * 3
        (h * h).sum().backward(inputs=[h])
        results.append((h.grad.tolist(), a.grad))
    assert results[0] == results[1] == ([6.0, 12.0], None)


def test_the_function_form_takes_inputs_too():
    got = []
    for lib, backward in (("torch", torch.autograd.backward), ("tt", tt.backward)):
        a, b, _ = _leaves(lib)
        _, z = _program(a, b)
        backward([z], inputs=[a])
        got.append(_grads(a, b))
    assert got[0] == got[1]


def test_hooks_of_a_leaf_not_among_the_inputs_do_not_run():
    a, b, _ = _leaves("tt")
    seen = []
    b.register_hook(lambda g: seen.append(g))
    _, z = _program(a, b)
    z.backward(inputs=[a])
    assert seen == [] and b.grad is None and a.grad is not None


def _batched(lib, create_graph=False):
    x = torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64, requires_grad=True) if lib == "torch" else tt.tracer(
        [0.5, -1.0, 2.0], dtype=torch.float64, requires_grad=True)
    out = x * x.sin()
    rows = torch.eye(3, dtype=torch.float64) + 0.5
    grad = torch.autograd.grad if lib == "torch" else tt.grad
    return x, grad(out, x, rows, is_grads_batched=True, create_graph=create_graph)


def test_grads_batched_gives_one_vector_jacobian_product_per_row_as_torch():
    _, (ours,) = _batched("tt")
    _, (theirs,) = _batched("torch")
    assert ours.shape == (3, 3)
    assert torch.allclose(ours, theirs)
    x = torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64)
    jacobian = torch.autograd.functional.jacobian(lambda v: v * v.sin(), x)
    assert torch.allclose(ours, (torch.eye(3, dtype=torch.float64) + 0.5) @ jacobian)
    eps = 1e-6
    numeric = torch.stack([((x + eps * e) * (x + eps * e).sin() - (x - eps * e) * (x - eps * e).sin()) / (2 * eps)
                           for e in torch.eye(3, dtype=torch.float64)], dim=1)
    assert torch.allclose(ours, (torch.eye(3, dtype=torch.float64) + 0.5) @ numeric, atol=1e-6)


def test_grads_batched_with_create_graph_records_the_rows():
    x, (rows,) = _batched("tt", create_graph=True)
    (second,) = tt.grad(rows.sum(), x)
    xt, (rows_t,) = _batched("torch", create_graph=True)
    (second_t,) = torch.autograd.grad(rows_t.sum(), xt)
    assert torch.allclose(second, second_t)


def test_grads_batched_without_batched_gradients_names_what_to_pass():
    x = tt.tracer([1.0, 2.0], requires_grad=True)
    with pytest.raises(RuntimeError, match="leading batch dimension"):
        tt.grad((x * x).sum(), x, is_grads_batched=True)


def _write_through_a_detached_view(lib, make):
    x = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64, requires_grad=True) if lib == "torch" else tt.tracer(
        [1.0, 2.0, 3.0], dtype=torch.float64, requires_grad=True)
    y = make(x)
    y.detach()[0].zero_()
    try:
        (y * torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)).sum().backward()
        return y.tolist(), x.grad.tolist()
    except RuntimeError as error:
        return "raised", "modified by an in" in str(error)


@pytest.mark.parametrize("make", [lambda x: x * 2, lambda x: x.exp(), lambda x: x.sin() * 1, lambda x: x.view(3) * 1,
                                  lambda x: torch.tanh(x)], ids=["mul", "exp", "sin", "view", "tanh"])
def test_a_write_through_a_detached_view_is_as_in_torch(make):
    """torch accepts using the tensor; a backward that needs a saved copy of it raises (its version changed)."""
    assert _write_through_a_detached_view("tt", make) == _write_through_a_detached_view("torch", make)


def test_a_change_under_no_grad_is_outside_the_graph_as_in_torch():
    results = []
    for lib in ("torch", "tt"):
        x = torch.tensor([1.0, 2.0], requires_grad=True) if lib == "torch" else tt.tracer([1.0, 2.0],
                                                                                         requires_grad=True)
        y = x * 1
        view = y.view(2)
        with torch.no_grad():
            view.mul_(10)
        (y * 2).sum().backward()
        results.append((y.tolist(), x.grad.tolist()))
    assert results[0] == results[1] == ([10.0, 20.0], [2.0, 2.0])


@pytest.mark.parametrize("lib", ["torch", "tt"])
def test_a_non_leaf_among_inputs_keeps_retaining_its_gradient(lib):
    """backward(inputs=[y]) retains y's gradient from then on, as torch's retain_grad(): a later backward adds to it.
    d/dy sum(y*y) = 2y = [6, 12] each time; x gets 3 * 2y once."""
    x = torch.tensor([1.0, 2.0], dtype=torch.float64, requires_grad=True) if lib == "torch" else tt.tracer(
        [1.0, 2.0], dtype=torch.float64, requires_grad=True)
    y = x * 3
    z = (y * y).sum()
    z.backward(inputs=[y], retain_graph=True)
    assert y.retains_grad and y.grad.tolist() == [6.0, 12.0] and x.grad is None
    z.backward()
    assert y.grad.tolist() == [12.0, 24.0] and x.grad.tolist() == [18.0, 36.0]
