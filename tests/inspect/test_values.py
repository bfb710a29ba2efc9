"""tt.draw's values: micrograd's data | grad boxes, gradients after a plain backward, sums made visible."""
import xml.etree.ElementTree as ET

import pytest
import torch

import torchtrace as tt
from torchtrace.autograd.state import STATE
from torchtrace.inspect.dot import draw, recording

SVG = "{http://www.w3.org/2000/svg}"


def svg_boxes(graph, tmp_path) -> dict:
    """Render with Graphviz's `dot` and read each node's texts back: {first field: [the other fields]}."""
    path = graph.render(str(tmp_path / "graph"), format="svg")
    boxes = {}
    for group in ET.parse(path).getroot().iter(f"{SVG}g"):
        if group.get("class") == "node":
            texts = [t.text.strip() for t in group.iter(f"{SVG}text") if t.text and t.text.strip()]
            boxes[texts[0]] = texts[1:]
    return boxes


def micrograd():
    """micrograd's lecture example: L = (a*b + c) * f with a=2, b=-3, c=10, f=-2."""
    a, b, c, f = (tt.tracer(v, requires_grad=True) for v in (2.0, -3.0, 10.0, -2.0))
    return a, b, c, f


# By hand: e = a*b = -6, d = e + c = 4, L = d*f = -8; dL/dd = f = -2, dL/df = d = 4, dL/de = dL/dc = -2,
# dL/da = -2 * b = 6, dL/db = -2 * a = -4.
EXPECTED = {"a": ("2", "6"), "b": ("-3", "-4"), "c": ("10", "-2"), "f": ("-2", "4"),
            "Mul → e": ("-6", "-2"), "Add → d": ("4", "-2"), "Mul → L": ("-8", "1")}


def check_micrograd_svg(boxes: dict) -> None:
    for header, (data, grad) in EXPECTED.items():
        assert boxes[header] == [f"data {data}", f"grad {grad}"], header


def test_micrograd_example_shows_every_value_and_gradient_in_the_svg(tmp_path):
    a, b, c, f = micrograd()
    with recording():
        e = a * b
        d = e + c
        L = d * f
    L.backward()  # a plain backward, outside the block
    check_micrograd_svg(svg_boxes(draw(L, dict(a=a, b=b, c=c, f=f, e=e, d=d, L=L)), tmp_path))


def test_micrograd_example_without_recording_draw_then_backward(tmp_path):
    a, b, c, f = micrograd()
    e = a * b
    d = e + c
    L = d * f
    names = dict(a=a, b=b, c=c, f=f, e=e, d=d, L=L)
    before = draw(L, names)  # names give the intermediate values; drawing hooks every node
    assert "Mul → e | data -6" in before.source and "| grad" not in before.source
    L.backward()
    check_micrograd_svg(svg_boxes(draw(L, names), tmp_path))
    assert not STATE.on_backward and not STATE.on_record  # nothing global was left installed


def test_intermediate_gradients_after_a_plain_backward_with_recording_only_around_the_forward():
    x = tt.tracer([1.0, -2.0], requires_grad=True)
    with recording():
        y = (x.exp() * 3).sum()
    y.backward()
    source = draw(y).source
    assert f"Exp (2) | data [{torch.e:.4g}, {torch.exp(torch.tensor(-2.0)).item():.4g}] | grad [3, 3]" in source
    assert "Mul (2) | data" in source and "grad [1, 1]" in source
    assert "ops without" not in source  # every op has its value and gradient: the footer claims none missing


def test_a_retained_gradient_of_a_named_tensor_is_shown():
    x = tt.tracer(2.0, requires_grad=True)
    h = x * 3
    h.retain_grad()
    y = h * h
    y.backward()
    assert "Mul → h | data 6 | grad 12" in draw(y, {"x": x, "h": h}).source


# --------------------------------------------------------------------------------- when values show


def test_values_are_the_default_for_small_graphs_only():
    small = tt.tracer([1.0, 2.0], requires_grad=True)
    assert "data [1, 2]" in draw((small * 2).sum()).source
    big = tt.randn(3, 4, requires_grad=True)
    assert "| data" not in draw((big * 2).sum()).source
    assert "| data" not in draw((small * 2).sum(), values=False).source


def test_large_tensors_show_norms_in_plain_notation():
    w = tt.tracer(torch.full((10,), 0.1), requires_grad=True)
    y = (w * w).sum()
    y.backward()
    source = draw(y, {"w": w}, values=True).source
    assert f"w (10) | \\|data\\| {0.1 * 10 ** 0.5:.4g} | \\|grad\\| {0.2 * 10 ** 0.5:.4g}" in source
    assert "0.6325" in source and "e-01" not in source
    assert "|x|: a norm" in source


