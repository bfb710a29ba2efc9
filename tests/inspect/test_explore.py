"""tt.explore: the backward it runs leaves every .grad as output.backward() does (checked against torch autograd and
finite differences), and its steps hold the numbers of each rule applied and each sum into a leaf."""
import json
import re

import pytest
import torch
from helpers import WrongSquare

import torchtrace as tt
from torchtrace.inspect.explore.shown import tensor_text


def torch_gradients(fn, values, gradient=None):
    """Torch autograd's gradients of fn at `values`, after torch.autograd.gradcheck confirmed them in float64."""
    doubles = [v.detach().double().requires_grad_() for v in values]
    assert torch.autograd.gradcheck(lambda *xs: fn(*xs), doubles)  # torch agrees with finite differences here
    leaves = [v.detach().clone().requires_grad_() for v in values]
    fn(*leaves).backward(gradient)
    return [leaf.grad for leaf in leaves]


def explored(fn, values, **kwargs):
    leaves = [tt.tracer(v, requires_grad=True) for v in values]
    ex = tt.explore(fn(*leaves), **kwargs)
    return ex, [leaf.grad for leaf in leaves]


def backward_gradients(fn, values, gradient=None):
    leaves = [tt.tracer(v, requires_grad=True) for v in values]
    fn(*leaves).backward(gradient)
    return [leaf.grad for leaf in leaves]


CASES = {
    "micrograd": (lambda a, b, c, f: (a * b + c) * f, [torch.tensor(v) for v in (2.0, -3.0, 10.0, -2.0)]),
    "broadcast": (lambda x, w, b: (torch.tanh(x * w + b) ** 2).sum(),
                  [torch.randn(2, 3), torch.randn(3), torch.randn(1)]),
    "fan_out": (lambda x: (x * x + x.exp() * x).sum(), [torch.randn(4)]),
    "split": (lambda x: (lambda p, q: p.sum() * 2 + (q ** 2).sum())(*x.split([2, 3])), [torch.randn(5)]),
    "matmul": (lambda a, b: torch.relu(a @ b).mean(), [torch.randn(3, 4), torch.randn(4, 2)]),
    "large": (lambda w: (w.sin() * w).sum(), [torch.randn(40)]),
}


@pytest.mark.parametrize("name", CASES)
def test_gradients_are_those_of_a_plain_backward_torch_autograd_and_finite_differences(name):
    fn, values = CASES[name]
    ex, got = explored(fn, values)
    for mine, plain, theirs in zip(got, backward_gradients(fn, values), torch_gradients(fn, values)):
        assert torch.equal(mine, plain)  # exactly what output.backward() leaves
        torch.testing.assert_close(mine, theirs)
    assert ex.steps and all(s.kind in ("rule", "accumulate") for s in ex.steps)


def test_a_non_scalar_output_takes_its_gradient():
    fn, values = (lambda x: x * x * 3), [torch.tensor([1.0, -2.0])]
    seed = torch.tensor([0.5, 2.0])
    ex, got = explored(fn, values, gradient=seed)
    torch.testing.assert_close(got[0], torch_gradients(fn, values, seed)[0])
    assert ex.steps[0].upstream == "[0.5, 2]"


def test_micrograd_steps_carry_every_number_of_the_chain_rule():
    a, b, c, f = (tt.tracer(v, requires_grad=True) for v in (2.0, -3.0, 10.0, -2.0))
    e = a * b
    d = e + c
    L = d * f
    ex = tt.explore(L)  # names come from these variables
    by_name = {s.name: s for s in ex.steps}
    mul_l, add_d, mul_e = by_name["MulBackward → L"], by_name["AddBackward → d"], by_name["MulBackward → e"]
    assert mul_l.upstream == "1" and [s.gradient for s in mul_l.sent] == ["-2", "4"]  # dL/dd = f, dL/df = d
    assert add_d.upstream == "-2" and [s.gradient for s in add_d.sent] == ["-2", "-2"]
    assert mul_e.upstream == "-2" and [s.gradient for s in mul_e.sent] == ["6", "-4"]  # -2 * b, -2 * a
    assert [s.local_text for s in mul_e.sent] == ["-3", "2"]  # the local derivatives: b and a
    assert mul_l.math.startswith("z = a * b  ->  dz/da = b, dz/db = a")
    assert [(s.name, s.after) for s in ex.steps if s.kind == "accumulate"] == [
        ("f", "4"), ("c", "-2"), ("b", "-4"), ("a", "6")]
    text = str(mul_e)
    assert "upstream gradient: -2" in text and "-> input 0: a: -2 x local -3 = 6" in text
    assert "saved #0 input 1 (b): -3" in text and "saved #1 input 0 (a): 2" in text  # what the rule saved, named


