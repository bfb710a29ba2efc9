"""A torch autograd Function called on tracers runs its own forward/backward as a torchtrace node (vs torch)."""
import pytest
import torch
from helpers import ExpSaveOutput, RoundSTE, TorchSquare, double_backward_matches
from torch.autograd.function import once_differentiable

import torchtrace as tt


class GradReverse(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, alpha):
        ctx.alpha = alpha
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return -ctx.alpha * g, None


class Cube(torch.autograd.Function):
    """Saves its input; backward in differentiable ops (so double backward works)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x ** 3

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 3 * x ** 2 * g


class MulSetup(torch.autograd.Function):
    """New style: forward without ctx, setup_context saves."""

    @staticmethod
    def forward(x, w, scale=1.0):
        return x * w * scale

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, w, scale = inputs
        ctx.save_for_backward(x, w)
        ctx.scale = scale

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        gx = g * w * ctx.scale if ctx.needs_input_grad[0] else None
        gw = g * x * ctx.scale if ctx.needs_input_grad[1] else None
        return gx, gw, None


class SortWithIndex(torch.autograd.Function):
    """Two outputs, the second non-differentiable (and integer)."""

    @staticmethod
    def forward(ctx, x):
        values, index = torch.sort(x)
        ctx.mark_non_differentiable(index)
        ctx.save_for_backward(index)
        return values, index

    @staticmethod
    def backward(ctx, g, g_index):
        (index,) = ctx.saved_tensors
        return torch.zeros_like(g).scatter(0, index, g)


class SplitHalves(torch.autograd.Function):
    """Several differentiable outputs; materialize_grads off; a non-tensor output too."""

    @staticmethod
    def forward(ctx, x):
        ctx.set_materialize_grads(False)
        n = x.shape[0] // 2
        ctx.n = n
        return x[:n] * 2, x[n:] * 3, n

    @staticmethod
    def backward(ctx, ga, gb, _):
        parts = [ga * 2 if ga is not None else None, gb * 3 if gb is not None else None]
        parts = [p if p is not None else torch.zeros(ctx.n) for p in parts]
        return torch.cat(parts)


class ScaleInPlace(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        x.mul_(2)
        ctx.mark_dirty(x)
        return x

    @staticmethod
    def backward(ctx, g):
        return 2 * g


class OnceSquare(TorchSquare):
    backward = staticmethod(once_differentiable(TorchSquare.backward))


def x64(*shape):
    return torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(sum(shape)))


CASES = {
    "straight_through": (lambda x: RoundSTE.apply(3 * x) * x, [x64(5)]),
    "gradient_reversal": (lambda x: (GradReverse.apply(x.sin(), 0.7) * x).sum(), [x64(4)]),
    "saves_input": (lambda x: Cube.apply(x) + x, [x64(3, 2)]),
    "saves_output": (lambda x: ExpSaveOutput.apply(x * 2), [x64(4)]),
    "setup_context": (lambda x, w: MulSetup.apply(x, w, 2.5), [x64(3), x64(3)]),
    "setup_context_keyword": (lambda x, w: MulSetup.apply(x, w=w.exp(), scale=0.5), [x64(3), x64(3)]),
    "non_differentiable_output": (lambda x: SortWithIndex.apply(x * x)[0], [x64(6)]),
    "multiple_outputs": (lambda x: SplitHalves.apply(x.cos())[0].sum() + SplitHalves.apply(x)[1].prod(), [x64(6)]),
    "mark_dirty": (lambda x: ScaleInPlace.apply(x * 1.5).exp(), [x64(4)]),
    "once_differentiable": (lambda x: OnceSquare.apply(x + 1), [x64(4)]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_matches_torch_autograd(name):
    """The author's backward runs as torch runs it (tt.check would compare with finite differences instead, which a
    straight-through or gradient-reversal backward deliberately is not)."""
    fn, inputs = CASES[name]
    ours = [tt.tracer(x, requires_grad=True) for x in inputs]
    theirs = [x.clone().requires_grad_(True) for x in inputs]
    out_ours, out_theirs = fn(*ours), fn(*theirs)
    torch.testing.assert_close(out_ours.detach().as_subclass(torch.Tensor), out_theirs.detach())
    weights = torch.linspace(-1.0, 2.0, out_theirs.numel(), dtype=out_theirs.dtype).reshape(out_theirs.shape)
    (out_ours * weights).sum().backward()
    (out_theirs * weights).sum().backward()
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a.grad, b.grad)


def test_node_is_named_after_the_function_and_torch_records_nothing():
    x = tt.tracer(x64(3), requires_grad=True)
    y = Cube.apply(x)
    assert type(y) is tt.tracer and y.grad_fn.name == "CubeBackward"
    assert not torch.Tensor.requires_grad.__get__(y) and not torch.Tensor.requires_grad.__get__(x)
    y.sum().backward()
    torch.testing.assert_close(x.grad, 3 * x.detach() ** 2)


def test_forward_runs_on_plain_tensors_recording_nothing():
    seen = []

    class Spy(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            y = x.exp() * 2
            seen.append(getattr(y, "grad_fn", None))
            return y

        @staticmethod
        def backward(ctx, g):
            return g

    Spy.apply(tt.tracer(x64(2), requires_grad=True))
    assert seen == [None]


def test_needs_input_grad_and_keywords():
    flags = []

    class Spy(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a, b, k=1):
            flags.append(ctx.needs_input_grad)
            return a * b * k

        @staticmethod
        def backward(ctx, g):
            return g, g, None

    Spy.apply(tt.tracer(x64(2), requires_grad=True), tt.tracer(x64(2)), k=3)
    assert flags == [(True, False, False)]


def test_plain_tensors_go_to_torch_untouched():
    x = x64(3).requires_grad_()
    y = Cube.apply(x)
    assert type(y) is torch.Tensor and type(y.grad_fn).__name__ == "CubeBackward"
    y.sum().backward()
    torch.testing.assert_close(x.grad, 3 * x.detach() ** 2)


def test_double_backward_through_user_backward():
    double_backward_matches(lambda x: Cube.apply(x.sin()), x64(4))


def test_once_differentiable_refuses_double_backward():
    x = tt.tracer(x64(3), requires_grad=True)
    (g,) = tt.grad(OnceSquare.apply(x).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice a function that was marked with @once_differentiable"):
        g.sum().backward()


def test_mark_dirty_on_a_leaf_is_refused():
    x = tt.tracer(x64(3), requires_grad=True)
    with pytest.raises(RuntimeError, match="ScaleInPlace: a leaf tracer that requires grad was modified in place"):
        ScaleInPlace.apply(x)


def test_mark_dirty_on_a_view_is_refused_rather_than_lost_to_its_base():
    """torch carries the Function's in-place change on into the base's graph; torchtrace says it does not."""
    x = tt.tracer(x64(4).reshape(2, 2), requires_grad=True)
    a = x * 1.0
    with pytest.raises(tt.UnsupportedOperationError, match="forward changed a view in place .mark_dirty."):
        ScaleInPlace.apply(a[0])


def test_retain_graph_semantics():
    x = tt.tracer(x64(3), requires_grad=True)
    y = Cube.apply(x).sum()
    y.backward()
    with pytest.raises(RuntimeError, match="second time"):
        y.backward()


def test_in_a_module_trained_with_tt_optim():
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(4, 8), torch.nn.Linear(8, 1)

        def forward(self, x):
            h = RoundSTE.apply(self.a(x) * 4) / 4
            return self.b(GradReverse.apply(torch.tanh(h), 0.5) + Cube.apply(h) * 0.1)

    torch.manual_seed(0)
    ours, theirs = Net().double(), Net().double()
    theirs.load_state_dict(ours.state_dict())
    ours = tt.port(ours)
    x, target = x64(16, 4), x64(16, 1)
    opt_ours, opt_theirs = tt.optim.Adam(ours.parameters(), lr=0.01), torch.optim.Adam(theirs.parameters(), lr=0.01)
    for _ in range(20):
        for model, opt, inp in ((ours, opt_ours, tt.tracer(x)), (theirs, opt_theirs, x)):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(inp), target).backward()
            opt.step()
    for p, q in zip(ours.parameters(), theirs.parameters()):
        torch.testing.assert_close(p.detach().as_subclass(torch.Tensor), q.detach())


def test_tensors_inside_a_list_argument_get_no_gradient_as_in_torch():
    class SumList(torch.autograd.Function):
        @staticmethod
        def forward(ctx, xs, y):
            return sum(xs) * y

        @staticmethod
        def backward(ctx, g):
            return None, g

    a, y = tt.tracer(x64(2), requires_grad=True), tt.tracer(x64(2), requires_grad=True)
    SumList.apply([a, a], y).sum().backward()
    assert a.grad is None and y.grad is not None


class SeesNone(torch.autograd.Function):
    """materialize_grads off: the unused output's gradient arrives as None, and backward takes another path."""

    @staticmethod
    def forward(ctx, x):
        ctx.set_materialize_grads(False)
        return x * 2, x * 3

    @staticmethod
    def backward(ctx, ga, gb):
        return ga * 2 if gb is None else ga * 2 + gb * 3 + 100


@pytest.mark.parametrize("materialize", [False, True])
def test_set_materialize_grads_false_hands_backward_none_as_torch(materialize):
    """The bridge kept the flag on its own ctx while the engine read the node's: backward received zeros for the
    output no gradient reached and took the other branch (a silently wrong gradient: 102 where torch gives 2)."""
    class Function(SeesNone):
        @staticmethod
        def forward(ctx, x):
            ctx.set_materialize_grads(materialize)
            return x * 2, x * 3

    grads = []
    for x in (tt.tracer(torch.ones(2), requires_grad=True), torch.ones(2, requires_grad=True)):
        Function.apply(x)[0].sum().backward()
        grads.append(x.grad.as_subclass(torch.Tensor))
    assert torch.equal(grads[0], grads[1])
    assert grads[1].tolist() == ([2.0, 2.0] if not materialize else [102.0, 102.0])
