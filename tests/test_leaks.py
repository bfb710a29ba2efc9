"""Long runs do not grow memory; no cache keeps user classes (tt.Function, autograd.Function) or their closures."""
import gc
import tracemalloc
import weakref

import pytest
import torch
from helpers import ExpSaveOutput

import torchtrace as tt


def model_and_data():
    torch.manual_seed(0)
    model = tt.port(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)))
    return model, tt.tracer(torch.randn(16, 8)), torch.randn(16, 1)


def define_function(payload: torch.Tensor) -> type:
    """A fresh tt.Function whose forward closes over `payload` (as user code defining rules in a loop does)."""

    class Scale(tt.Function):
        """y = x * s -> dy/dx = s"""

        @staticmethod
        def forward(ctx, x, scale=1.0):
            ctx.scale = scale * float(payload[0])
            return x * ctx.scale

        @staticmethod
        def backward(ctx, g):
            return g * ctx.scale, None

    return Scale


def define_autograd_function(payload: torch.Tensor) -> type:
    class Twice(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2 * float(payload[0])

        @staticmethod
        def backward(ctx, g):
            return g * 2 * float(payload[0])

    return Twice


def step(model, optimizer, x, y, extra=None):
    optimizer.zero_grad()
    out = model(x)
    if extra is not None:
        out = extra(out)
    loss = torch.nn.functional.mse_loss(out, y)
    loss.backward()
    optimizer.step()


def grow(steps: int, make_extra=None) -> float:
    """Traced memory growth (bytes) between step 200 and step `steps`."""
    model, x, y = model_and_data()
    optimizer = tt.optim.Adam(model.parameters(), lr=1e-3)
    tracemalloc.start()
    try:
        for i in range(steps):
            step(model, optimizer, x, y, make_extra(i) if make_extra else None)
            if i == 199:
                gc.collect()
                start = tracemalloc.get_traced_memory()[0]
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - start
    finally:
        tracemalloc.stop()


def test_training_for_1000_steps_does_not_grow_memory():
    assert grow(1000) < 200_000


@pytest.mark.parametrize("keyword", [
    False,
    True,
], ids=["positional", "keyword"])
def test_functions_defined_in_a_loop_are_freed(keyword):
    """1,000 training steps, each defining a tt.Function; a keyword call goes through the dispatcher's signature
    cache, which today keeps every forward (and the closure it holds) alive."""
    refs = []

    def extra(i):
        payload = torch.full((1000,), 1.0)  # 4 kB per class that must not be kept
        fn = define_function(payload)
        refs.append((weakref.ref(fn), weakref.ref(payload)))
        if keyword:
            return lambda out: fn.apply(out) + fn.apply(out, scale=0.5)
        return lambda out: fn.apply(out) + fn.apply(out, 0.5)

    model, x, y = model_and_data()
    optimizer = tt.optim.SGD(model.parameters(), lr=1e-3)
    for i in range(1000):
        step(model, optimizer, x, y, extra(i))
    gc.collect()
    alive = sum(cls() is not None or payload() is not None for cls, payload in refs)
    assert alive <= 1


def test_autograd_functions_defined_in_a_loop_are_freed():
    refs = []
    model, x, y = model_and_data()
    optimizer = tt.optim.SGD(model.parameters(), lr=1e-3)
    for _ in range(300):
        payload = torch.full((1000,), 1.0)
        fn = define_autograd_function(payload)
        refs.append((weakref.ref(fn), weakref.ref(payload)))
        step(model, optimizer, x, y, fn.apply)
        del fn, payload
    gc.collect()
    assert sum(cls() is not None or payload() is not None for cls, payload in refs) <= 1


def test_checkpointed_training_does_not_grow_memory():
    import torch.utils.checkpoint as ckpt

    model, x, y = model_and_data()
    optimizer = tt.optim.SGD(model.parameters(), lr=1e-3)
    inner = model[0]
    tracemalloc.start()
    try:
        for i in range(400):
            optimizer.zero_grad()
            h = ckpt.checkpoint(inner, x, use_reentrant=i % 2 == 0)
            torch.nn.functional.mse_loss(model[2](torch.relu(h)), y).backward()
            optimizer.step()
            if i == 99:
                gc.collect()
                start = tracemalloc.get_traced_memory()[0]
        gc.collect()
        assert tracemalloc.get_traced_memory()[0] - start < 200_000
    finally:
        tracemalloc.stop()


pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _graph_freed_by_refcounts(build, backward: bool) -> bool:
    """Whether the graph of build()'s scalar result dies when the result does, with the cycle collector off (as
    torch's: a cycle would keep every tensor of the graph until the collector happened to run)."""
    gc.collect()
    gc.disable()
    try:
        loss = build()
        node = weakref.ref(loss.grad_fn)
        if backward:
            loss.backward()
        del loss
        return node() is None
    finally:
        gc.enable()


@pytest.mark.parametrize("backward", [True, False])
@pytest.mark.parametrize("kind", ["eager", "autograd.Function", "compiled"])
def test_a_graph_is_freed_by_reference_counting_alone(kind, backward):
    torch.manual_seed(0)
    model = tt.port(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)))
    x = torch.randn(4, 8)

    def f(x):
        return model(x).exp().sum()

    build = {"eager": lambda: f(x), "autograd.Function": lambda: ExpSaveOutput.apply(model(x)).sum(),
             "compiled": (lambda compiled: lambda: compiled(x))(tt.compile(f, (x,)))}[kind]
    for _ in range(3):  # (the compiled call records, then replays)
        assert _graph_freed_by_refcounts(build, backward)


@pytest.mark.parametrize("hook", ["register_prehook", "register_hook"])
@pytest.mark.parametrize("backward", [True, False])
def test_a_compiled_graph_with_a_hook_on_an_intermediates_grad_fn_is_freed_by_reference_counting(hook, backward):
    """The hook's lists live on the statement, not its grad_fn (whose edges lead back to the call's node)."""
    torch.manual_seed(0)
    w = tt.tracer(torch.randn(8, 4), requires_grad=True)
    seen = []

    def f(x):
        a = torch.tanh(x @ w)
        return (a.sigmoid() * a).sum(), a

    compiled = tt.compile(f, (torch.randn(3, 8),))
    for _ in range(3):  # (the compiled call records, then replays)
        gc.collect()
        gc.disable()
        try:
            loss, a = compiled(torch.randn(3, 8))
            getattr(a.grad_fn, hook)(lambda *grads: seen.append(len(grads)))
            hooked, graph = weakref.ref(a.grad_fn), weakref.ref(a._tt_node)
            if backward:
                loss.backward()
            del loss, a
            assert hooked() is None and graph() is None
        finally:
            gc.enable()
    assert len(seen) == (3 if backward else 0)


def test_a_compiled_functions_recording_call_frees_its_graph_once_it_is_done():
    """A float refusal kept from judging a rule held, by its traceback, every frame of the recording call: its
    loss, inputs, activations and saved tensors lived until the next rule was judged (never, on a steady path)."""
    torch.manual_seed(0)
    model = tt.port(torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)))
    target = torch.randint(0, 4, (16,))
    run = tt.compile(lambda x, y: torch.nn.functional.cross_entropy(model(x), y), (tt.randn(16, 8), target))
    first_input = tt.randn(16, 8)
    loss = run(first_input, target)  # the recording call (cross_entropy's rule branches on a float: refused)
    loss.backward()
    alive = [weakref.ref(first_input), weakref.ref(loss)]
    del loss, first_input
    for _ in range(3):
        run(tt.randn(16, 8), target).backward()
    gc.collect()
    assert [ref() for ref in alive] == [None, None]
