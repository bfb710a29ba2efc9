"""What tt.diagnose says about each kind of non-finite value, forward and backward, and about paths to the loss;
and that it leaves nothing registered behind (no cost on the eager path once it returns)."""
import pytest
import torch
from torch.nn.modules import module as torch_module

import torchtrace as tt
from torchtrace.autograd.state import STATE


def first(fn, *args):
    d = tt.diagnose(fn, *args)
    assert d.first_nonfinite is not None, str(d)
    return d.first_nonfinite


def test_zero_over_zero():
    x = tt.tracer([0.0, 1.0], requires_grad=True)
    f = first(lambda: (x / x).sum())  # 0/0 at the first element
    assert (f.rule, f.phase) == ("Div", "forward")
    assert "1 denominators are exactly 0" in f.message and "1 of them with numerator 0 (0/0 = NaN)" in f.message


def test_exp_overflow_names_the_limit_and_the_largest_input():
    x = tt.tracer([1.0, 100.0], requires_grad=True)
    f = first(lambda: x.exp().sum())
    assert f.rule == "Exp" and "above 88.7" in f.message and "the largest is 100" in f.message


def test_log_of_a_negative_number():
    x = tt.tracer([-1.0, 2.0], requires_grad=True)
    f = first(lambda: x.log().sum())
    assert f.rule == "Log" and "log of a negative number is NaN (1 inputs are negative)" in f.message


def test_sqrt_at_zero_is_finite_forward_and_infinite_backward():
    a = tt.tracer([[1.0, 2.0]], requires_grad=True)
    f = first(lambda: (a - a.detach()).pow(2).sum().sqrt())  # a distance of exactly 0
    assert (f.rule, f.phase) == ("Sqrt", "backward")
    assert "1/(2 sqrt x) is inf at x = 0: 1 saved values are exactly 0" in f.message
    assert "sqrt(x + 1e-12)" in f.advice


def test_an_input_that_was_already_non_finite_is_not_blamed_on_the_op():
    x = tt.tracer([1.0, 2.0], requires_grad=True)
    bad = torch.tensor([float("nan"), 0.0])
    d = tt.diagnose(lambda: (x * bad).sum())
    f = d.first_nonfinite  # the NaN came from outside the graph: no op made it, and none is blamed
    assert (f.rule, f.line) == ("", "") and "entered the graph (an input" in f.message


def test_a_finite_loss_with_intermediate_infinities_absorbed_is_not_an_alarm():
    x = tt.tracer([[1.0, 2.0, 3.0]], requires_grad=True)
    mask = torch.tensor([[True, False, True]])
    d = tt.diagnose(lambda: x.masked_fill(~mask, float("-inf")).softmax(-1).pow(2).sum())
    assert d.alarms == [], str(d)


def test_diagnose_on_a_loss_already_built_runs_its_backward_without_source_lines():
    model = tt.port(torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1)))
    with torch.no_grad():
        model[0].bias.fill_(-50.0)
    loss = model(tt.randn(5, 3)).pow(2).mean()
    d = tt.diagnose(loss)
    (killed,) = d.alarms
    assert (killed.kind, killed.rule, killed.module, killed.line) == ("killed", "Relu", "1", "")
    assert "forward not watched" in d.summary()
    assert model[0].weight.grad is not None  # it ran the backward


def test_diagnose_on_a_loss_already_built_reads_the_first_nonfinite_op_from_the_kept_values():
    torch.manual_seed(0)
    lin = tt.port(torch.nn.Linear(4, 3))
    p = torch.softmax(lin(torch.randn(8, 4)) * 1000, dim=1)  # underflows to exact zeros
    loss = -torch.log(p)[torch.arange(8), torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])].mean()
    (finding,) = tt.diagnose(loss).alarms
    assert (finding.kind, finding.phase, finding.rule) == ("nonfinite", "forward", "Log")
    assert "log of 0" in finding.message and "entered the graph" not in finding.message


