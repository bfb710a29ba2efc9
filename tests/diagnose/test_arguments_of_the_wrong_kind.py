"""The doctor's and tt.precision's arguments of the wrong kind are refused by name: each was accepted and gave an
empty answer that looked like a clean bill of health, or named another tool in its error."""
import pytest
import torch

import torchtrace as tt


def _model_and_loss():
    torch.manual_seed(0)
    model = tt.port(torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1)))
    x = torch.randn(8, 3)
    return model, lambda: model(x).pow(2).mean()


def test_a_misspelt_finding_kind_is_refused():
    model, loss = _model_and_loss()
    report = tt.diagnose(loss, model=model)
    assert report.of_kind("nonfinite") == []
    with pytest.raises(ValueError, match="kind must be one of"):
        report.of_kind("non-finite")


def test_top_takes_a_count():
    model, loss = _model_and_loss()
    report = tt.diff(loss, loss)
    assert report.top(0) == []
    with pytest.raises(ValueError, match="k .* must be at least 0, not -1"):
        report.top(-1)
    with pytest.raises(TypeError, match="k .* must be an integer, not 1.5"):
        report.top(1.5)


def test_precision_names_itself_and_checks_scale_phase_and_count():
    model, loss = _model_and_loss()
    with pytest.raises(RuntimeError, match="^tt.precision: the function must return a scalar tracer"):
        tt.precision(lambda: model(torch.randn(8, 3)), dtype=torch.bfloat16)
    for scale in (0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="scale"):
            tt.precision(loss, dtype=torch.float16, scale=scale)
    report = tt.precision(loss, dtype=torch.bfloat16)
    assert len(report.top(2, phase="backward")) == 2
    with pytest.raises(ValueError, match="phase must be"):
        report.top(2, phase="bogus")
    with pytest.raises(ValueError, match="must be at least 0"):
        report.top(-1)
    with pytest.raises(TypeError, match="must be an integer"):
        report.top("2")
