"""Causes read from the values at the op: one rule, two values, two different causes; normalisations with eps 0;
NaN made by ops that record nothing; a parameter that holds NaN; `.data` and a library call under no_grad as cuts."""
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from doctor_models import line_of
from torch import nn

import torchtrace as tt
from torchtrace.doctor.causes import AtOp, add_cause, cause_of

HERE = Path(__file__)


def first(fn, *args):
    d = tt.diagnose(fn, *args)
    assert d.first_nonfinite is not None, str(d)
    return d.first_nonfinite


def test_one_pow_backward_two_causes_from_the_values():
    at_zero = first(lambda x: (x ** 0.5).sum(), tt.tracer([0.0, 4.0], requires_grad=True))
    big = tt.tracer(torch.full((3,), 40.0, dtype=torch.float16), requires_grad=True)
    overflow = first(lambda x: ((x ** 3) - 64000).mul(20).sum(), big)  # 20 * 3 * 40^2 = 96000 > 65504
    assert (at_zero.rule, at_zero.phase) == (overflow.rule, overflow.phase) == ("Pow", "backward")
    assert "inf at x = 0 with p = 0.5 < 1" in at_zero.message and "1 of x are 0" in at_zero.message
    assert "overflowed float16's range (max 65504)" in overflow.message and "no x is 0" in overflow.message
    assert "p = 3" in overflow.message and "float32" in overflow.advice
    assert at_zero.message != overflow.message and at_zero.advice != overflow.advice


def test_one_pow_forward_two_causes_from_the_values():
    cube = first(lambda x: (x ** 3).sum(), tt.tracer(torch.full((2,), 200.0, dtype=torch.float16), requires_grad=True))
    root = first(lambda x: (x ** 0.5).sum(), tt.tracer([-1.0, 4.0], requires_grad=True))
    assert cube.rule == root.rule == "Pow" and cube.phase == root.phase == "forward"
    assert "x ** 3 overflowed float16's range (max 65504)" in cube.message and "200 ** 3 = 8e+06" in cube.message
    assert "negative base to a fractional power is NaN (1 bases are negative, exponent 0.5)" in root.message


def test_an_overflow_of_any_rule_is_named_with_its_dtype():
    x = tt.tracer(torch.full((4,), 3e4, dtype=torch.float16), requires_grad=True)
    f = first(lambda x: (x * 4).sum(), x)
    assert f.rule == "Mul" and "overflowed float16's range (max 65504)" in f.message and "3e+04" in f.message


def test_a_cause_added_for_one_rule_is_tried_first_and_only_when_its_values_show_it():
    seen = []

    def marker(at: AtOp):
        seen.append(at.rule)
        return ("planted", "nothing") if at.named.get("a") is not None and at.phase == "forward" else None

    add_cause("forward", marker, rule="PlantedRule", first=True)
    assert cause_of(AtOp("PlantedRule", "forward", named={"a": 1})) == ("planted", "nothing")
    assert cause_of(AtOp("PlantedRule", "forward", named={}))[0] != "planted" and seen == ["PlantedRule"] * 2


def _constant_rows(rows, width, constant_row):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(rows, width, generator=g)
    x[constant_row] = 0.25
    return x


def test_layer_norm_with_eps_0_on_a_constant_row_names_the_row():
    model = tt.port(nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4, eps=0.0)))
    with torch.no_grad():  # the linear layer passes its input on: row 2 stays constant
        model[0].weight.copy_(torch.eye(4))
        model[0].bias.zero_()
    f = first(lambda: model(_constant_rows(5, 4, 2)).sum())
    assert (f.rule, f.phase, f.module) == ("LayerNormFunction", "forward", "1")
    assert "variance 0 and eps 0 in row 2 (1 of 5 rows are constant: every value there is 0.25)" in f.message
    assert "eps" in f.advice and "learning rate" not in f.advice


def test_batch_norm_and_group_norm_with_eps_0_name_the_channel_and_the_group():
    bn = tt.port(nn.BatchNorm1d(3, eps=0.0)).eval()  # torch refuses eps 0 in training; its running stats here
    bn.running_var[1] = 0.0  # channel 1 was constant in every batch it saw
    f = first(lambda: bn(tt.tracer(torch.randn(6, 3, 4), requires_grad=True)).sum())
    assert f.rule == "BatchNormFunction" and "running variance 0 and eps 0 in channel 1" in f.message
    y = torch.randn(2, 4, 3)
    y[1, 2:] = -1.0  # sample 1, group 1 (channels 2 and 3) is constant
    gn = tt.port(nn.GroupNorm(2, 4, eps=0.0))
    f = first(lambda: gn(tt.tracer(y, requires_grad=True)).sum())
    assert f.rule == "GroupNormFunction" and "variance 0 and eps 0 in sample and group (1, 1)" in f.message


def test_a_positive_eps_keeps_the_constant_row_finite_and_raises_no_alarm():
    model = tt.port(nn.LayerNorm(4))
    assert not tt.diagnose(lambda: model(_constant_rows(5, 4, 2)).pow(2).sum()).alarms


