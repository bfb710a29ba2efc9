"""tt.draw (torchtrace/inspect/dot.py): labels, colours, clusters, depth, gradient view, real rendering."""
import os
import sys
import xml.etree.ElementTree as ET

import graphviz
import pytest
import torch

import torchtrace as tt
import torchtrace.nn as nn
from torchtrace.autograd.engine import topological_order
from torchtrace.autograd.state import STATE
from torchtrace.inspect.dot import COLOURS, DotNotFound, Drawing, draw, recording

SVG = "{http://www.w3.org/2000/svg}"


def labels(graph: graphviz.Digraph) -> list:
    """The label of every node statement, newlines as spaces."""
    found = []
    for line in graph.body:
        line = line.strip()
        if " [label=" in line and "->" not in line:
            found.append(line.split('label="', 1)[1].split('"', 1)[0].replace("\n", " "))
    return found


def node_lines(graph: graphviz.Digraph) -> list:
    return [line for line in graph.body if " [label=" in line and "->" not in line]


def edge_lines(graph: graphviz.Digraph) -> list:
    return [line for line in graph.body if "->" in line]


def svg_groups(path: str, kind: str) -> list:
    root = ET.parse(path).getroot()
    return [g for g in root.iter(f"{SVG}g") if g.get("class") == kind]


def small_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))


