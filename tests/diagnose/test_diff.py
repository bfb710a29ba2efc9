"""tt.diff: two backward passes aligned rule by rule; the first divergence, the largest ones, and the player."""
import pytest
import torch
from doctor_models import WrongTanh, batch, build, line_of, loss_fn

import torchtrace as tt


def mlp(act="tanh"):
    torch.manual_seed(0)
    model = tt.port(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3)))
    return model, tt.randn(16, 4)


def test_identical_functions_do_not_diverge_and_gradients_are_left_as_they_were():
    model, x = mlp()
    report = tt.diff(lambda: model(x).pow(2).mean(), lambda: model(x).pow(2).mean())
    assert report.same and report.first is None and report.top() == []
    assert "no divergence" in str(report)
    assert all(p.grad is None for p in model.parameters())


def test_a_students_rule_is_the_first_divergence_and_what_it_received_was_equal():
    model, x = mlp()

    def student():
        return model[2](WrongTanh.apply(model[0](x))).pow(2).mean()  # the student's tanh

    report = tt.diff(student, lambda: model(x).pow(2).mean())
    first = report.first
    assert (first.rule, first.rule_b, first.incoming_error) == ("WrongTanh", "Tanh", 0.0)
    assert first.line.startswith("test_diff.py:") and first.error > 0.1
    # the divergence propagates: the first Linear's step and both first-layer gradients differ too
    top = report.top(10)
    assert {d.leaf for d in top if d.leaf} == {"0.weight", "0.bias"}
    assert top == sorted(top, key=lambda d: -d.error)
    assert "first: WrongTanh (b: Tanh)" in str(report)
    assert report.first_forward is None and "forward: the same values" in str(report)


def test_a_wrong_rule_in_the_gpt2_shaped_model_is_named_at_its_line_with_autocast_on_neither_side():
    model = build("gpt2")
    inputs, target = batch("gpt2")

    def run(fault):
        def loss():
            model.fault = fault
            return loss_fn(model, "gpt2", inputs, target)
        return loss

    report = tt.diff(run("wrong rule"), run(None))
    assert (report.first.rule, report.first.module, report.first.line) == ("WrongTanh", "h.1.act",
                                                                            line_of("fault: gpt2 gelu"))


def test_float32_against_bfloat16_autocast_aligns_the_extra_casts_and_finds_the_first_rounded_step():
    model, x = mlp()

    def bf16():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return model(x).float().pow(2).mean()

    report = tt.diff(lambda: model(x).pow(2).mean(), bf16, rtol=1e-3, titles=("float32", "bfloat16"))
    assert len(report.b.steps) > len(report.a.steps)  # autocast adds casts, which the alignment skips
    assert len(report.pairs) == len(report.a.steps)
    first = report.first
    assert first is not None and 1e-3 < first.error < 0.1  # rounding, not a wrong rule
    assert "float32 vs bfloat16" in str(report)


def test_eager_against_tt_compile_compares_the_leaf_gradients():
    model, x = mlp()

    def loss(inp):
        return model(inp).pow(2).mean()

    compiled = tt.compile(loss, (x,))
    report = tt.diff(loss, compiled, x)
    assert report.first is None, str(report)
    assert report.a.leaf_grads.keys() == report.b.leaf_grads.keys()


def test_before_and_after_a_change_of_the_model_code():
    model, x = mlp()
    before = lambda: model(x).pow(2).mean()  # noqa: E731
    after = lambda: model[2](torch.nn.functional.hardtanh(model[0](x))).pow(2).mean()  # noqa: E731
    report = tt.diff(before, after)
    assert (report.first_forward.rule, report.first_forward.rule_b) == ("Tanh", "Hardtanh")
    assert report.first.rule == "Pow"  # the backward starts at the loss, whose inputs already differ


def test_input_arguments_get_their_own_copies_in_each_pass():
    w = tt.randn(3, requires_grad=True)
    report = tt.diff(lambda v: (v * w).sum(), lambda v: (v * w * 2).sum(), tt.ones(3, requires_grad=True))
    names = {d.leaf for d in report.leaf_divergences}
    assert "argument 0" in names and len(names) == 2  # v (a copy per pass) and w (the same tensor in both)
    torch.testing.assert_close(report.b.leaf_grads[("argument", 0)], 2 * report.a.leaf_grads[("argument", 0)])
    assert w.grad is None


