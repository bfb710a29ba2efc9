"""tt.flow (torchtrace/inspect/flow.py): per-parameter gradient statistics, flags, table, HTML and plot."""
import math
import os
import xml.etree.ElementTree as ET

import matplotlib
import pytest
import torch

import torchtrace as tt
import torchtrace.nn as nn
from torchtrace.inspect.flow import Flow, FlowRow, flow

matplotlib.use("Agg")


def deep_sigmoid_net(depth=20, width=16):
    """torch's own layers, their parameters turned into tracers: the classic vanishing-gradient network."""
    torch.manual_seed(0)
    layers = []
    for _ in range(depth):
        linear = torch.nn.Linear(width, width)
        linear.weight, linear.bias = nn.Parameter(linear.weight), nn.Parameter(linear.bias)
        layers += [linear, torch.nn.Sigmoid()]
    return torch.nn.Sequential(*layers)


class Residual(nn.Module):
    """x + relu(W x + b) / 5: a damped residual branch, so that 20 blocks keep the activations in scale."""

    def __init__(self, width):
        super().__init__()
        self.linear = nn.Linear(width, width)

    def forward(self, x):
        return x + torch.relu(self.linear(x)) / 5


def residual_relu_net(depth=20, width=16):
    torch.manual_seed(0)
    return nn.Sequential(*[Residual(width) for _ in range(depth)])


def backward_through(model, width=16):
    torch.manual_seed(1)
    model(tt.randn(8, width)).pow(2).mean().backward()
    return flow(model)


def test_deep_sigmoid_net_vanishes_and_residual_relu_net_does_not():
    sigmoid = backward_through(deep_sigmoid_net())
    first_layers = ["0.weight", "0.bias", "2.weight", "2.bias"]
    assert set(first_layers) <= set(sigmoid.with_flag("vanishing"))
    assert "38.weight" not in sigmoid.flagged  # the last layer still learns
    assert sigmoid["0.weight"].grad_norm < sigmoid["38.weight"].grad_norm * 1e-6
    residual = backward_through(residual_relu_net())
    assert residual.flagged == []
    assert all(row.grad_norm > 1e-3 for row in residual)


def test_statistics_match_the_gradients():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    model(tt.randn(5, 3)).sum().backward()
    report = flow(model)
    assert [row.name for row in report] == [name for name, _ in model.named_parameters()]
    for name, p in model.named_parameters():
        g = p.grad.double()
        row = report[name]
        assert row.shape == tuple(p.shape)
        assert row.grad_norm == pytest.approx(g.norm().item())
        assert row.mean_abs == pytest.approx(g.abs().mean().item())
        assert row.max_abs == pytest.approx(g.abs().max().item())
        assert row.ratio == pytest.approx(g.norm().item() / p.detach().double().norm().item())
        assert row.flag == ""


def test_flags():
    used, unused, zeroed, huge, broken = (tt.randn(3, requires_grad=True) for _ in range(5))
    loss = used.sum() + (zeroed * 0).sum() + (huge * 1e6).sum() + (broken * float("inf")).sum()
    loss.backward()
    report = flow({"used": used, "unused": unused, "zeroed": zeroed, "huge": huge, "broken": broken})
    assert {row.name: row.flag for row in report} == {
        "used": "", "unused": "no grad", "zeroed": "zero", "huge": "exploding", "broken": "non-finite"}
    assert report["unused"].grad_norm is None and report["unused"].ratio is None
    assert flow({"used": used}, vanishing=10.0).flagged == ["used"]  # |grad| = sqrt(3) < 10
    assert flow({"huge": huge}, exploding=1e9).flagged == []


def test_input_forms():
    a, b = tt.randn(2, requires_grad=True), tt.randn(3, requires_grad=True)
    (a.sum() * b.sum()).backward()
    expected = [a.grad.norm().item(), b.grad.norm().item()]
    for params, names in [({"a": a, "b": b}, ["a", "b"]), ([("a", a), ("b", b)], ["a", "b"]),
                          ([a, b], ["param0", "param1"])]:
        report = flow(params)
        assert [row.name for row in report] == names
        assert [row.grad_norm for row in report] == pytest.approx(expected)
    assert len(report) == 2 and isinstance(report[0], FlowRow)
    with pytest.raises(KeyError, match="no parameter named 'c'"):
        report["c"]


def test_zero_norm_weight_has_no_ratio():
    w = tt.zeros(3, requires_grad=True)
    (w * 2).sum().backward()
    assert flow({"w": w})["w"].ratio is None