class Standardised(nn.Module):
    """Standardises its input itself; pixel column 1 is always 0, so its std is 0."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 2)

    def forward(self, x):
        x = (x - x.mean(0)) / x.std(0)  # fault: hand standardise
        return self.fc(x)


def test_nan_made_by_an_op_that_records_nothing_is_named_with_its_line():
    model = tt.port(Standardised())
    x = torch.randn(5, 3)
    x[:, 1] = 0.0
    f = first(lambda: model(x).sum())
    assert (f.rule, f.phase, f.line, f.module) == ("Div", "forward", line_of("fault: hand standardise", HERE), "model")
    assert "0/0 = NaN" in f.message and "variance 0 and eps 0" in f.message and "index 1" in f.message
    assert "nothing recorded this op: its inputs need no gradient" in f.message and "eps" in f.advice


def test_a_parameter_that_holds_nan_is_named_as_the_source():
    model = tt.port(nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1)))
    with torch.no_grad():
        model[2].weight[0, 1] = float("nan")
    f = first(lambda: model(torch.randn(5, 3)).sum())
    assert "the parameter 2.weight holds NaN or Inf itself (1 of 4 elements)" in f.message and f.module == "2"


def _inf_then_nan_loss(model, x):
    return nn.functional.cross_entropy(model(x), torch.tensor([0, 1, 0]))


def test_an_inf_from_outside_is_named_before_the_op_that_turned_it_into_nan():
    """An Inf in a parameter or the input becomes NaN at a later op (cross entropy's inf - inf): the first finding
    names where the Inf came from (as for a NaN), and the op is not said to have made NaN from finite inputs."""
    torch.manual_seed(0)
    model = tt.port(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)))
    with torch.no_grad():
        model[2].weight[0, 0] = float("inf")
    x = torch.randn(3, 4).abs()
    with torch.no_grad():
        model[0].bias.fill_(1.0)  # every ReLU unit on: the Inf weight meets a positive input
    d = tt.diagnose(lambda: _inf_then_nan_loss(model, x))
    kinds = [f for f in d.findings if f.kind == "nonfinite"]
    assert "the parameter 2.weight holds NaN or Inf itself (1 of 16 elements)" in kinds[0].message
    assert all("from finite inputs" not in f.message for f in kinds)
    assert any("turned an Inf of its inputs into NaN" in f.message for f in kinds[1:])
    with torch.no_grad():
        model[2].weight[0, 0] = 0.0
    x[1, 2] = float("inf")
    d = tt.diagnose(lambda: _inf_then_nan_loss(model, x))
    assert "no recorded op made it: a value that was already NaN or Inf entered the graph" in d.findings[0].message


class WriteUnderNoGrad(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = nn.Linear(4, 4), nn.Linear(4, 2)

    def forward(self, x):
        h = self.first(x)
        with torch.no_grad():
            h[1, 1] = float("inf")  # fault: inf written
        return self.second(h)


def test_an_inf_written_in_place_under_no_grad_is_named_at_its_line():
    model = tt.port(WriteUnderNoGrad())
    d = tt.diagnose(lambda: _inf_then_nan_loss(model, torch.randn(3, 4)))
    f = d.findings[0]
    assert f.line == line_of("fault: inf written", HERE) and "wrote NaN or Inf into a tensor in place" in f.message
    assert "grad mode is off" in f.message


class DataCut(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder, self.head = nn.Linear(3, 4), nn.Linear(4, 1)

    def forward(self, x):
        h = self.encoder(x).data  # fault: data cut
        return self.head(h)


def test_data_is_a_cut_at_its_line():
    model = tt.port(DataCut())
    d = tt.diagnose(lambda: model(torch.randn(5, 3)).sum())
    (f,) = d.of_kind("no_path")
    assert f.line == line_of("fault: data cut", HERE) and "through .data, which passes no gradient" in f.message
    assert "encoder.weight" in f.message and "use the tensor itself" in f.advice


LIBRARY = '''
import torch
from torch import nn


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(3, 4)

    def forward(self, x):
        return torch.relu(self.inner(x)) * 2
'''


@pytest.fixture(params=["site-packages", "pip --target"])
def installed_library(request, tmp_path, monkeypatch):
    """A library module installed under site-packages, or as a package beside its .dist-info (pip --target)."""
    if request.param == "site-packages":
        packages = tmp_path / "site-packages"
        packages.mkdir()
        (packages / "doctorlib.py").write_text(textwrap.dedent(LIBRARY))
    else:
        packages = tmp_path / "target"
        (packages / "doctorlib").mkdir(parents=True)
        (packages / "doctorlib-1.0.dist-info").mkdir()
        (packages / "doctorlib" / "__init__.py").write_text(textwrap.dedent(LIBRARY))
    monkeypatch.syspath_prepend(str(packages))
    yield __import__("doctorlib")
    sys.modules.pop("doctorlib", None)


def test_no_grad_around_a_library_module_is_told_at_the_users_line_with_the_module_call(installed_library):
    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.backbone, self.head = installed_library.Encoder(), nn.Linear(4, 1)

        def forward(self, x):
            with torch.no_grad():
                h = self.backbone(x)  # fault: library under no_grad
            return self.head(h)

    model = tt.port(Model())
    d = tt.diagnose(lambda: model(torch.randn(5, 3)).sum())
    (f,) = d.of_kind("no_path")
    assert f.line == line_of("fault: library under no_grad", HERE)
    assert "torch.no_grad() around the call of backbone" in f.message and "backbone.inner.weight" in f.message
    assert "outside the torch.no_grad() block" in f.advice



def test_a_factory_is_not_an_origin_only_a_computation_from_finite_inputs_is():
    w = tt.tracer([1.0, 2.0], requires_grad=True)
    f = first(lambda: (w * torch.full((2,), float("nan"))).sum())  # a NaN constant enters: nothing computed it
    assert f.rule == "" and "entered the graph" in f.message
