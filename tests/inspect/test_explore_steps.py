"""What a step of tt.explore shows: every node's value without wrapping the forward, local derivatives labelled
in their shapes, saved tensors named, a finite-difference check that holds across dtype casts, large values and
NaN, and hook notes only where hooks are. Numbers are compared with torch autograd (and finite differences)."""
import pytest
import torch
from helpers import WrongSquare
from test_explore import torch_gradients

import torchtrace as tt


def values_of(ex):
    return {n.label: n.value for n in ex.nodes}


def as_number(text):
    return float(text)


def test_micrograd_values_and_gradients_without_wrapping_the_forward():
    a, b, c, f = (tt.tracer(v, requires_grad=True) for v in (2.0, -3.0, 10.0, -2.0))
    e = a * b
    d = e + c
    L = d * f
    ex = tt.explore(L)
    ta, tb, tc, tf = (torch.tensor(v, requires_grad=True) for v in (2.0, -3.0, 10.0, -2.0))
    te = ta * tb
    td = te + tc
    tL = td * tf
    tL.backward()
    expected = {"a": ta, "b": tb, "c": tc, "f": tf, "Mul → e": te, "Add → d": td, "Mul → L": tL}
    shown = values_of(ex)
    assert {k: as_number(shown[k]) for k in expected} == {k: t.item() for k, t in expected.items()}
    assert (e.item(), d.item(), L.item()) == (-6.0, 4.0, -8.0)
    after = {s.name: as_number(s.after) for s in ex.steps if s.kind == "accumulate"}
    assert after == {"a": ta.grad.item(), "b": tb.grad.item(), "c": tc.grad.item(), "f": tf.grad.item()}
    assert all(n.value_note == "" for n in ex.nodes)


def test_a_value_nothing_holds_says_so_and_the_function_form_keeps_every_value():
    budget = tt.explore.keep_values()
    tt.explore.keep_values(0)  # weak references only: e = a * b is then held by nothing (Add saves nothing)
    try:
        a, b, c, f = (tt.tracer(v, requires_grad=True) for v in (2.0, -3.0, 10.0, -2.0))
        ex = tt.explore((a * b + c) * f)
    finally:
        tt.explore.keep_values(budget)
    (mul_e,) = [n for n in ex.nodes if n.label == "Mul" and n.value == ""]
    assert "not kept" in mul_e.value_note and "tt.explore(fn, *inputs)" in mul_e.value_note
    assert "keep_values" in mul_e.value_note
    assert values_of(ex)["Add"] == "4"  # d: saved by the last Mul's rule, read before the backward freed it
    assert ex.notice.startswith("1 of 7 values were not kept") and "tt.explore(fn, *inputs)" in ex.notice
    assert ex.data()["notice"] == ex.notice and ex.notice in repr(ex)

    ex = tt.explore(lambda a, b, c, f: (a * b + c) * f, *(torch.tensor(v) for v in (2.0, -3.0, 10.0, -2.0)))
    assert sorted(n.value for n in ex.nodes) == sorted(["2", "-3", "10", "-2", "-6", "4", "-8"])
    assert ex.notice == ""
    assert {s.name: s.after for s in ex.steps if s.kind == "accumulate"} == {"a": "6", "b": "-4", "c": "-2", "f": "4"}
    checks = [sent.check for s in ex.steps for sent in s.sent]
    assert checks and all(c.agrees for c in checks)  # the function form also checks every small step


def test_a_value_changed_in_place_afterwards_is_not_shown_as_the_ops_result():
    x = tt.tracer([1.0, 2.0], requires_grad=True)
    y = x * 2
    z = (y + 1).sum()  # Add saves nothing, so y may change afterwards
    y.add_(100.0)  # y now holds another node's result
    ex = tt.explore(z)
    (mul,) = [n for n in ex.nodes if n.label == "Mul"]
    assert mul.value == "" and "changed in place after this op (version 0 → 1)" in mul.value_note
    assert "[102, 104]" in mul.value_note  # what it holds now, named as such
    torch.testing.assert_close(x.grad, torch.tensor([2.0, 2.0]))


def test_small_model_in_function_form_shows_every_value_and_torchs_gradients():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    x = torch.randn(2, 3)
    w1, b1, w2, b2 = (p.detach().clone() for p in model.parameters())
    expected = torch_gradients(lambda w1, b1, w2, b2: (torch.tanh(x.to(w1.dtype) @ w1.T + b1) @ w2.T + b2)
                               .pow(2).mean(), [w1, b1, w2, b2])
    tt.port(model)
    ex = tt.explore(lambda x: model(x).pow(2).mean(), x)
    assert all(n.value for n in ex.nodes), [(n.label, n.value_note) for n in ex.nodes if not n.value]
    for p, want in zip(model.parameters(), expected):
        torch.testing.assert_close(p.grad, want)
    hidden = torch.tanh(x @ w1.T + b1)
    (tanh,) = [n for n in ex.nodes if n.label == "Tanh"]
    assert tanh.value == tt.inspect.explore.shown.tensor_text(hidden)