class TwoHeads(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body, self.head, self.unused, self.discarded = (torch.nn.Linear(3, 3), torch.nn.Linear(3, 1),
                                                             torch.nn.Linear(3, 3), torch.nn.Linear(3, 3))

    def forward(self, x, how):
        h = self.body(x)
        self.discarded(x)  # computed, never used
        if how == "item":
            h = h * self.head(x).mean().item()
        elif how == "no_grad":
            with torch.no_grad():
                scale = self.head(x)
            h = h * scale
        elif how == "cast":
            h = h + self.head(x).long()
        else:
            h = h + self.head(x)
        return h.pow(2).mean()


@pytest.mark.parametrize("how, says", [("item", ".item()"), ("no_grad", "torch.no_grad()"),
                                       ("cast", "a cast to torch.int64")])
def test_parameters_without_a_path_are_told_why_and_where(how, says):
    model = tt.port(TwoHeads())
    x = tt.randn(4, 3)
    d = tt.diagnose(lambda: model(x, how))
    by_line = {f.message.split(": ", 1)[0]: f for f in d.of_kind("no_path")}
    cut = by_line["no gradient reaches head.weight, head.bias"]
    assert says in cut.message and cut.line.startswith("test_explanations.py:") and cut.code
    assert "unused submodule" in by_line["no gradient reaches unused.weight, unused.bias"].message
    assert "nothing it computed reached the loss" in by_line["no gradient reaches discarded.weight, "
                                                             "discarded.bias"].message


def test_a_loss_already_built_does_not_claim_that_a_module_whose_result_was_cut_never_ran():
    model = tt.port(TwoHeads())
    d = tt.diagnose(model(tt.randn(4, 3), "item"))  # head ran; only its .item() reached the loss
    by_line = {f.message.split(": ", 1)[0]: f for f in d.of_kind("no_path")}
    for cut in ("head", "unused", "discarded"):
        finding = by_line[f"no gradient reaches {cut}.weight, {cut}.bias"]
        assert "never ran" not in finding.message and "cannot tell which" in finding.message
        assert "tt.diagnose(fn, *args)" in finding.advice


def test_nothing_stays_registered_after_diagnose():
    model = tt.port(TwoHeads())
    hooks_before = (len(torch_module._global_forward_pre_hooks), len(torch_module._global_forward_hooks))
    tt.diagnose(lambda: model(tt.randn(4, 3), "plain"))
    assert STATE.on_record == [] and STATE.on_backward == []
    assert (len(torch_module._global_forward_pre_hooks), len(torch_module._global_forward_hooks)) == hooks_before
    assert not torch.overrides._is_torch_function_mode_enabled()


def test_a_function_that_returns_no_scalar_is_refused_with_what_to_do():
    with pytest.raises(RuntimeError, match="must return the scalar loss"):
        tt.diagnose(lambda: tt.randn(3, requires_grad=True) * 2)


class Recurrence(torch.nn.Module):
    """h_t = W h_(t-1) + U x_t over 30 steps: the backward multiplies by W^T at every step."""

    def __init__(self, gain):
        super().__init__()
        self.cell, self.inp = torch.nn.Linear(8, 8, bias=False), torch.nn.Linear(8, 8)
        with torch.no_grad():
            self.cell.weight.copy_(torch.eye(8) * gain)

    def forward(self, xs):
        h = torch.zeros(1, 8)
        for t in range(len(xs)):
            h = self.cell(h) + self.inp(xs[t:t + 1])
        return h.sum()


def test_a_recurrence_with_gain_3_is_exploding_through_its_one_recurrent_weight():
    torch.manual_seed(0)
    model, xs = tt.port(Recurrence(3.0)), tt.randn(30, 8)
    (finding,) = tt.diagnose(model, xs).alarms
    assert model.cell.weight.grad.norm() > 1e14  # 3^29 * |x|: the finding is read from this value
    assert finding.kind == "exploding" and "largest at cell.weight, which 30 ops used" in finding.message
    assert "gated cell" in finding.advice


@pytest.mark.parametrize("gain", [0.5, 1.0])
def test_a_recurrence_with_gain_at_most_1_and_a_single_linear_layer_raise_no_alarm(gain):
    torch.manual_seed(0)
    assert not tt.diagnose(tt.port(Recurrence(gain)), tt.randn(30, 8)).alarms
    layer, x, y = tt.port(torch.nn.Linear(5, 1)), tt.randn(64, 5), tt.randn(64, 1)
    assert not tt.diagnose(lambda: torch.nn.functional.mse_loss(layer(x), y)).alarms
