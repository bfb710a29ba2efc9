"""A dead ReLU in the stem: the doctor walks back to the first layer whose output is 0 for every example, and
calls the later dead layer a consequence of it (its input is only the bias between them)."""
import torch
from doctor_models import batch, build, line_of, loss_fn

import torchtrace as tt


def _diagnose(prepare):
    model = build("mlp")
    with torch.no_grad():
        prepare(model)
    inputs, target = batch("mlp")
    return tt.diagnose(lambda: loss_fn(model, "mlp", inputs, target))


def test_a_later_dead_layer_is_named_as_a_consequence_of_the_dead_stem():
    def prepare(model):
        model.fc1.bias.fill_(-100.0)  # the stem: every unit of act1 is 0 for every example
        model.fc2.bias.copy_(-model.fc2.bias.abs())  # act2 now sees only fc2's bias, all of it negative

    d = _diagnose(prepare)
    origin, consequence = d.alarms
    assert (origin.kind, origin.phase, origin.rule, origin.module) == ("killed", "forward", "Relu", "act1")
    assert "100% of its outputs are 0 in the forward" in origin.message and "kaiming" in origin.advice
    assert (consequence.kind, consequence.rule, consequence.module) == ("killed", "Relu", "act2")
    assert consequence.line == line_of("fault: mlp act2")
    assert "a consequence of the first dead layer, Relu in act1" in consequence.message
    assert "fix the first dead layer (act1)" in consequence.advice


def test_a_dead_stem_alone_is_named_once_and_as_itself():
    d = _diagnose(lambda model: model.fc1.bias.fill_(-100.0))
    (finding,) = d.alarms
    assert (finding.phase, finding.module, finding.share) == ("backward", "act1", 1.0)
    assert "consequence" not in finding.message


def test_a_dead_layer_after_a_healthy_stem_is_not_called_a_consequence():
    d = _diagnose(lambda model: model.fc2.bias.fill_(-100.0))
    (finding,) = d.alarms
    assert finding.module == "act2" and "consequence" not in finding.message
