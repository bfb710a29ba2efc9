"""tt.Function, tt.register, tt.supported_ops."""
import pytest
import torch
from helpers import Cube

import torchtrace as tt
from torchtrace.autograd.function import RULES


class ScaledSigmoid(tt.Function):
    """y = s * sigmoid(x), s a number  ->  dy/dx = y (1 - y / s)"""

    @staticmethod
    def forward(ctx, x, scale=1.0):
        y = scale / (1 + (-x).exp()) if hasattr(x, "exp") else None
        ctx.scale = scale
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        return grad * y * (1 - y / ctx.scale), None


@pytest.fixture
def restore_rules():
    saved = dict(RULES)
    yield
    RULES.clear()
    RULES.update(saved)


def test_apply_records_a_node_and_gets_the_right_gradient():
    x = tt.tracer([1.0, 2.0], requires_grad=True)
    y = Cube.apply(x)
    assert y.grad_fn.name == "CubeBackward" and y.tolist() == [1.0, 8.0]
    y.sum().backward()
    assert x.grad.tolist() == [3.0, 12.0]


def test_apply_without_grad_computes_only():
    y = Cube.apply(tt.tracer([2.0]))
    assert y.grad_fn is None and y.tolist() == [8.0]


def test_needs_input_grad():
    seen = []

    class Probe(tt.Function):
        """z = a * b"""

        @staticmethod
        def forward(ctx, a, b):
            seen.append(ctx.needs_input_grad[:2])
            return a * b

        @staticmethod
        def backward(ctx, g):
            return g, g

    Probe.apply(tt.tracer([1.0], requires_grad=True), tt.tracer([2.0]))
    Probe.apply(tt.tracer([1.0]), tt.tracer([2.0], requires_grad=True))
    assert seen == [(True, False), (False, True)]


def test_custom_function_is_checked_against_torch_and_finite_differences():
    assert tt.check(Cube.apply, torch.rand(3, 2)).ok
    assert tt.gradcheck(Cube.apply, torch.rand(3, 2))


def test_register_makes_a_torch_callable_dispatch_to_a_function(restore_rules):
    tt.register(torch.special.expit, Cube)
    assert torch.special.expit in tt.supported_ops()
    x = tt.tracer([2.0], requires_grad=True)
    y = torch.special.expit(x)  # forward is Cube's: the rule is what runs when recording
    assert y.grad_fn.name == "CubeBackward" and y.tolist() == [8.0]


def test_register_as_decorator(restore_rules):
    @tt.register(torch.i0)
    class I0(tt.Function):
        """y = I0(x)  ->  dy/dx = I1(x)"""

        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return torch.i0(x)

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * torch.special.i1(x)

    x = tt.tracer([0.5, 1.0], requires_grad=True)
    torch.i0(x).sum().backward()
    torch.testing.assert_close(x.grad, torch.special.i1(torch.tensor([0.5, 1.0])))


def test_supported_ops_counts_every_form():
    ops = tt.supported_ops()
    assert torch.mul in ops and torch.Tensor.mul in ops and torch.Tensor.__rsub__ in ops
    assert len(set(ops)) == len(ops)


def test_keyword_tensor_arguments_get_their_gradient():
    x = tt.tracer([1.0, 2.0], requires_grad=True)
    y = tt.tracer([3.0, 4.0], requires_grad=True)
    torch.add(x, other=y, alpha=2).sum().backward()
    assert x.grad.tolist() == [1.0, 1.0] and y.grad.tolist() == [2.0, 2.0]


def test_a_function_whose_forward_returns_its_input_still_records_its_backward():
    class DoubleTheGradient(tt.Function):
        """y = x  ->  dx = 2g (a deliberately custom gradient)"""

        @staticmethod
        def forward(ctx, x):
            return x

        @staticmethod
        def backward(ctx, g):
            return g * 2

    x = tt.tracer(torch.ones(3), requires_grad=True)
    y = DoubleTheGradient.apply(x)
    assert y is not x and y.grad_fn is not None
    y.sum().backward()
    assert torch.equal(x.grad, torch.full((3,), 2.0))


class KeepsItsOwnRule(tt.Function):
    """y = 3x -> dy/dx = 3; forward stores attributes named like torchtrace's own (torch allows any name)"""

    @staticmethod
    def forward(ctx, x):
        ctx.rule, ctx.edges, ctx.saved = "times three", None, None
        ctx.save_for_backward(x)
        return x * 3

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * 3 + x * 0