class LayerNorm(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.bias = nn.Parameter(torch.zeros(width))

    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        var = ((x - mean) ** 2).mean(-1, keepdim=True)
        return (x - mean) / (var + 1e-5).sqrt() * self.weight + self.bias


class Attention(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads, self.qkv, self.proj = heads, nn.Linear(width, 3 * width), nn.Linear(width, width)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in self.qkv(x).split(c, dim=-1))
        mask = torch.ones(t, t, dtype=torch.bool).triu(1)
        att = (q @ k.transpose(-2, -1) / (c // self.heads) ** 0.5).masked_fill(mask, float("-inf")).softmax(-1)
        return self.proj((att @ v).transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.ln1, self.attn, self.ln2 = LayerNorm(width), Attention(width, heads), LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, vocab=11, width=8, heads=2, layers=3, context=6):
        super().__init__()
        self.tok = nn.Parameter(torch.randn(vocab, width) * 0.1)
        self.pos = nn.Parameter(torch.randn(context, width) * 0.1)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln_f, self.head = LayerNorm(width), nn.Linear(width, vocab)

    def forward(self, idx):
        x = self.tok[idx] + self.pos[: idx.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def gpt_loss(record: bool):
    torch.manual_seed(0)
    model = TinyGPT()
    idx = torch.randint(0, 11, (2, 6))
    if record:
        with recording():
            return model, model(idx).sum()
    return model, model(idx).sum()


# ------------------------------------------------------------------------------------ labels, colours


def test_forward_view_labels_ops_shapes_parameters_and_saved_tensors():
    model = small_model()
    y = model(tt.randn(5, 3)).sum()
    graph = draw(y, model)
    assert isinstance(graph, graphviz.Digraph)
    found = labels(graph)
    assert "Sum ()" in found
    assert "LinearFunction (5, 2)" in found and "LinearFunction (5, 4)" in found and "Relu (5, 4)" in found
    for name, p in model.named_parameters():
        assert f"{name} {tuple(p.shape)}".replace(",)", ")") in found
    assert "saved 2.weight (2, 4)" in found  # a saved parameter is named
    assert sum(label.startswith("saved") for label in found) == 4  # x (for W0), relu output, h (for W2), W2 (for h)
    assert "forward view" in graph.source and "|grad|" not in " ".join(found)


def test_colours_by_kind():
    w = tt.randn(3, requires_grad=True)
    x = tt.randn(3, requires_grad=True)
    graph = draw((w * x).sum(), {"w": w}, values=False)
    by_label = {line.split('label="')[1].split("\n")[0]: line for line in node_lines(graph)}
    assert f"fillcolor={COLOURS['parameter']}" in by_label["w"]
    assert f"fillcolor={COLOURS['input']}" in by_label["input"]
    assert f"fillcolor={COLOURS['op']}" in by_label["Mul"]
    assert f"fillcolor={COLOURS['output']}" in by_label["Sum"]
    assert f"fillcolor={COLOURS['saved']}" in by_label["saved w"]


def test_forward_edges_run_from_inputs_to_output():
    x = tt.randn(2, requires_grad=True)
    graph = draw(x.exp().sum(), show_saved=False)
    ids = {label.split()[0]: line.split()[0] for label, line in zip(labels(graph), node_lines(graph))}
    edges = {tuple(line.split()[:3:2]) for line in edge_lines(graph)}
    assert edges == {(ids["x"], ids["Exp"]), (ids["Exp"], ids["Sum"])}  # a small graph: x named by its variable


def test_variable_names_are_used_only_in_the_values_view_without_params():
    x = tt.tracer([1.0, 2.0], requires_grad=True)
    h = x.exp()
    y = h.sum()
    assert labels(draw(y, show_saved=False)) == ["Sum → y | data 10.11", "Exp → h (2) | data [2.718, 7.389]",
                                                 "x (2) | data [1, 2]"]
    assert labels(draw(y, values=False, show_saved=False)) == ["Sum ()", "Exp (2)", "input (2)"]
    assert labels(draw(y, {"w": x}, show_saved=False)) == ["Sum | data 10.11", "Exp (2)", "w (2) | data [1, 2]"]


def test_names_from_a_dict_and_pairs_and_unnamed_leaves():
    a, b = tt.randn(2, requires_grad=True), tt.randn(2, requires_grad=True)
    y = (a * b).sum()
    assert "alpha (2)" in labels(draw(y, {"alpha": a}, values=False))
    assert "input (2)" in labels(draw(y, {"alpha": a}, values=False))
    assert {"alpha (2)", "beta (2)"} <= set(labels(draw(y, [("alpha", a), ("beta", b)], values=False)))


def test_torch_layers_with_tracer_parameters_are_named_and_clustered():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    for layer in (model[0], model[2]):
        layer.weight, layer.bias = nn.Parameter(layer.weight), nn.Parameter(layer.bias)
    graph = draw(model(tt.randn(2, 3)).sum(), model, show_saved=False)
    assert {"0.weight (4, 3)", "2.bias (1)"} <= set(labels(graph))
    assert 'label="0 (Linear)"' in graph.source and 'label="2 (Linear)"' in graph.source


def test_multi_output_op_shows_every_output_shape_and_labels_its_edges():
    x = tt.randn(5, requires_grad=True)
    a, b = x.split([2, 3])
    graph = draw(a.sum() + b.sum())
    assert "Split (2) (3)" in labels(graph)
    assert sorted(line.split('label="')[1].split('"')[0] for line in edge_lines(graph) if "label" in line) == [
        "(2)", "(3)"]


def test_output_without_graph_gives_a_note():
    graph = draw(tt.randn(3))
    assert "nothing recorded" in graph.source


def test_a_leaf_output_is_drawn_as_the_output():
    x = tt.randn(3, requires_grad=True)
    (line,) = node_lines(draw(x, {"x": x}))
    assert "x" in line and COLOURS["output"] in line


@pytest.mark.parametrize("kwargs, message", [
    ({"direction": "sideways"}, "direction must be"),
    ({"depth": 0}, "depth must be a positive"),
])
def test_refused_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        draw(tt.randn(2, requires_grad=True).sum(), **kwargs)


def test_deep_graph_is_drawn_without_recursion():
    x = tt.randn(2, requires_grad=True)
    y = x
    for _ in range(3 * sys.getrecursionlimit()):
        y = y * 1.0
    graph = draw(y.sum(), {"x": x}, show_saved=False)
    assert len(node_lines(graph)) == 3 * sys.getrecursionlimit() + 2
    assert len(edge_lines(graph)) == 3 * sys.getrecursionlimit() + 1


# -------------------------------------------------------------------------------------- gradient view


def test_after_backward_leaves_show_their_gradient_norm_and_arrows_reverse():
    model = small_model()
    y = model(tt.randn(5, 3)).sum()
    forward = draw(y, model, show_saved=False)
    y.backward()
    graph = draw(y, model)
    assert "gradient flow" in graph.source
    found = labels(graph)
    for name, p in model.named_parameters():
        assert any(label.startswith(name + " ") and label.endswith(f"|grad| {p.grad.norm().item():.4g}")
                   for label in found), name
    assert not any(label.startswith("saved") for label in found)  # backward freed them
    flip = {tuple(line.split()[:3:2]) for line in edge_lines(forward)}
    assert {tuple(line.split()[:3:2])[::-1] for line in edge_lines(graph)} == flip
    assert "forward view" in draw(y, model, direction="forward").source


def test_a_new_forward_after_training_steps_is_drawn_forward():
    model = small_model()
    model(tt.randn(5, 3)).sum().backward()  # the parameters now hold .grad
    y = model(tt.randn(5, 3)).sum()
    assert "forward view" in draw(y, model).source
    y.backward()
    assert "gradient flow" in draw(y, model).source
    x = tt.randn(3, requires_grad=True)
    z = (x + 1).sum()  # saves nothing: the leaf's gradient tells
    assert "forward view" in draw(z).source
    z.backward()
    assert "gradient flow" in draw(z).source


def test_recording_labels_ops_and_edges_with_the_gradient_that_flowed():
    w = tt.randn(4, requires_grad=True)
    x = tt.randn(3, 4)
    with recording():
        y = (x * w).sum()
        y.backward()
    found = labels(draw(y, {"w": w}))
    assert "Sum () |grad| 1" in found
    assert f"Mul (3, 4) |grad| {torch.ones(3, 4).norm().item():.4g}" in found
    edge_labels = [line.split('label="')[1].split('"')[0] for line in edge_lines(draw(y, {"w": w}))]
    assert "[" + ", ".join(f"{v:.4g}" for v in w.grad.tolist()) + "]" in edge_labels  # Mul -> w: w.grad
    assert not STATE.on_backward and not STATE.on_record


def test_vanishing_gradients_get_a_red_border():
    w = tt.randn(3, requires_grad=True)
    y = (w * 1e-12).sum()
    y.backward()
    (line,) = [line for line in node_lines(draw(y, {"w": w})) if 'label="w' in line]
    assert "color=red" in line


# ------------------------------------------------------------------------------------ modules, depth


def test_recording_scopes_place_every_op_in_its_module():
    model, loss = gpt_loss(record=True)
    source = draw(loss, model, show_saved=False, depth=None).source  # every op, in its cluster
    for path in ("blocks.0 (Block)", "blocks.0.attn (Attention)", "blocks.2.ln1 (LayerNorm)", "blocks (ModuleList)"):
        assert f'label="{path}"' in source
    attention = source.split('label="blocks.0.attn (Attention)"')[1].split("subgraph")[0]
    assert "Softmax" in attention and "MaskedFill" in attention


def test_depth_collapses_modules_into_boxes():
    model, loss = gpt_loss(record=True)
    full, collapsed = draw(loss, model, depth=None), draw(loss, model, depth=2)
    boxes = sorted(label for label in labels(collapsed) if label.startswith("blocks."))
    order = topological_order([loss.grad_fn])
    for i, box in enumerate(boxes):
        ops = sum(any(m is model.blocks[i] for m in node.module_path) for node in order)
        assert box.startswith(f"blocks.{i} (Block) {ops} ops, ")
    assert all(box.endswith(f"{len(list(model.blocks[0].parameters()))} parameters") for box in boxes)
    assert "Softmax" not in collapsed.source and "Softmax" in full.source
    assert len(node_lines(collapsed)) < len(node_lines(full)) // 5
    assert "shape=box3d" in collapsed.source
    top = draw(loss, model, depth=1)
    assert {label.split(" ops")[0].rsplit(" ", 1)[0] for label in labels(top) if " ops" in label} == {
        "blocks (ModuleList)", "ln_f (LayerNorm)", "head (Linear)"}


def test_without_recording_blocks_are_still_grouped():
    model, loss = gpt_loss(record=False)
    collapsed = draw(loss, model, depth=2, show_saved=False)
    boxes = sorted(label for label in labels(collapsed) if label.startswith("blocks."))
    assert [box.split(" (")[0] for box in boxes] == ["blocks.0", "blocks.1", "blocks.2"]
    assert "Softmax" not in collapsed.source  # the attention ops went into their block
    assert len(node_lines(collapsed)) < 40


def test_collapsed_box_shows_the_gradient_norm_of_its_parameters():
    model = small_model()
    y = model(tt.randn(5, 3)).sum()
    y.backward()
    expected = (model[0].weight.grad.norm() ** 2 + model[0].bias.grad.norm() ** 2).sqrt().item()
    assert f"0 (Linear) 1 ops, 2 parameters |grad| params {expected:.4g}" in labels(draw(y, model, depth=1))


def test_recording_works_for_modules_outside_the_given_model():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Sequential(nn.Linear(2, 2), nn.Tanh()), nn.Linear(2, 1))
    with recording():
        y = model(tt.randn(3, 2)).sum()
    source = draw(y).source  # no names given: made-up, nested
    assert 'label="Sequential_0 (Sequential)"' in source and 'label="Sequential_0.Sequential_1 (Sequential)"' in source
    assert "Sequential_0.Sequential_1.Linear_0.weight" in source
    assert y.grad_fn.module_path == ()  # the sum ran outside every module


# -------------------------------------------------------------------------------------------- render


def test_render_svg_with_dot(tmp_path):
    model = small_model()
    y = model(tt.randn(5, 3)).sum()
    graph = draw(y, model)
    path = graph.render(str(tmp_path / "graph"), format="svg")
    n_saved = sum(label.startswith("saved") for label in labels(graph))
    assert len(svg_groups(path, "node")) == len(node_lines(graph)) == 4 + 4 + n_saved  # ops, parameters, saved
    assert len(svg_groups(path, "edge")) == len(edge_lines(graph))
    assert len(svg_groups(path, "cluster")) == 3
    png = draw(y, model, depth=1).render(str(tmp_path / "small"), format="png")
    assert open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_jupyter_shows_svg():
    bundle = draw(tt.randn(2, requires_grad=True).exp().sum())._repr_mimebundle_()
    assert "<svg" in bundle["image/svg+xml"]


def test_without_dot_the_source_is_kept_with_a_clear_message(tmp_path, monkeypatch):
    graph = draw(tt.randn(2, requires_grad=True).exp().sum())
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(DotNotFound, match="apt-get install graphviz") as raised:
        graph.render(str(tmp_path / "graph"), format="svg")
    assert isinstance(raised.value, graphviz.ExecutableNotFound)
    assert open(raised.value.source_path).read() == graph.source
    assert str(raised.value.source_path) in str(raised.value)
    text = graph._repr_mimebundle_()["text/plain"]
    assert "apt-get install graphviz" in text and graph.source in text
    assert isinstance(graph, Drawing)


# ------------------------------------------------------------------------------- large graphs collapse by default


class TwoLayerLSTM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = torch.nn.LSTM(8, 16, num_layers=2, batch_first=True)
        self.head = torch.nn.Linear(16, 1)

    def forward(self, x):
        out, _ = self.lstm(x)
        return self.head(out[:, -1])


def test_a_large_graph_is_drawn_with_its_modules_collapsed_and_says_how_to_open_them():
    torch.manual_seed(0)
    model = tt.port(TwoLayerLSTM())
    loss = model(torch.randn(4, 10, 8)).pow(2).mean()
    drawn = draw(loss, model)
    assert drawn.collapsed_depth == 1
    assert "lstm (LSTM)" in " ".join(labels(drawn))
    footer = drawn.source.split("\tlabel=")[-1]
    assert "modules 1 level deep drawn collapsed" in footer and "tt.draw(..., depth=None) draws every op" in footer
    assert "depth=2 opens one more level" not in footer  # LSTM and Linear hold no sub-modules
    whole = draw(loss, model, depth=None)
    assert whole.collapsed_depth is None and len(whole.body) > 10 * len(drawn.body)
    assert "drawn collapsed" not in whole.source


def test_auto_collapses_as_deep_as_keeps_the_drawing_small():
    torch.manual_seed(0)
    blocks = [torch.nn.Sequential(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh()),
                                  torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh())) for _ in range(40)]
    model = tt.port(torch.nn.Sequential(*blocks))
    loss = model(torch.randn(2, 4)).pow(2).sum()
    drawn = draw(loss, model)
    assert drawn.collapsed_depth == 2  # 80 boxes (two Sequentials in each of 40 open blocks), not 160 Linear and Tanh
    assert "depth=3 opens one more level" in drawn.source
    small = tt.port(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh()))
    assert draw(small(torch.randn(2, 4)).sum(), small).collapsed_depth is None


