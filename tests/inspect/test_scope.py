"""module_scope: plain torch modules join the core's per-thread module stack, so every tool reads node.module_path."""
import threading

import torch

import torchtrace as tt
import torchtrace.nn as nn
from torchtrace.autograd.state import STATE
from torchtrace.inspect.dot import draw
from torchtrace.inspect.graph import trace
from torchtrace.inspect.scope import module_scope, path_name


def plain_model():
    """Plain torch modules with tracer parameters: neither tt.nn nor ported, so they push nothing themselves."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Tanh())
    model[0].weight, model[0].bias = nn.Parameter(model[0].weight), nn.Parameter(model[0].bias)
    return model


def test_plain_torch_modules_are_on_the_node_inside_the_scope_only():
    model = plain_model()
    with module_scope():
        y = model(tt.randn(1, 2))
    assert y.grad_fn.module_path == (model, model[1])
    assert not STATE.module_stack
    assert model(tt.randn(1, 2)).grad_fn.module_path == ()  # the global hooks are gone


def test_modules_that_push_themselves_are_not_pushed_twice():
    torch.manual_seed(0)
    inner = nn.Linear(2, 2)
    ported = tt.port(torch.nn.Sequential(torch.nn.Linear(2, 2)))
    with module_scope(), module_scope():  # nested scopes install the hooks once
        assert inner(tt.randn(1, 2)).grad_fn.module_path == (inner,)
        assert ported(torch.randn(1, 2)).grad_fn.module_path == (ported, ported[0])
    assert not STATE.module_stack


def test_another_threads_modules_do_not_label_this_threads_nodes():
    started, release, seen = threading.Event(), threading.Event(), {}

    class Waiting(torch.nn.Module):
        def forward(self, x):
            started.set()
            release.wait(5)
            return x

    def other():
        with module_scope():
            torch.nn.Sequential(Waiting())(tt.randn(1))

    thread = threading.Thread(target=other)
    thread.start()
    started.wait(5)
    with module_scope():
        seen["y"] = (tt.randn(2, requires_grad=True) * 2).grad_fn.module_path  # the other thread is inside a module
    release.set()
    thread.join()
    assert seen["y"] == ()


def test_names_come_from_the_model_else_from_class_names():
    model = plain_model()
    with module_scope():
        node = model(tt.randn(1, 2)).grad_fn
    assert path_name(node.module_path, {id(model[1]): "1"}) == "1"
    assert path_name(node.module_path) == "Sequential.Tanh"
    assert path_name(()) == ""


def test_trace_and_draw_read_the_module_path_from_the_nodes():
    model = plain_model()
    graph = trace(model, tt.randn(1, 2))
    assert [n["module"] for n in graph.nodes if n["kind"] == "op"] == ["0", "1"]
    with tt.recording():
        y = model(tt.randn(1, 2)).sum()
    source = draw(y, model, values=False).source
    assert 'label="0 (Linear)"' in source and 'label="1 (Tanh)"' in source
    assert source.split('label="1 (Tanh)"')[1].split("}")[0].count("Tanh") == 1  # the Tanh op sits in its cluster