def test_attributes_a_users_function_sets_on_ctx_do_not_break_the_engine():
    x = tt.tracer(torch.randn(3, dtype=torch.float64), requires_grad=True)
    y = KeepsItsOwnRule.apply(x).sum()
    y.backward(retain_graph=True)
    y.backward()
    assert torch.equal(x.grad.as_subclass(torch.Tensor), torch.full((3,), 6.0, dtype=torch.float64))
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        y.backward()  # as torch: the saved tensors were freed


def test_a_users_function_setting_ctx_attributes_matches_torch():
    class TorchTwin(torch.autograd.Function):
        forward, backward = KeepsItsOwnRule.forward, KeepsItsOwnRule.backward

    x = torch.randn(3, dtype=torch.float64)
    ours = tt.tracer(x, requires_grad=True)
    theirs = x.clone().requires_grad_(True)
    KeepsItsOwnRule.apply(ours).sum().backward()
    TorchTwin.apply(theirs).sum().backward()
    torch.testing.assert_close(ours.grad.as_subclass(torch.Tensor), theirs.grad)
    assert tt.gradcheck(KeepsItsOwnRule.apply, x.clone())


def _flag_recorder(base: type) -> type:
    """The same Function for torch and torchtrace: it unpacks needs_input_grad as torch code does."""

    class Scaled(base):
        seen = []

        @staticmethod
        def forward(ctx, a, b, k):
            need_a, need_b, need_k = ctx.needs_input_grad  # one flag per argument in torch
            Scaled.seen.append((need_a, need_b, need_k))
            ctx.save_for_backward(a, b)
            ctx.k = k
            return a * b * k

        @staticmethod
        def backward(ctx, g):
            a, b = ctx.saved_tensors
            need_a, need_b, _ = ctx.needs_input_grad
            return (g * b * ctx.k if need_a else None), (g * a * ctx.k if need_b else None), None

    return Scaled


@pytest.mark.parametrize("a_grad, b_grad", [(True, False), (False, True), (True, True)])
def test_needs_input_grad_has_one_flag_per_argument_as_torchs(a_grad, b_grad):
    """It had 16 (padded with False): `need_a, need_b = ctx.needs_input_grad` raised ValueError."""
    values = torch.tensor([1.5, -2.0], dtype=torch.float64), torch.tensor([0.5, 3.0], dtype=torch.float64)
    ours, theirs = _flag_recorder(tt.Function), _flag_recorder(torch.autograd.Function)
    a, b = (tt.tracer(v.clone(), requires_grad=r) for v, r in zip(values, (a_grad, b_grad)))
    ta, tb = (v.clone().requires_grad_(r) for v, r in zip(values, (a_grad, b_grad)))
    ours.apply(a, b, 2.0).sum().backward()
    theirs.apply(ta, tb, 2.0).sum().backward()
    assert ours.seen == theirs.seen == [(a_grad, b_grad, False)]
    for mine, torchs in ((a, ta), (b, tb)):
        assert (mine.grad is None) == (torchs.grad is None)
        if torchs.grad is not None:
            torch.testing.assert_close(mine.grad.as_subclass(torch.Tensor), torchs.grad)
    assert ours.apply(*values, 3.0).tolist() == (values[0] * values[1] * 3.0).tolist()  # plain tensors: a call
    assert ours.seen[-1] == (False, False, False)


def _sort_and_mask(base: type, materialize: bool) -> type:
    """The same Function for torch and torchtrace: a float output and an index marked non-differentiable."""

    class SortAndMask(base):
        seen = []

        @staticmethod
        def forward(ctx, a):
            s, i = a.sort()
            mask = (a > 0).to(a.dtype)
            ctx.mark_non_differentiable(i, mask)
            ctx.set_materialize_grads(materialize)
            ctx.save_for_backward(i)
            return s, i, mask

        @staticmethod
        def backward(ctx, gs, gi, gm):
            SortAndMask.seen.append((gi is None, gm is None, None if gm is None else gm.tolist()))
            (i,) = ctx.saved_tensors
            return torch.zeros_like(gs).scatter(0, i, gs)

    return SortAndMask