def test_the_same_model_is_drawn_the_same_in_every_process():
    """Sibling module clusters were attached in a set's order, which Python's string hashing changes from process to
    process: a notebook's stored drawing came out with its layers swapped (seen on Python 3.10)."""
    import subprocess
    import sys

    program = ("import torch, torchtrace as tt; torch.manual_seed(0); "
               "m = tt.port(torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2), "
               "torch.nn.Tanh())); loss = m(tt.tracer(torch.ones(2, 3))).pow(2).mean(); loss.backward(); "
               "print(tt.draw(loss, m).source)")
    sources = {subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, check=True,
                              env={**os.environ, "PYTHONHASHSEED": str(seed)}).stdout for seed in range(4)}
    assert len(sources) == 1
    source = sources.pop()
    assert source.index("label=\"0 (Linear)\"") < source.index("label=\"1 (Tanh)\"") < source.index(
        "label=\"2 (Linear)\"")


def test_a_leaf_whose_grad_sums_two_backwards_shows_the_last_backwards_gradient_beside_the_sum():
    """After two backwards without zeroing, a leaf's .grad is the sum of both; the drawing's `grad` is the gradient
    of the output with respect to the tensor (the last backward's, as for every op), and `.grad Σ` the sum, each
    compared with torch autograd's. After zeroing, the next backward's drawing shows one grad again."""
    data = torch.tensor([1.0, -2.0])
    x = tt.tracer(data, requires_grad=True)
    y = (x * x * x).sum()
    theirs = data.clone().requires_grad_()
    one = torch.autograd.grad((theirs * theirs * theirs).sum(), theirs)[0].tolist()
    (theirs * theirs * theirs).sum().backward()
    (theirs * theirs * theirs).sum().backward()
    summed = theirs.grad.tolist()
    y.backward(retain_graph=True)
    y.backward()
    label = next(line for line in draw(y).source.splitlines() if "x (2)" in line)

    def numbers(values):
        return "[" + ", ".join(f"{v:g}" for v in values) + "]"
    assert f"grad {numbers(one)}" in label and f".grad {numbers(summed)} Σ" in label
    assert ".grad Σ: the leaf's .grad, which sums the gradients of every backward" in draw(y).source
    x.grad = None
    z = (x * 2).sum()
    z.backward()
    fresh = next(line for line in draw(z).source.splitlines() if "x (2)" in line)
    assert "grad [2, 2]" in fresh and "Σ" not in fresh
