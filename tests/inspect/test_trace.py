"""The backprop trace: the original torchtrace's exact format for chains, merges and branches for DAGs."""
import re

import pytest
import torch
from helpers import ORIGINAL_SNIPPET_C_TRACE, load_example

import torchtrace as tt
from torchtrace.inspect.trace import backprop_lines
from torchtrace.nn import Linear

MYCONV_TRACE = ORIGINAL_SNIPPET_C_TRACE


def test_the_original_myconv_trace_exactly(capsys):
    model = load_example("snippet_c_conv_trace").myConv()
    for para in model.parameters():
        para.data.fill_(0.001)
    out = model(torch.rand(3, 3, 84, 84).float()).Sum()
    out.backward(show=True)
    assert capsys.readouterr().out.strip() == MYCONV_TRACE
    assert all(p.grad is not None for p in model.parameters())


def test_a_dag_shows_merges_and_branches():
    x = tt.tracer([1.0, 2.0], requires_grad=True)
    y = x * 3
    z = (y * y + y.exp()).sum()
    lines = backprop_lines(z)
    assert lines[0] == "BackProp:" and lines[-1] == "↘︎ Input"
    assert lines[1] == "↘︎ [0] Sum()"
    assert lines[2] == "↘︎ [1] Add()  ⇉ sends to [2], [3]"
    assert "↘︎ [3] Mul()  ⇉ sends to [4], [4]" in lines  # y * y: y is used twice by one op
    assert lines[5] == "↘︎ [4] Mul()  ⊕ sums 3 gradients from [2], [3], [3]"


def test_a_leaf_used_three_times_shows_its_three_gradients_summed(capsys):
    x = tt.tracer([1.0, 2.0], requires_grad=True)
    (x * x + x).sum().backward(show=True)
    assert capsys.readouterr().out.splitlines() == [
        "BackProp:",
        "↘︎ [0] Sum()",
        "↘︎ [1] Add()  ⇉ sends to [2], [3]",
        "↘︎ [2] Mul()  ⇉ sends to [3], [3]",
        "↘︎ [3] leaf, shape (2,) -> .grad  ⊕ sums 3 gradients from [1], [2], [2]",
        "↘︎ Input",
    ]
    assert x.grad.tolist() == [3.0, 5.0]  # 2x + 1: the three contributions x, x and 1, summed


def test_a_leaf_used_once_keeps_the_chain_format_and_its_own_line():
    x = tt.tracer([1.0, 2.0], requires_grad=True)
    assert backprop_lines((x.exp() * 2).sum()) == [
        "BackProp:", "↘︎ Sum()", "↘︎ Mul()", "↘︎ Exp()", "↘︎ leaf, shape (2,) -> .grad", "↘︎ Input"]


def test_shapes_and_norms(capsys):
    x = tt.tracer([[1.0, 2.0]], requires_grad=True)
    tt.show((x * 2).sum(), shapes=True, norms=True)
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == "↘︎ Sum()  grad shape ()  |grad| 1"
    assert lines[2] == "↘︎ Mul()  grad shape (1, 2)  |grad| 1.414"


def test_norms_leave_the_graph_and_every_grad_to_the_user(capsys):
    torch.manual_seed(0)
    model = tt.nn.Sequential(tt.nn.Linear(3, 4), tt.nn.Tanh(), tt.nn.Linear(4, 2))
    x = tt.randn(5, 3, requires_grad=True)
    model(x).pow(2).mean().backward()  # gradients already accumulated: show must not add to them
    before = [p.grad.clone() for p in model.parameters()]
    loss = torch.nn.functional.cross_entropy(model(x), torch.tensor([0, 1, 1, 0, 1]))
    tt.show(loss, norms=True)
    assert "|grad|" in capsys.readouterr().out
    assert all(torch.equal(p.grad, b) for p, b in zip(model.parameters(), before))
    loss.backward()  # the student's own backward still has its graph

    torch_model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    torch_model.load_state_dict({k: v.as_subclass(torch.Tensor) for k, v in model.state_dict().items()})
    tx = x.detach().as_subclass(torch.Tensor).requires_grad_()
    torch_model(tx).pow(2).mean().backward()
    torch.nn.functional.cross_entropy(torch_model(tx), torch.tensor([0, 1, 1, 0, 1])).backward()
    for ours, theirs in zip(model.parameters(), torch_model.parameters()):
        torch.testing.assert_close(ours.grad, theirs.grad)  # one accumulation each, as torch autograd
    torch.testing.assert_close(x.grad, tx.grad)