def test_a_tensor_used_twice_shows_the_sum_of_its_gradients():
    x = tt.tracer([1.0, 2.0], requires_grad=True)
    h = x * 3
    y = (h * h).sum()
    ex = tt.explore(y)
    (step,) = [s for s in ex.steps if s.name == "MulBackward → h"]
    assert step.upstream == "[6, 12]"  # 2 h = [6, 12], the sum of the two uses, each sending h = [3, 6]
    assert [g for _, g in step.parts] == ["[3, 6]", "[3, 6]"]
    assert "upstream gradient: [6, 12] = [3, 6] (from" in str(step)
    accumulate = [s for s in ex.steps if s.kind == "accumulate"]
    assert [(s.name, s.after) for s in accumulate] == [("x", "[18, 36]")]  # 3 * 2h = 18 x


def test_accumulation_into_a_gradient_left_by_an_earlier_backward():
    w = tt.tracer([1.0, 2.0], requires_grad=True)
    (w * 2).sum().backward()
    ex = tt.explore((w * w).sum())
    (step,) = [s for s in ex.steps if s.kind == "accumulate"]
    assert (step.before, step.upstream, step.after) == ("[2, 2]", "[2, 4]", "[4, 6]")
    assert "⊕ w.grad = [2, 2] + [2, 4] = [4, 6]" in str(step)
    assert torch.equal(w.grad, torch.tensor([4.0, 6.0]))


def test_large_tensors_are_written_as_shape_and_summary():
    assert tensor_text(torch.arange(16.0)) == "[" + ", ".join(str(i) for i in range(16)) + "]"
    assert tensor_text(torch.arange(17.0)) == "(17): mean 8, min 0, max 16"
    w = tt.randn(5, 4, requires_grad=True)
    ex = tt.explore((w * 2).sum())
    assert re.search(r"⊕ w.grad = \(5, 4\): mean 2, min 2, max 2", str(ex))


# ------------------------------------------------------------------------------------------ names


def test_ported_torch_model_names_its_parameters_and_modules():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    reference = [p.detach().clone().requires_grad_() for p in model.parameters()]
    x = torch.randn(5, 3)
    tt.port(model)
    ex = tt.explore(model(x).pow(2).mean())
    names = {s.name for s in ex.steps if s.kind == "accumulate"}
    assert names == {"0.weight", "0.bias", "2.weight", "2.bias"}
    assert {s.module for s in ex.steps if s.kind == "rule"} >= {"0", "1", "2"}
    w1, b1, w2, b2 = reference
    loss = (torch.tanh(x @ w1.T + b1) @ w2.T + b2).pow(2).mean()
    loss.backward()
    for p, r in zip(model.parameters(), reference):
        torch.testing.assert_close(p.grad, r.grad)


def test_params_name_leaves():
    x = tt.tracer([1.0, 2.0], requires_grad=True)
    ex = tt.explore((x * 2).sum(), params={"weights": x})
    assert [s.name for s in ex.steps if s.kind == "accumulate"] == ["weights"]


# ----------------------------------------------------------------------------------- the check


def test_check_agrees_for_correct_rules_when_the_forward_was_recorded():
    x = tt.tracer([0.5, -1.0, 2.0], requires_grad=True)
    w = tt.tracer([[1.0, 2.0, 3.0], [0.0, -1.0, 1.0]], requires_grad=True)
    with tt.recording():
        y = torch.sigmoid(w @ x).sum()
    ex = tt.explore(y)
    checks = [sent.check for s in ex.steps for sent in s.sent]
    assert checks and all(c.agrees for c in checks), [str(c) for c in checks]
    matmul = next(s for s in ex.steps if s.name.startswith("Mv") or s.name.startswith("Matmul"))
    assert len(matmul.sent[0].check.estimate) == 2 and len(matmul.sent[0].check.estimate[0]) == 6  # d(2)/d(2x3)




def test_check_catches_a_wrong_rule():
    x = tt.tracer([1.0, 3.0], requires_grad=True)
    with tt.recording():
        y = WrongSquare.apply(x).sum()
    ex = tt.explore(y)
    (step,) = [s for s in ex.steps if s.name == "WrongSquareBackward"]
    check = step.sent[0].check
    assert check.agrees is False and check.rule == [[1.0, 0.0], [0.0, 3.0]]
    torch.testing.assert_close(torch.tensor(check.estimate, dtype=torch.double),
                               torch.tensor([[2.0, 0.0], [0.0, 6.0]], dtype=torch.double))
    assert "DIFFERS" in str(step)


