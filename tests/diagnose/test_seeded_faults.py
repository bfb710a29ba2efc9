"""Seeded faults on five models (MLP, CNN, small GPT, BERT-shaped, GPT-2-shaped): tt.diagnose names each one at
the right rule, module and source line; tt.diff names a planted wrong rule; the training doctor flags lr x 1e3."""
import pytest
import torch
from doctor_models import MODELS, batch, build, line_of, loss_fn

import torchtrace as tt

TRANSFORMERS = ("gpt", "bert", "gpt2")


def diagnose(kind, fault=None, hand_written=False, left_padded=False, prepare=None):
    model = build(kind)
    model.fault = fault
    if prepare is not None:
        prepare(model)
    inputs, target = batch(kind, left_padded=left_padded)
    return tt.diagnose(lambda: loss_fn(model, kind, inputs, target, hand_written=hand_written))


def only(d, kind):
    assert [f.kind for f in d.alarms] == [kind], str(d)
    return d.alarms[0]


@pytest.mark.parametrize("kind", list(MODELS))
def test_log_of_zero_is_named_at_the_log_in_the_hand_written_loss(kind):
    finding = only(diagnose(kind, hand_written=True), "nonfinite")
    assert (finding.phase, finding.rule, finding.line) == ("forward", "Log", line_of("fault: log"))
    assert "log of 0 is -inf" in finding.message and "exactly 0" in finding.message
    assert "log_softmax" in finding.advice


@pytest.mark.parametrize("kind, marker", [("mlp", "fault: mlp sqrt"), ("cnn", "fault: cnn sqrt")])
def test_sqrt_of_a_negative_is_named_at_the_sqrt(kind, marker):
    finding = only(diagnose(kind, "sqrt"), "nonfinite")
    assert (finding.phase, finding.rule, finding.line, finding.module) == ("forward", "Sqrt", line_of(marker), "model")
    assert "sqrt of a negative number is NaN" in finding.message


@pytest.mark.parametrize("kind, marker, module", [("gpt", "fault: gpt softmax", "attn"),
                                                  ("bert", "fault: bert softmax", "layers.0.attention"),
                                                  ("gpt2", "fault: gpt2 softmax", "h.0")])
def test_a_minus_inf_mask_on_a_full_row_is_named_at_the_softmax(kind, marker, module):
    fault = None if kind == "gpt" else "-inf mask"  # the small GPT fills its padding with -inf already
    finding = only(diagnose(kind, fault, left_padded=True), "nonfinite")
    expected = ("forward", "Softmax", line_of(marker), module)
    assert (finding.phase, finding.rule, finding.line, finding.module) == expected
    assert "every entry -inf" in finding.message and "finfo" in finding.advice


@pytest.mark.parametrize("kind", ["bert", "gpt2"])
def test_the_huggingface_finite_mask_on_a_full_row_raises_no_alarm(kind):
    assert not diagnose(kind, left_padded=True).alarms


def _dead(layer):
    def prepare(model):
        with torch.no_grad():
            model.get_submodule(layer).bias.fill_(-100.0)
    return prepare


@pytest.mark.parametrize("kind, layer, act, marker", [("mlp", "fc2", "act2", "fault: mlp act2"),
                                                      ("cnn", "conv2", "act2", "fault: cnn act2"),
                                                      ("gpt", "fc", "act", "fault: gpt act")])
def test_a_dead_relu_layer_from_a_bad_initialisation_is_named_with_its_share(kind, layer, act, marker):
    finding = only(diagnose(kind, prepare=_dead(layer)), "killed")
    assert (finding.phase, finding.rule, finding.module, finding.line) == ("backward", "Relu", act, line_of(marker))
    assert finding.share == 1.0 and "100% of the units" in finding.message


def test_a_saturated_tanh_pooler_is_named_with_its_share():
    def prepare(model):
        with torch.no_grad():
            model.pooler.weight.mul_(50.0)
    finding = only(diagnose("bert", prepare=prepare), "saturated")
    assert (finding.rule, finding.module, finding.line) == ("Tanh", "pooler_act", line_of("fault: bert pooler"))
    assert finding.share > 0.5


@pytest.mark.parametrize("kind, marker, cut", [
    ("mlp", "fault: detach mlp", {"fc1.weight", "fc1.bias"}),
    ("cnn", "fault: detach cnn", {"conv1.weight", "conv1.bias", "bn1.weight", "bn1.bias"}),
    ("gpt", "fault: detach gpt", {"wpe.weight"}),
    ("bert", "fault: detach bert", None),
    ("gpt2", "fault: detach gpt2", {"wpe.weight"})])
def test_a_detached_branch_names_the_line_and_the_parameters_it_cut(kind, marker, cut):
    finding = only(diagnose(kind, "detach"), "no_path")
    assert finding.line == line_of(marker) and ".detach()" in finding.message
    if cut is not None:
        named = finding.message.split("no gradient reaches ")[1].split(":")[0].split(", ")
        assert set(named) == cut


@pytest.mark.parametrize("kind, marker, wrong, right", [("mlp", "fault: mlp act2", "WrongRelu", "Relu"),
                                                        ("cnn", "fault: cnn act2", "WrongRelu", "Relu"),
                                                        ("gpt", "fault: gpt act", "WrongRelu", "Relu"),
                                                        ("gpt2", "fault: gpt2 gelu", "WrongTanh", "Tanh")])
def test_a_planted_wrong_rule_is_the_first_divergence_of_tt_diff(kind, marker, wrong, right):
    model = build(kind)
    inputs, target = batch(kind)

    def run(fault):
        def loss():
            model.fault = fault
            return loss_fn(model, kind, inputs, target)
        return loss

    report = tt.diff(run("wrong rule"), run(None))
    first = report.first
    assert (first.rule, first.rule_b, first.line) == (wrong, right, line_of(marker)), str(report)
    assert first.incoming_error == 0.0 and first.error > 1e-2


@pytest.mark.parametrize("kind", list(MODELS))
def test_a_learning_rate_1000_times_too_large_is_flagged_by_the_training_doctor(kind):
    model = build(kind)
    inputs, target = batch(kind)
    optimizer = tt.optim.Adam(model.parameters(), lr=1e-3 * 1e3)
    with tt.diagnose.training(model, optimizer) as doc:
        for _ in range(4):
            optimizer.zero_grad()
            loss_fn(model, kind, inputs, target).backward()
            optimizer.step()
    flagged = {f.module for f in doc.findings if "large updates" in f.message}
    assert flagged, doc.table()
    assert all(f.kind in ("exploding", "nonfinite", "killed") for f in doc.findings)