def test_norms_of_a_freed_graph_say_so():
    x = tt.tracer([1.0, 2.0], requires_grad=True)
    y = (x * x).sum()
    y.backward()
    with pytest.raises(RuntimeError, match="second time"):
        tt.show(y, norms=True)


def test_ops_inside_layers_can_be_listed_one_by_one():
    layer = Linear(2, 2)
    out = torch.nn.functional.softplus(layer(tt.tracer([[1.0, 2.0]]))).sum()
    assert backprop_lines(out)[2:4] == ["↘︎ Softplus()", "↘︎ Linear layer (2 X 2)"]
    one_by_one = backprop_lines(out, modules=False)
    assert one_by_one[3] == "↘︎ [2] LinearFunction()  [in Linear]  ⇉ sends to [3], [4]"
    assert one_by_one[4:6] == ["↘︎ [3] leaf bias, shape (2,) -> .grad", "↘︎ [4] leaf weight, shape (2, 2) -> .grad"]


def test_a_deep_chain_prints_without_recursion():
    x = tt.tracer([1.0], requires_grad=True)
    y = x
    for _ in range(5000):
        y = y * 1.0
    assert len(backprop_lines(y.sum())) == 5004


def test_trace_names_each_layer_as_print_model_does_for_tt_nn_and_ported_models():
    torch.manual_seed(0)
    native = tt.nn.Sequential(tt.nn.Linear(2, 3), tt.nn.ReLU(), tt.nn.Linear(3, 1))
    ported = tt.port(torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.ReLU(), torch.nn.Linear(3, 1)))
    for model, x in ((native, tt.randn(4, 2)), (ported, torch.randn(4, 2))):
        layers = [line.removeprefix("↘︎ ") for line in backprop_lines(model(x).sum())[2:-1]]
        printed = [line.split(":", 1)[1].strip() for line in repr(model).splitlines()[1:-1]]
        assert layers == printed[::-1]


def test_outputs_of_a_split_are_gathered_not_summed():
    x = tt.randn(5, requires_grad=True)
    a, b = x.exp().split([2, 3])
    lines = backprop_lines(a.sum() * b.sum())
    assert "↘︎ [3] Split()  gathers the gradients of its outputs from [1], [2]" in lines
    assert not any("⊕" in line for line in lines)


def test_norms_of_a_leaf_that_sums_gradients(capsys):
    x = tt.tracer([1.0, 2.0], requires_grad=True)
    tt.show((x * x + x).sum(), norms=True)
    leaf = capsys.readouterr().out.splitlines()[4]
    summed = (2 * x.detach() + 1).norm().item()  # d/dx (x^2 + x) = 2x + 1: the three gradients summed
    assert leaf.startswith(f"↘︎ [3] leaf, shape (2,) -> .grad  |grad| {summed:.4g}  ⊕ sums 3 gradients")


def test_every_leaf_of_a_ported_lstm_is_listed_by_its_name():
    torch.manual_seed(0)
    lstm = tt.port(torch.nn.LSTM(3, 4))
    out, _ = lstm(torch.randn(6, 1, 3))
    lines = backprop_lines(out.sum())
    for name, p in lstm.named_parameters():
        assert sum(f"leaf {name}, shape {tuple(p.shape)} -> .grad" in line for line in lines) == 1, name


