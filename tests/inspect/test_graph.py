"""tt.trace: the recorded graph of one run, printable, serialisable, comparable between runs."""
import json

import pytest
import torch

import torchtrace as tt
from torchtrace.inspect.graph import trace


class Branchy(torch.nn.Module):
    """A data-dependent branch: torch.jit.trace would freeze one of the two paths."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(3, 2)

    def forward(self, x):
        h = self.fc(x)
        return torch.relu(h) * 2 if x.sum() > 0 else torch.tanh(h)


def make_model():
    torch.manual_seed(0)
    return tt.port(Branchy())


def test_trace_lists_nodes_edges_modules_and_shapes():
    model = make_model()
    graph = trace(model, torch.ones(4, 3))
    ops = [n["op"] for n in graph.nodes]
    assert ops[:2] == ["fc.weight", "fc.bias"] or set(ops[:2]) == {"fc.weight", "fc.bias"}
    linear = next(n for n in graph.nodes if n["kind"] == "op")
    assert linear["module"] == "fc" and linear["shape"] == [4, 2] and linear["dtype"] == "torch.float32"
    assert "Relu" in ops and "Tanh" not in ops
    assert all(0 <= src < dst for src, dst in graph.edges)
    text = str(graph)
    assert text.startswith(f"Graph: {len(graph.nodes)} nodes") and "fc.weight" in text


def test_to_dict_is_json_serialisable():
    graph = trace(make_model(), torch.ones(2, 3))
    data = json.loads(json.dumps(graph.to_dict()))
    assert len(data["nodes"]) == len(graph.nodes) and len(data["edges"]) == len(graph.edges)


def test_diff_shows_the_branch_that_changed_and_both_branches_get_right_gradients():
    model = make_model()
    positive, negative = torch.ones(4, 3), -torch.ones(4, 3)
    changes = trace(model, positive).diff(trace(model, negative))
    assert any(line.startswith("- Relu") for line in changes)
    assert any(line.startswith("+ Tanh") for line in changes)
    assert trace(model, positive).diff(trace(model, positive * 2)) == []
    weight, bias = model.fc.weight.detach().as_subclass(torch.Tensor), model.fc.bias.detach().as_subclass(torch.Tensor)

    def functional(x, w, b):
        h = torch.nn.functional.linear(x, w, b)
        return torch.relu(h) * 2 if x.sum() > 0 else torch.tanh(h)

    for x in (positive, negative):
        assert tt.check(functional, x, weight, bias).ok


def test_trace_of_what_is_not_callable_says_what_it_takes():
    """tt.trace(loss) raised "'tracer' object is not callable" from inside."""
    loss = (tt.tracer([1.0, 2.0], requires_grad=True) * 2).sum()
    with pytest.raises(TypeError, match=r"tt.trace\(model, x\)"):
        tt.trace(loss)