@pytest.mark.parametrize("materialize", [True, False])
def test_mark_non_differentiable_and_set_materialize_grads_act_as_torchs(materialize):
    """tt.Function's ctx had neither (AttributeError)."""
    values, weights = torch.tensor([3.0, -1.0, 2.0], dtype=torch.float64), torch.tensor([1.0, 2.0, 3.0],
                                                                                          dtype=torch.float64)
    results = {}
    for name, base, a in [("ours", tt.Function, tt.tracer(values.clone(), requires_grad=True)),
                          ("torch", torch.autograd.Function, values.clone().requires_grad_())]:
        fn = _sort_and_mask(base, materialize)
        s, i, mask = fn.apply(a)
        assert s.requires_grad and not i.requires_grad and not mask.requires_grad and mask.grad_fn is None
        (s * weights).sum().backward()
        results[name] = a.grad.as_subclass(torch.Tensor), fn.seen
    assert results["ours"][1] == results["torch"][1]
    torch.testing.assert_close(*[grad for grad, _ in results.values()])
    numeric = torch.stack([((values + e).sort()[0] * weights).sum() - ((values - e).sort()[0] * weights).sum()
                           for e in torch.eye(3, dtype=torch.float64) * 1e-6]) / 2e-6
    torch.testing.assert_close(results["ours"][0], numeric)


def test_mark_dirty_is_refused_with_what_to_do():
    class Double(tt.Function):  # forward marks its input dirty, then doubles it in place
        forward = staticmethod(lambda ctx, a: (ctx.mark_dirty(a), a.mul_(2))[1])
        backward = staticmethod(lambda ctx, g: 2 * g)

    with pytest.raises(tt.UnsupportedOperationError, match="mark_dirty.*clone"):
        Double.apply(tt.tracer([1.0, 2.0], requires_grad=True) * 1)


@pytest.mark.parametrize("base", ["tt", "torch"])
def test_a_function_in_torch_2_style_with_setup_context_as_torch(base):
    """forward(x, k=2.0) without ctx, and setup_context(ctx, inputs, output): tt.Function called forward(ctx, x, k)
    (a TypeError, or ctx taken as x when k had a default). inputs have forward's defaults filled in, as torch's."""
    seen = []

    def make(parent):
        class Scale(parent):
            @staticmethod
            def forward(x, k=2.0):
                return x * k

            @staticmethod
            def setup_context(ctx, inputs, output):
                seen.append(len(inputs))
                ctx.k = inputs[1]
                ctx.save_for_backward(inputs[0])

            @staticmethod
            def backward(ctx, g):
                (x,) = ctx.saved_tensors
                return g * ctx.k + x * 0, None

        return Scale

    ours = make(tt.Function if base == "tt" else torch.autograd.Function)
    theirs = make(torch.autograd.Function)
    values = torch.tensor([1.0, -2.0], dtype=torch.float64)
    x = tt.tracer(values.clone(), requires_grad=True)
    (ours.apply(x) * x).sum().backward()
    plain = values.clone().requires_grad_()
    (theirs.apply(plain) * plain).sum().backward()
    torch.testing.assert_close(x.grad.as_subclass(torch.Tensor), plain.grad)
    torch.testing.assert_close(x.grad.as_subclass(torch.Tensor), 4 * values)  # d/dx 2x·x = 4x
    y = ours.apply(tt.tracer(values.clone(), requires_grad=True), 3.0)
    assert y.tolist() == [3.0, -6.0] and seen == [2, 2, 2]


@pytest.mark.parametrize("size", [3, 30])
def test_a_gradient_of_a_wrong_shape_is_named_by_its_function_on_small_graphs_too(size):
    """A backward returning a gradient that cannot be summed to its input's shape raises naming the Function and
    both shapes, as torch's message does; on a small graph the value notes for tt.draw raised torch's bare
    'size {[3]} is not expandable to size {[4]}' first."""
    class Wrong(tt.Function):
        forward = staticmethod(lambda ctx, x: x * 2)
        backward = staticmethod(lambda ctx, g: torch.ones(size + 1))  # one element too many

    x = tt.tracer(torch.ones(size), requires_grad=True)
    with pytest.raises(RuntimeError, match=rf"WrongBackward.backward returned a gradient of shape \({size + 1},\) for "
                                           rf"an input of shape \({size},\)"):
        Wrong.apply(x).sum().backward()