def test_leaves_are_named_by_params_or_by_the_model_that_used_them(capsys):
    x, w = tt.tracer([1.0, 2.0, 3.0], requires_grad=True), tt.tracer([4.0, 5.0, 6.0], requires_grad=True)
    tt.show((x * w).sum(), params={"x": x, "w": w})
    lines = capsys.readouterr().out.splitlines()
    assert "↘︎ [2] leaf w, shape (3,) -> .grad" in lines and "↘︎ [3] leaf x, shape (3,) -> .grad" in lines
    model = tt.nn.Sequential(tt.nn.Linear(2, 3), tt.nn.ReLU(), tt.nn.Linear(3, 1))
    lines = backprop_lines(model(torch.randn(4, 2)).sum() + model[0].weight.sum())
    assert any(line.startswith("↘︎ [9] leaf 0.weight, shape (3, 2) -> .grad  ⊕ sums 2 gradients") for line in lines)
    assert sum("leaf" in line for line in lines) == 4  # 0.weight, 0.bias, 2.weight, 2.bias


def test_a_long_list_of_line_references_is_compressed():
    x = tt.randn(3, requires_grad=True)
    total = sum((x * float(k)).sum() for k in range(1, 21))
    lines = backprop_lines(total)
    leaf = [line for line in lines if "leaf" in line][0]
    assert leaf.endswith("⊕ sums 20 gradients from [2], [5], [8], ... 15 more, [56], [59]")


def test_every_glyph_of_the_trace_exists_in_dejavu_sans_mono():
    import matplotlib
    from fontTools.ttLib import TTFont

    font = TTFont(f"{matplotlib.get_data_path()}/fonts/ttf/DejaVuSansMono.ttf")
    glyphs = font.getBestCmap()
    x = tt.tracer([1.0, 2.0], requires_grad=True)
    a, b = x.exp().split([1, 1])
    text = "\n".join(backprop_lines((x * x + x).sum() + (a * b).sum()))
    assert "⊕" in text and "⇉" in text
    variation_selectors = range(0xFE00, 0xFE10)  # select the text form of ↘; they draw nothing themselves
    missing = {c for c in text if ord(c) > 127 and ord(c) not in glyphs and ord(c) not in variation_selectors}
    assert not missing, f"characters DejaVu Sans Mono cannot draw: {sorted(missing)}"


def _families(nn):
    """The same networks built from tt.nn or from torch.nn, with an input and the scalar each one traces."""
    class Residual(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.act, self.fc2 = nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2)

        def forward(self, x):
            return self.fc2(x + self.act(self.fc1(x)))

    return {
        "cnn": (lambda: nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2),
                                      nn.Flatten(), nn.Linear(16, 3)), (2, 1, 4, 4), lambda m, x: m(x).sum()),
        "mlp, input needs its gradient": (lambda: nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.GELU(),
                                                                nn.Linear(8, 3)), (5, 4), lambda m, x: m(x).sum()),
        "residual": (Residual, (3, 4), lambda m, x: m(x).pow(2).mean()),
        "lstm": (lambda: nn.LSTM(4, 3, batch_first=True), (2, 3, 4), lambda m, x: m(x)[0].sum()),
        "attention": (lambda: nn.MultiheadAttention(4, 2, batch_first=True), (2, 3, 4),
                      lambda m, x: m(x, x, x)[0].sum()),
    }


def _structure(line: str) -> str:
    """A trace line with a layer's description cut to its class name (`Linear layer (3 X 2)` and
    `Linear(in_features=3, ...)` both `Linear`): the numbering, leaf names, sums and branches stay."""
    number, text, links = re.match(r"↘︎ (\[\d+\] )?(.*?)((?:  (?:⊕|⇉|gathers).*)?)$", line).groups()
    return f"{number or ''}{text if text.startswith('leaf') else re.match(r'[A-Za-z0-9_]*', text).group(0)}{links}"


@pytest.mark.parametrize("family", list(_families(torch.nn)))
def test_a_tt_nn_network_traces_like_the_same_network_ported_from_torch(family):
    traces = []
    for nn in (tt.nn, torch.nn):
        build, shape, scalar = _families(nn)[family]
        torch.manual_seed(0)
        model = build() if nn is tt.nn else tt.port(build())
        x = torch.randn(shape)
        x = tt.tracer(x, requires_grad=True) if "input" in family or family == "residual" else x
        traces.append([_structure(line) for line in backprop_lines(scalar(model, x))[1:]])
    native, ported = traces
    assert native == ported
    if any(line.startswith("[") for line in native):  # a graph that is not a chain: parameters are named
        assert any(re.match(r"\[\d+\] leaf \w", line) for line in native), native