def test_explore_shows_both_passes_side_by_side_opened_at_the_first_divergence(tmp_path):
    model, x = mlp()

    def student():
        return model[2](WrongTanh.apply(model[0](x))).pow(2).mean()

    report = tt.diff(student, lambda: model(x).pow(2).mean(), titles=("student", "reference"))
    both = report.explore()
    data = both.data()
    assert data["titles"] == ["student", "reference"]
    a_step, b_step = data["pairs"][data["first"]]
    assert data["players"][0]["steps"][a_step]["name"] == "WrongTanhBackward"
    assert data["players"][1]["steps"][b_step]["name"] == "TanhBackward"
    marked = {f["node"] for f in data["players"][0]["findings"] if f["kind"] == "diverges"}
    assert data["players"][0]["steps"][a_step]["node"] in marked
    assert both.save(tmp_path / "diff.html").endswith("diff.html")
    assert all(p.grad is None for p in model.parameters())


def test_two_deep_copies_of_one_model_are_matched_by_parameter_name():
    import copy

    model, x = mlp()
    twin = copy.deepcopy(model)
    assert all(p is not q for p, q in zip(model.parameters(), twin.parameters()))
    report = tt.diff(lambda: model(x).pow(2).mean(), lambda: twin(x).pow(2).mean())
    assert report.same and report.leaf_divergences == [], str(report)
    with torch.no_grad():
        twin[2].weight[0, 0] += 0.5  # the modified copy: the last layer's first row, and what flows from it
    report = tt.diff(lambda: model(x).pow(2).mean(), lambda: twin(x).pow(2).mean())
    leaves = {d.leaf for d in report.leaf_divergences}
    assert {"0.weight", "0.bias"} <= leaves <= {f"{i}.{kind}" for i in (0, 2) for kind in ("weight", "bias")}
    assert all(0 < d.error < 1 for d in report.leaf_divergences), str(report)  # finite: each leaf met its twin


def test_dropout_draws_the_same_mask_in_both_passes_so_identical_code_does_not_diverge():
    torch.manual_seed(0)
    model = tt.port(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.5), torch.nn.Linear(8, 1)))
    x = tt.randn(16, 4)
    report = tt.diff(lambda: model(x).pow(2).mean(), lambda: model(x).pow(2).mean())
    assert report.same and report.first_forward is None
    assert report.a.loss == report.b.loss


def test_an_op_only_one_pass_ran_is_where_the_forwards_first_differ():
    model, x = mlp()

    def with_relu():
        return torch.relu(model(x)).pow(2).mean()  # the op b adds

    report = tt.diff(lambda: model(x).pow(2).mean(), with_relu)
    first = report.first_forward
    assert (first.rule, first.only, first.line) == ("Relu", "b", f"test_diff.py:{line_of_relu()}")
    assert "Relu, an op only b ran," in str(report)
    assert "the forwards already differ" in str(report)
    removed = tt.diff(with_relu, lambda: model(x).pow(2).mean()).first_forward
    assert (removed.rule, removed.only) == ("Relu", "a")


def line_of_relu():
    import inspect
    source, start = inspect.getsourcelines(test_an_op_only_one_pass_ran_is_where_the_forwards_first_differ)
    return start + next(i for i, text in enumerate(source) if "the op b adds" in text)


def test_the_same_math_in_another_graph_is_no_divergence_and_a_real_difference_is_found_at_the_leaves():
    """y ** 2 against y * y: Pow sends one gradient where Mul sends two, and each of b's two tanh steps gets half of
    what a's one gets. Those halves were reported as errors of 0.5 (and Pow against Mul as inf)."""
    x, w = tt.randn(4), tt.randn(4, requires_grad=True)
    squared = lambda x, w: ((x * w).tanh() ** 2).sum()  # noqa: E731
    same = tt.diff(squared, lambda x, w: ((x * w).tanh() * (x * w).tanh()).sum(), x, w)
    assert same.same and same.divergences == [] and same.leaf_divergences == [], str(same)
    assert "part at Pow (b: Mul), which sends 1 gradient ((4,)) where b's sends 2 gradients" in str(same)
    assert "no divergence" in str(same)
    other = tt.diff(squared, lambda x, w: ((x * w).tanh() * (x * w).tanh() * 1.5).sum(), x, w)
    assert other.first.leaf.startswith("argument") and other.first.error == pytest.approx(1 / 3, rel=1e-5), str(other)