# --------------------------------------------------------------------------------- local derivatives


def sent_to(ex, rule, position=0):
    (step,) = [s for s in ex.steps if s.name.startswith(rule)]
    return step.sent[position]


def jacobian(fn, x):
    return torch.autograd.functional.jacobian(fn, x.double())


def test_cross_entropy_jacobian_keeps_the_logits_shape():
    torch.manual_seed(0)
    logits, target = torch.randn(3, 5), torch.tensor([0, 2, 4])
    ex = tt.explore(lambda z: torch.nn.functional.cross_entropy(z, target), logits)
    local = sent_to(ex, "CrossEntropy").local
    assert local.kind == "reduction" and local.shape == "d out () / d input (3, 5)"
    assert local.text.startswith("[[") and local.text.count("[") == 4  # three rows of five, not one row of 15
    want = jacobian(lambda z: torch.nn.functional.cross_entropy(z, target), logits)
    torch.testing.assert_close(torch.tensor(local.matrix, dtype=torch.float64).reshape(3, 5), want)


def test_broadcast_sum_elementwise_and_jacobian_block_are_labelled():
    torch.manual_seed(0)
    x, b, w = torch.randn(2, 3), torch.randn(3), torch.randn(3, 2)
    ex = tt.explore(lambda x, b, w: (torch.tanh(x + b) @ w).sum(), x, b, w)
    to_b = sent_to(ex, "Add", 1).local
    assert to_b.kind == "broadcast sum" and "summed over dim 0" in to_b.how
    assert to_b.text == "[[1, 1, 1], [1, 1, 1]]"  # d(x + b)/db elementwise, in the output's shape (2, 3)
    tanh = sent_to(ex, "Tanh").local
    assert tanh.kind == "elementwise" and tanh.shape == "d out (2, 3) / d input (2, 3)"
    h = torch.tanh(x + b)
    torch.testing.assert_close(torch.tensor(tanh.matrix, dtype=torch.float64).diagonal().reshape(2, 3),
                               (1 - h * h).double(),
                               rtol=1e-5, atol=1e-6)
    mm = sent_to(ex, "Matmul", 1).local
    assert mm.kind == "Jacobian block" and mm.shape == "d out (2, 2) / d input (3, 2)"
    want = jacobian(lambda w_: h.double() @ w_, w)  # (2, 2, 3, 2): the output's shape, then the input's
    torch.testing.assert_close(torch.tensor(mm.matrix, dtype=torch.float64).reshape(2, 2, 3, 2), want)
    assert mm.text.count("[") == 1 + 2 + 4 + 12  # nested as (2, 2, 3, 2)
    total = sent_to(ex, "Sum").local
    assert total.kind == "reduction" and total.text == "[[1, 1], [1, 1]]"


def test_saved_tensors_are_named():
    x = tt.tracer([[1.0, -2.0, 3.0, 0.5]], requires_grad=True)
    ex = tt.explore(lambda x: torch.nn.functional.max_pool1d(x, 2).sum() + torch.tanh(x).sum()
                    + x.masked_fill(x > 0, 0.0).sum(), x)
    saved = {s.name: [w for w, _ in s.saved] for s in ex.steps if s.saved}
    assert saved["MaxPool1dBackward"] == ["#0 indices", "#1 input 0 (x)"]  # (x: as torch's, for a second order)
    assert saved["TanhBackward"] == ["#1 output y"]
    assert saved["MaskedFillBackward"][0].startswith("#0 mask")
    a, b = tt.tracer(2.0, requires_grad=True), tt.tracer(-3.0, requires_grad=True)
    ex = tt.explore(a * b)
    assert [w for w, _ in ex.steps[0].saved] == ["#0 input 1 (b)", "#1 input 0 (a)"]


# ----------------------------------------------------------------------------------- the check