def test_without_recording_the_check_says_how_to_get_it():
    x = tt.tracer([1.0, 3.0], requires_grad=True)
    ex = tt.explore((x * x).sum())
    check = ex.steps[1].sent[0].check
    assert check.estimate is None and "tt.recording()" in check.why_not
    locals_ = [s.local for s in ex.steps[1].sent]  # d(a b)/da = b = x, known all the same
    assert [(local.kind, local.text) for local in locals_] == [("elementwise", "[1, 3]")] * 2


# ------------------------------------------------------------------------------------ the page


def test_saved_page_is_one_self_contained_file(tmp_path):
    x = tt.tracer([1.0, 2.0], requires_grad=True)
    ex = tt.explore((x * x).sum())
    path = ex.save(tmp_path / "backward.html")
    page = open(path, encoding="utf-8").read()
    assert "torchtracePlayer(" in page and ".tt-player" in page
    assert not re.search(r"<script[^>]+src=|<link|@import|url\((?!#)|https?://(?!www\.w3\.org/2000/svg)", page)
    data = json.loads(re.search(r"const TORCHTRACE_DATA = (.*);\n", page).group(1))
    assert [s["name"] for s in data["steps"]] == [s.name for s in ex.steps]
    assert len(data["nodes"]) == 3 and [e["gradient"] for e in data["edges"]] == ["[1, 1]", "[1, 2]", "[1, 2]"]


def test_a_closing_script_tag_in_a_name_cannot_end_the_page_script(tmp_path):
    x = tt.tracer([1.0], requires_grad=True)
    page = open(tt.explore(x * 2, params={"</script><b>": x}, gradient=torch.ones(1)).save(tmp_path / "p.html"),
                encoding="utf-8").read()
    assert page.count("</script>") == 1


def test_widget_carries_the_same_data():
    pytest.importorskip("anywidget")
    x = tt.tracer([1.0, 2.0], requires_grad=True)
    ex = tt.explore((x * x).sum())
    widget = ex.widget()
    assert json.loads(widget.data) == json.loads(json.dumps(ex.data()))
    assert "torchtracePlayer" in widget._esm and "export default" in widget._esm
    bundle, _ = ex._repr_mimebundle_()  # ipywidgets' (data, metadata)
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert bundle["text/plain"] == "<tt.explore: 3 steps (2 rules, 1 sums into .grad)>"


def test_explore_is_public():
    assert "explore" in dir(tt) and "explore" in tt.__all__


def test_explore_refuses_an_output_without_gradient():
    with pytest.raises(RuntimeError, match="requires grad"):
        tt.explore(tt.tracer([1.0]) * 2)


# ------------------------------------------------------------------------------- shapes of graphs


def test_an_op_with_several_outputs_gathers_one_gradient_per_output():
    x = tt.tracer([1.0, 2.0, 3.0, 4.0, 5.0], requires_grad=True)
    p, q = x.split([2, 3])
    ex = tt.explore(p.sum() * 2 + (q * q).sum())
    (split,) = [s for s in ex.steps if s.name.startswith("Split")]
    assert split.gathered and split.upstream == "[2, 2]; [6, 8, 10]"  # not summed: one per output
    assert "one per output" in str(split) and " = " not in str(split).split("upstream gradients")[1].split("\n")[0]
    assert [s.gradient for s in split.sent] == ["[2, 2, 6, 8, 10]"]
    torch.testing.assert_close(x.grad, torch.tensor([2.0, 2.0, 6.0, 8.0, 10.0]))


def test_a_hook_that_replaces_a_gradient_is_named_in_the_step():
    x = tt.tracer([1.0, 2.0], requires_grad=True)
    h = x * 3
    h.register_hook(lambda g: g * 10)
    ex = tt.explore(h.sum())
    (mul,) = [s for s in ex.steps if s.name.startswith("Mul")]
    assert mul.upstream == "[10, 10]" and "a hook replaced the upstream gradient" in mul.note
    assert "summed to [1, 1]" in mul.note
    torch.testing.assert_close(x.grad, torch.tensor([30.0, 30.0]))  # torch: d(sum 3x)/dx = 3, times the hook's 10


def test_a_list_of_tensors_names_them_by_their_variables():
    weight, other = tt.tracer([1.0, 2.0], requires_grad=True), tt.tracer([3.0], requires_grad=True)
    ex = tt.explore((weight * other).sum(), params=[weight, tt.tracer([0.0])])
    assert sorted(s.name for s in ex.steps if s.kind == "accumulate") == ["other", "weight"]
    ex = tt.explore((weight * 2).sum(), params=iter([weight]))
    assert [s.name for s in ex.steps if s.kind == "accumulate"] == ["weight"]


