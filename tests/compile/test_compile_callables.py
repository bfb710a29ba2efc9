"""Callables that are a new object on every access (`x.T`'s getter, `Cls.apply`) are matched by what they are: a
function that uses them takes one path, and its calls replay. So does a function that reads a view after its base
changed in place (the view's version moved with its base's: it never matched, and every call added a path)."""
import copy

import pytest
import torch
from helpers import Cube, ExpSaveOutput, TorchSquare
from references import finite_differences, plain, torch_grads

import torchtrace as tt
from torchtrace.port import port


def _view_read_after_its_base_changed(x, w):
    h = x @ w.T
    v = h[1]
    h.mul_(2.0)
    return (v * v).sum() + h.sum()


FUNCTIONS = {
    "T": lambda x, w: (x @ w.T).tanh().sum(),
    "mT": lambda x, w: (x @ w.mT).tanh().sum(),
    "mH": lambda x, w: (x @ w.mH).tanh().sum(),
    "autograd.Function.apply": lambda x, w: TorchSquare.apply(x @ w.T).sum(),
    "tt.Function.apply": lambda x, w: Cube.apply(torch.tanh(x @ w.t())).sum(),
    "a view read after its base changed": _view_read_after_its_base_changed,
}
CALLS = 6


@pytest.mark.parametrize("name", list(FUNCTIONS))
def test_calls_replay_on_one_path_with_eagers_torchs_and_finite_differences_gradients(name):
    fn = FUNCTIONS[name]
    torch.manual_seed(0)
    w0 = torch.randn(3, 4, dtype=torch.float64)
    w = tt.tracer(w0, requires_grad=True)
    compiled = tt.compile(fn, ())
    for _ in range(CALLS):
        x0 = torch.randn(2, 4, dtype=torch.float64)
        x = tt.tracer(x0, requires_grad=True)
        w.grad = None
        out = compiled(x, w)
        out.backward()
        ours = plain(w.grad), plain(x.grad)
        w.grad = x.grad = None
        eager = fn(x, w)
        eager.backward()
        assert torch.equal(plain(out), plain(eager))
        assert torch.equal(ours[0], plain(w.grad)) and torch.equal(ours[1], plain(x.grad))
        leaves = [x0.clone().requires_grad_(), w0.clone().requires_grad_()]
        expected = torch_grads(lambda: fn(*leaves), leaves)
        numeric = finite_differences(lambda: fn(*(t.detach() for t in leaves)), [t.data for t in leaves])
        for a, b, c in zip((ours[1], ours[0]), expected, numeric):
            torch.testing.assert_close(a, b)
            torch.testing.assert_close(a, c, rtol=1e-5, atol=1e-6)
    assert len(compiled.program.paths()) == 1
    assert compiled.replayed == CALLS - 1


@pytest.mark.parametrize("name", ["encoder layer", "attention"])
def test_a_ported_transformer_replays_on_one_path(name):
    torch.manual_seed(0)
    if name == "attention":
        model = torch.nn.MultiheadAttention(8, 2, batch_first=True).double()
        loss = lambda m, x: m(x, x, x)[0].pow(2).sum()  # noqa: E731
    else:
        model = torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True).double()
        loss = lambda m, x: m(x).pow(2).sum()  # noqa: E731
    ported = port(copy.deepcopy(model))
    compiled = tt.compile(lambda x: loss(ported, x), ())
    for _ in range(4):
        x = torch.randn(2, 5, 8, dtype=torch.float64)
        ported.zero_grad(set_to_none=True)
        out = compiled(tt.tracer(x))
        out.backward()
        ours = [plain(p.grad) for p in ported.parameters()]
        ported.zero_grad(set_to_none=True)
        eager = loss(ported, tt.tracer(x))
        eager.backward()
        assert torch.equal(plain(out), plain(eager))
        expected = torch_grads(lambda: loss(model, x), list(model.parameters()))
        for a, p, e in zip(ours, ported.parameters(), expected):
            assert torch.equal(a, plain(p.grad))
            torch.testing.assert_close(a, e)
    assert len(compiled.program.paths()) == 1
    assert compiled.replayed == 3


class _TripledInPlace(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.mark_dirty(x)
        return x.mul_(3)

    @staticmethod
    def backward(ctx, g):
        return g * 3


@pytest.mark.parametrize("how", ["tt.grad of the input", "backward(inputs=)", "create_graph", "mark_dirty"])
def test_a_torch_autograd_function_between_replayed_statements_keeps_torchs_gradient_on_every_call(how):
    """The Function's apply is a statement of its own (run eagerly, between two segments): a gradient restricted to
    the input, a second derivative and an in-place Function reach the input through it on every call, as torch's."""
    x0, p0 = torch.tensor([0.3, -0.7], dtype=torch.float64), torch.tensor([1.1, 0.4], dtype=torch.float64)

    def f(x, p):
        if how == "mark_dirty":
            return _TripledInPlace.apply((x * p).cos()).pow(2).sum()
        return ExpSaveOutput.apply(x.sin() * p).sum()

    def gradient(fn, make):
        x, p = make(x0), make(p0)
        out = fn(x, p)
        grad = tt.grad if isinstance(x, tt.tracer) else torch.autograd.grad
        if how == "backward(inputs=)":
            out.backward(inputs=[x])
            return plain(x.grad)
        if how == "create_graph":
            (g,) = grad(out, x, create_graph=True)
            return plain(grad(g.sum(), x)[0])
        return plain(grad(out, x)[0])

    expected = gradient(f, lambda t: t.clone().requires_grad_(True))
    compiled = tt.compile(f, (tt.tracer(x0), tt.tracer(p0)))
    for _ in range(4):
        torch.testing.assert_close(gradient(compiled, lambda t: tt.tracer(t.clone(), requires_grad=True)), expected)