CHECKED = {
    "float64 to float32": (lambda x: (x.float() * 3).sum(), torch.tensor([1.5, -2.0, 0.3], dtype=torch.float64)),
    "float32 to float16": (lambda x: (x.half() * 3).sum(), torch.tensor([1.5, -2.0, 0.3])),
    "to(float16) then exp": (lambda x: x.to(torch.float16).exp().sum(), torch.tensor([1.5, -2.0, 0.3])),
    "sum(dtype=float64)": (lambda x: (x * x).sum(dtype=torch.float64), torch.tensor([1.5, -2.0, 0.3])),
    "sum(dtype=float16)": (lambda x: (x * x).sum(dtype=torch.float16), torch.tensor([1.5, -2.0, 0.3])),
    "values near 1e26": (lambda x: (x * x * 2e-26).sum(), torch.tensor([1e26, -3e26], dtype=torch.float64)),
    "float32 near 1e26": (lambda x: (x * 2.0).sum(), torch.tensor([1e26, -3e26])),
    "float32 tanh near saturation": (lambda x: torch.tanh(x).sum(), torch.tensor([0.88, 3.0, 5.5, 12.0])),
}


@pytest.mark.parametrize("name", CHECKED)
def test_check_agrees_for_correct_rules_across_casts_and_large_values(name):
    fn, x = CHECKED[name]
    ex = tt.explore(fn, x)
    checks = [sent.check for s in ex.steps for sent in s.sent]
    assert checks and all(c.estimate is not None for c in checks)
    assert all(c.agrees for c in checks), [str(c) for c in checks]
    (leaf,) = [s for s in ex.steps if s.kind == "accumulate"]
    reference = x.detach().clone().requires_grad_()
    fn(reference).backward()
    assert leaf.after == tt.inspect.explore.shown.tensor_text(reference.grad)  # torch autograd's gradient


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("scale", [1.0, 1e10, 1e-10])
def test_check_catches_a_wrong_rule_at_any_scale(scale, dtype):
    x = tt.tracer(torch.tensor([1.0, 3.0], dtype=dtype) * scale, requires_grad=True)
    ex = tt.explore(lambda x: WrongSquare.apply(x).sum(), x)
    (step,) = [s for s in ex.steps if s.name == "WrongSquareBackward"]
    assert step.sent[0].check.agrees is False  # the rule says x, finite differences 2x


def test_nan_gradients_are_reported_as_nan_and_no_hook_is_blamed():
    x = tt.tracer([-1.0, 4.0], requires_grad=True)
    ex = tt.explore(lambda x: torch.sqrt(x).sum(), x)
    reference = torch.tensor([-1.0, 4.0], requires_grad=True)
    torch.sqrt(reference).sum().backward()
    assert reference.grad[0].isnan() and x.grad[0].isnan()
    (leaf,) = [s for s in ex.steps if s.kind == "accumulate"]
    assert leaf.after == "[NaN, 0.25]"
    assert not any(s.note for s in ex.steps)
    checks = [sent.check for s in ex.steps for sent in s.sent]
    assert all(c.agrees for c in checks), [str(c) for c in checks]
    sqrt = sent_to(ex, "Sqrt").local
    assert sqrt.kind == "elementwise" and sqrt.text == "[NaN, 0.25]"
    big = tt.tracer(torch.full((20,), -1.0), requires_grad=True)
    ex = tt.explore(torch.sqrt(big).sum())
    assert [s.after for s in ex.steps if s.kind == "accumulate"] == ["(20): 20 NaN of 20"]


def test_a_hook_that_makes_nan_is_still_named():
    x = tt.tracer([1.0, 2.0], requires_grad=True)
    h = x * 3
    h.register_hook(lambda g: g * float("nan"))
    ex = tt.explore(h.sum())
    (mul,) = [s for s in ex.steps if s.name.startswith("Mul")]
    assert mul.upstream == "[NaN, NaN]" and "a hook replaced the upstream gradient" in mul.note


def test_a_hook_that_keeps_the_gradient_is_not_named():
    x = tt.tracer([1.0, float("nan")], requires_grad=True)
    h = x * 3
    h.register_hook(lambda g: g)
    ex = tt.explore((h * 2).sum())
    assert not any(s.note for s in ex.steps)


def test_a_large_graph_still_labels_its_first_small_steps():
    torch.manual_seed(0)
    layers = [torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh()) for _ in range(40)]
    model = tt.port(torch.nn.Sequential(*layers))
    x = torch.randn(4, 8)
    ex = tt.explore(model(x).pow(2).mean())
    assert len(ex.nodes) > 64
    mean = sent_to(ex, "Mean").local
    assert mean.kind == "reduction" and mean.text == "[" + ", ".join(["[" + ", ".join(["0.03125"] * 8) + "]"] * 4) + "]"
    labelled = [s for s in ex.steps if s.kind == "rule" and s.sent[0].local is not None]
    assert len(labelled) < sum(1 for s in ex.steps if s.kind == "rule")  # a bounded amount of work, not every step