def test_exploring_a_leaf_fills_its_grad_with_ones():
    x = tt.tracer(2.0, requires_grad=True)
    ex = tt.explore(x)
    assert [(s.kind, s.after) for s in ex.steps] == [("accumulate", "1")] and x.grad.item() == 1.0


def test_check_of_a_non_contiguous_input():
    w = tt.tracer(torch.arange(6.0).reshape(2, 3), requires_grad=True)
    with tt.recording():
        y = (w.t() * tt.tracer([1.0, 2.0])).sum()  # Mul gets the transposed (non-contiguous) view
    checks = [sent.check for s in tt.explore(y).steps for sent in s.sent]
    assert checks and all(c.agrees for c in checks), [str(c) for c in checks]


# ----------------------------------------------------------------------------- the diagnosis layer's API


def micrograd():
    a, b, c, f = (tt.tracer(v, requires_grad=True) for v in (2.0, -3.0, 10.0, -2.0))
    e = a * b
    d = e + c
    L = d * f
    return tt.explore(L), (a, b, c, d, e, f, L)


def test_annotate_marks_a_nodes_step_in_the_page_data():
    ex, (a, b, c, d, e, f, L) = micrograd()
    ex.annotate(e.grad_fn, "saturated", "e's gradient is small", severity="info")
    ex.annotate(ex.steps[-1], "killed", "a's gradient is zero")
    ex.annotate(0, "exploding", "too large", "error")
    findings = ex.data()["findings"]
    e_step = next(s for s in ex.steps if s.name == "MulBackward → e")
    assert [(f["node"], f["kind"], f["severity"]) for f in findings] == [
        (e_step.node, "saturated", "info"), (ex.steps[-1].node, "killed", "warn"),
        (ex.steps[0].node, "exploding", "error")]
    with pytest.raises(ValueError, match="severity"):
        ex.annotate(0, "x", "y", severity="fatal")
    other = tt.tracer(1.0, requires_grad=True) * 2
    with pytest.raises(ValueError, match="not a node of this graph"):
        ex.annotate(other.grad_fn, "x", "y")
    with pytest.raises(IndexError):
        ex.annotate(len(ex.steps), "x", "y")


def test_side_by_side_pairs_steps_of_two_explorations(tmp_path):
    from torchtrace.inspect.explore import side_by_side

    ex_a, _ = micrograd()
    ex_b, _ = micrograd()
    both = side_by_side(ex_a, ex_b, [(0, 0), (2, 2), (4, 4)], first=1, titles=("float32", "float64"))
    page = open(both.save(tmp_path / "both.html"), encoding="utf-8").read()
    data = json.loads(re.search(r"const TORCHTRACE_DATA = (.*);\n", page).group(1))
    assert data["pairs"] == [[0, 0], [2, 2], [4, 4]] and data["first"] == 1 and data["titles"] == ["float32", "float64"]
    assert [s["name"] for s in data["players"][1]["steps"]] == [s.name for s in ex_b.steps]
    assert "<iframe srcdoc=" in both._repr_html_() and "&lt;script&gt;" in both._repr_html_()
    with pytest.raises(IndexError):
        side_by_side(ex_a, ex_b, [(0, 7)])
    with pytest.raises(IndexError):
        side_by_side(ex_a, ex_b, [(0, 0)], first=1)


def test_without_anywidget_jupyter_shows_the_page_in_an_iframe(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_anywidget(name, *args, **kwargs):
        if name.startswith("anywidget") or name == "torchtrace.inspect.explore.widget":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    ex, _ = micrograd()
    monkeypatch.setattr(builtins, "__import__", no_anywidget)
    bundle = ex._repr_mimebundle_()
    assert bundle["text/plain"] == repr(ex) and bundle["text/html"].startswith("<iframe srcdoc=")
    assert "torchtracePage(" in bundle["text/html"]


def test_values_noted_by_recording_stand_in_for_lost_ones():
    x = tt.tracer(torch.arange(1.0, 21.0), requires_grad=True)
    budget = tt.explore.keep_values()
    tt.explore.keep_values(0)  # the graph keeps no value itself
    try:
        with tt.recording():
            out = (x * 2).exp().sum()  # exp saves its result; x * 2 (20 elements) is held by nothing
        ex = tt.explore(out)
    finally:
        tt.explore.keep_values(budget)
    (mul,) = [n for n in ex.nodes if n.label == "Mul"]
    assert mul.value.startswith("|value| ") and mul.value_note == ""
    torch.testing.assert_close(float(mul.value.split()[1]), (torch.arange(1.0, 21.0) * 2).norm().item(), rtol=1e-3,
                               atol=0)
