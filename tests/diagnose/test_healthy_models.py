"""Zero alarms on the same five models when they are healthy: trained for a few steps under the training doctor
(no flag), then diagnosed (no alarm; the CNN's bias before its batch norm and BERT's attention key biases are
reported as zero by construction, which is information, not an alarm)."""
import pytest
from doctor_models import MODELS, batch, build, loss_fn

import torchtrace as tt

SEEDS = (0, 1, 2)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("kind", list(MODELS))
def test_a_healthy_model_trains_and_is_diagnosed_without_a_single_alarm(kind, seed):
    model = build(kind, seed)
    inputs, target = batch(kind, seed)
    optimizer = tt.optim.Adam(model.parameters(), lr=1e-3)
    losses = []
    with tt.diagnose.training(model, optimizer) as doc:
        for _ in range(6):
            optimizer.zero_grad()
            loss = loss_fn(model, kind, inputs, target)
            loss.backward()
            optimizer.step()
            losses.append(float(loss))
    assert losses[-1] < losses[0]  # it does train
    assert doc.findings == [], doc.table()
    d = tt.diagnose(lambda: loss_fn(model, kind, inputs, target))
    assert d.alarms == [], str(d)
    expected = {"cnn": ["conv1"], "bert": ["layers.0.attention.key", "layers.1.attention.key"]}.get(kind, [])
    assert [f.module for f in d.findings if f.kind == "zero_by_construction"] == expected  # the key bias: softmax
    assert [f.kind for f in d.findings] == ["zero_by_construction"] * len(expected)


def test_the_cnn_bias_before_batch_norm_is_explained_not_called_vanishing():
    model = build("cnn")
    inputs, target = batch("cnn")
    d = tt.diagnose(lambda: loss_fn(model, "cnn", inputs, target))
    (finding,) = d.findings
    assert (finding.rule, finding.module) == ("Convolution", "conv1")
    assert "BatchNorm" in finding.message and "bias=False" in finding.advice


def test_tt_flow_and_tt_draw_call_the_bias_before_batch_norm_zero_by_construction_not_vanishing():
    model = build("cnn")
    inputs, target = batch("cnn")
    loss = loss_fn(model, "cnn", inputs, target)
    loss.backward()
    assert tt.flow(model)["conv1.bias"].flag == "zero by construction"  # without the graph: from the modules
    report = tt.flow(model, loss)
    assert report["conv1.bias"].flag == "zero by construction"
    assert [name for name in report.flagged] == ["conv1.bias"]
    source = tt.draw(loss, params=model).source
    assert "zero by construction" in source and "dashed" in source