def test_table_prints_aligned_columns():
    report = backward_through(deep_sigmoid_net(depth=3))
    lines = str(report).splitlines()
    assert lines[0].split() == ["parameter", "shape", "|grad|", "mean", "|g|", "max", "|g|", "|g|/|w|", "flag"]
    assert set(lines[1]) == {"-", " "}
    rows = lines[2:-1]
    assert len(rows) == len(report) == 6
    end = lines[0].index("|grad|") + len("|grad|")
    for line, row in zip(rows, report):
        assert line.startswith(row.name + " ")
        assert line[:end].endswith(f"{row.grad_norm:.2e}")
    assert lines[-1].startswith("6 parameters:") and "vanishing: |grad| < 1e-07" in lines[-1]
    assert repr(report) == str(report)


def test_html_table_for_notebooks():
    w = tt.randn(2, requires_grad=True)
    (w * 1e-9).sum().backward()
    report = flow({"<w>": w, "v": tt.randn(2, requires_grad=True)})
    root = ET.fromstring(f"<div>{report._repr_html_()}</div>")
    rows = root.findall("./table/tbody/tr")
    assert [tr.find("td").text for tr in rows] == ["<w>", "v"]  # names are escaped
    assert [tr.findall("td")[-1].text for tr in rows] == ["vanishing", "no grad"]
    assert all("background-color" in tr.get("style") for tr in rows)
    assert [th.text for th in root.findall("./table/thead/tr/th")] == list(Flow.columns)


def test_plot_writes_a_png(tmp_path):
    report = backward_through(deep_sigmoid_net())
    path = tmp_path / "flow.png"
    figure = report.plot(str(path))
    assert os.path.getsize(path) > 5000
    assert open(path, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    (ax,) = figure.axes
    weights = [row for row in report if not row.name.endswith("bias")]
    assert len(ax.patches) == 2 * len(weights)  # max and mean bars per layer
    assert ax.get_yscale() == "log"
    assert [t.get_text() for t in ax.get_xticklabels()] == [row.name for row in weights]
    red = [t.get_text() for t in ax.get_xticklabels() if t.get_color() == "red"]
    assert red == [row.name for row in weights if row.flag]
    heights = [p.get_height() for p in ax.patches[len(weights):]]
    assert heights == pytest.approx([row.mean_abs for row in weights])
    with_bias = report.plot(include_bias=True)
    assert len(with_bias.axes[0].patches) == 2 * len(report)


def test_plot_with_zero_and_missing_gradients():
    used, zeroed = tt.randn(3, requires_grad=True), tt.randn(3, requires_grad=True)
    (used.sum() + (zeroed * 0).sum()).backward()
    figure = flow({"used": used, "zeroed": zeroed, "unused": tt.randn(3, requires_grad=True)}).plot()
    ax = figure.axes[0]
    assert len(ax.patches) == 4  # the unused parameter has no bars
    assert all(math.isfinite(p.get_height()) and p.get_height() > 0 for p in ax.patches)
    assert "without grad" in ax.get_title()


def test_plot_is_pyplots_current_figure_so_plt_savefig_saves_it(tmp_path):
    import matplotlib.pyplot as plt

    report = backward_through(deep_sigmoid_net())
    figure = report.plot()
    try:
        assert plt.gcf() is figure
        plt.savefig(tmp_path / "flow.png")
        assert open(tmp_path / "flow.png", "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    finally:
        plt.close(figure)


def test_jupyter_shows_the_figure_once(monkeypatch):
    import IPython.display
    import matplotlib.pyplot as plt

    shown = []
    monkeypatch.setattr(IPython.display, "display", lambda *objects: shown.extend(objects))
    figure = backward_through(deep_sigmoid_net()).plot()
    figure._ipython_display_()  # the cell's result: shown from its PNG...
    assert [type(obj).__name__ for obj in shown] == ["Image"]
    assert not plt.fignum_exists(figure.number)  # ...and closed, so the notebook backend does not show it again


def test_flagged_is_an_attribute_and_with_flag_filters():
    report = backward_through(deep_sigmoid_net())
    assert isinstance(report.flagged, list) and report.flagged == [row.name for row in report if row.flag]
    assert set(report.with_flag("vanishing")) <= set(report.flagged)
    assert report.with_flag("exploding") == []


def test_an_output_without_a_graph_and_thresholds_out_of_order_are_refused():
    """output= was ignored when it was not a tracer with a grad_fn; vanishing above exploding flagged nonsense."""
    model = tt.port(torch.nn.Linear(3, 2))
    loss = model(torch.randn(4, 3)).pow(2).mean()
    loss.backward()
    assert tt.flow(model, output=loss).rows
    for output in (torch.tensor(1.0), 5):
        with pytest.raises(ValueError, match="output must be the loss tracer"):
            tt.flow(model, output=output)
    with pytest.raises(ValueError, match="vanishing < exploding"):
        tt.flow(model, vanishing=1.0, exploding=0.5)
    with pytest.raises(ValueError, match="vanishing < exploding"):
        tt.flow(model, vanishing=-1)