def test_footer_mentions_only_what_is_drawn():
    x = tt.tracer([1.0, 2.0], requires_grad=True)
    y = (x + 1).sum()  # saves nothing, no module, nothing flagged
    footer = draw(y, values=False).source.split("label=")[-1]
    for absent in ("orange", "lavender", "red border", "data:", "⊕", "labelled"):
        assert absent not in footer
    assert "grey: inputs" in footer and "green: output" in footer
    y.backward()
    footer = draw(y).source.split("label=")[-1]
    assert "data: the tensor's value" in footer and "ops without data" in footer and "ops without grad" not in footer
    zero = tt.tracer([1.0], requires_grad=True)
    z = (zero * 0.0).sum()
    z.backward()
    assert "red border" in draw(z, values=False).source


# ----------------------------------------------------------------------------------- accumulation


def test_a_leaf_used_three_times_has_three_arrows_and_a_sum():
    x = tt.tracer([1.0, 2.0], requires_grad=True)
    with recording():
        y = (x * x + x).sum()
        y.backward()  # inside the block: each arrow carries its gradient
    graph = draw(y, {"x": x})
    (leaf,) = [line for line in graph.body if 'label="x (2)' in line]
    assert "⊕ sums 3 gradients" in leaf and "grad [3, 5]" in leaf
    into_x = [line for line in graph.body if "->" in line and line.split("->")[1].split()[0] == leaf.split()[0]]
    assert sorted(line.split('label="')[1].split('"')[0] for line in into_x) == ["[1, 1]", "[1, 2]", "[1, 2]"]
    assert "labelled with the gradient each carried" in graph.source


def test_sums_are_shown_without_values_too():
    x = tt.randn(3, 4, requires_grad=True)
    y = (x * x).sum()
    assert "⊕ sums 2 gradients" in draw(y, {"x": x}, values=False).source


def test_outputs_of_a_multi_output_op_are_not_summed():
    x = tt.randn(5, requires_grad=True)
    a, b = x.split([2, 3])
    assert "⊕" not in draw(a.sum() + b.sum()).source


@pytest.mark.parametrize("values", [True, False])
def test_record_labels_escape_their_special_characters(values, tmp_path):
    w = tt.randn(6, requires_grad=True)
    y = (w * 2).sum()
    y.backward()
    path = draw(y, {"w{0}|x": w}, values=values).render(str(tmp_path / "g"), format="svg")  # dot parses it
    texts = [t.text for t in ET.parse(path).getroot().iter(f"{SVG}text")]
    assert any(text and text.startswith("w{0}|x") for text in texts)  # drawn as written, not split into fields


# ------------------------------------------------------------------- a plain backward, no ceremony


def test_micrograd_example_after_a_plain_backward_shows_all_fourteen_numbers(tmp_path):
    a, b, c, f = micrograd()
    e = a * b
    d = e + c
    L = d * f
    L.backward()  # nothing recorded, nothing drawn before: a tiny graph keeps its numbers
    check_micrograd_svg({header: texts for header, texts in svg_boxes(draw(L), tmp_path).items()})
    ta, tb, tc, tf = (torch.tensor(v, requires_grad=True) for v in (2.0, -3.0, 10.0, -2.0))
    te = ta * tb
    td = te + tc
    tL = td * tf
    for t in (te, td):
        t.retain_grad()
    tL.backward()  # torch autograd agrees with the hand-derived EXPECTED
    assert (te.grad.item(), td.grad.item(), ta.grad.item(), tb.grad.item()) == (-2.0, -2.0, 6.0, -4.0)
    assert not STATE.on_backward


def test_only_tiny_graphs_note_their_numbers_in_a_plain_backward():
    x = tt.randn(3, 4, requires_grad=True)
    y = (x * 2).sum()
    y.backward()
    assert y.grad_fn.notes is None  # a tensor of 12 elements: nothing was noted
    s = tt.tracer(3.0, requires_grad=True)
    (g,) = tt.grad(s * s, s, create_graph=True)
    g.backward(create_graph=True)
    assert g.grad_fn.notes is None  # a create_graph backward is left alone
    z = (s * s) * 2
    z.backward()
    assert z.grad_fn.notes["grads"][0].item() == 1.0


def test_tiny_graph_stops_at_the_first_large_tensor_or_too_many_nodes():
    from torchtrace.inspect.values import TINY_NODES, tiny_graph

    x = tt.tracer(1.0, requires_grad=True)
    chain = x
    for _ in range(TINY_NODES - 1):
        chain = chain * 1.0
    assert tiny_graph(chain)
    assert not tiny_graph(chain * 1.0)
    assert not tiny_graph((tt.randn(5, requires_grad=True) * 2).sum())


def test_left_to_right_layout():
    x = tt.tracer([1.0, 2.0], requires_grad=True)
    y = (x * 2).sum()
    assert "rankdir=LR" in draw(y, rankdir="LR").source and "rankdir=TB" in draw(y).source
    with pytest.raises(ValueError, match="rankdir"):
        draw(y, rankdir="sideways")
