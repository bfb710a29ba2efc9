"""Mistakes with custom Functions and torch machinery: each raises a message as torch's (or a clearer one)."""
import pytest
import torch

import torchtrace as tt


def _square(base, returned):
    class Sq(base):
        @staticmethod
        def forward(ctx, x, scale):
            ctx.save_for_backward(x)
            return x * x * scale

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return returned(g, x)

    return Sq


def _torch_message(returned):
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    with pytest.raises(RuntimeError) as caught:
        _square(torch.autograd.Function, returned).apply(x, 3.0).sum().backward()
    return str(caught.value)


@pytest.mark.parametrize("returned", [
    lambda g, x: g * 2 * x,  # too few: one for two arguments
    lambda g, x: (g * 2 * x, None, g),  # too many, and the extra one is not None
], ids=["too_few", "too_many"])
@pytest.mark.parametrize("base", [tt.Function, torch.autograd.Function], ids=["tt_function", "torch_function"])
def test_a_backward_returning_the_wrong_number_of_gradients_raises_as_torch(base, returned):
    x = tt.tracer([1.0, 2.0], requires_grad=True)
    with pytest.raises(RuntimeError) as caught:
        _square(base, returned).apply(x, 3.0).sum().backward()
    assert str(caught.value) == _torch_message(returned)
    assert "SqBackward returned an incorrect number of gradients" in str(caught.value)


def test_extra_trailing_none_gradients_are_dropped_as_torch():
    returned = lambda g, x: (g * 6 * x, None, None)  # noqa: E731
    x = tt.tracer([1.0, 2.0], requires_grad=True)
    _square(tt.Function, returned).apply(x, 3.0).sum().backward()
    x_torch = torch.tensor([1.0, 2.0], requires_grad=True)
    _square(torch.autograd.Function, returned).apply(x_torch, 3.0).sum().backward()
    torch.testing.assert_close(x.grad, x_torch.grad)
    torch.testing.assert_close(x.grad, torch.tensor([6.0, 12.0]))  # d(3 x^2)/dx = 6x


def test_calling_a_function_class_instead_of_apply_names_apply():
    Sq = _square(tt.Function, lambda g, x: (g * 6 * x, None))
    with pytest.raises(TypeError, match=r"Sq should not be instantiated.*Call Sq\.apply\(\.\.\.\)"):
        Sq(tt.tracer([1.0], requires_grad=True), 3.0)


def test_a_forward_returning_nothing_says_so():
    class Nothing(tt.Function):
        @staticmethod
        def forward(ctx, x):
            x * 2

        @staticmethod
        def backward(ctx, g):
            return g

    with pytest.raises(RuntimeError, match="Nothing.forward returned None: return the output tensor"):
        Nothing.apply(tt.tracer([1.0], requires_grad=True))


def test_a_tensor_made_under_inference_mode_gets_a_torchtrace_message():
    with torch.inference_mode():
        constant = torch.ones(2)
    x_torch = torch.ones(2, requires_grad=True)
    with pytest.raises(RuntimeError, match="Inference tensors cannot be saved for backward"):
        x_torch * constant  # torch refuses too
    x = tt.tracer([1.0, 2.0], requires_grad=True)
    with pytest.raises(RuntimeError, match=r"Mul: a tensor made under torch.inference_mode cannot be saved for "
                                           r"backward .* use a clone made outside it"):
        x * constant
    (x * constant.clone()).sum().backward()
    torch.testing.assert_close(x.grad, torch.ones(2))


def test_torch_compile_on_tracers_names_tt_compile():
    compiled = torch.compile(lambda a: a * 2)
    with pytest.raises(tt.UnsupportedOperationError, match=r"torch.compile: .*use tt.compile\(fn, example_inputs\)"):
        compiled(tt.tracer([1.0], requires_grad=True))


@pytest.mark.parametrize("call", [
    lambda: tt.register(torch.special.expit, rule=int),  # installed int as expit's rule: later calls broke
    lambda: tt.register(torch.special.expit, rule=lambda x: x),
    lambda: tt.register(torch.special.expit, rule=tt.Function),
    lambda: tt.register(5),
    lambda: tt.register("torch.sin"),
    lambda: tt.register(),
    lambda: tt.register(torch.nn.Linear(2, 2), rule=tt.Function),
])
def test_register_refuses_what_is_not_a_torch_callable_and_a_rule(call):
    from torchtrace.autograd.function import RULES

    before = dict(RULES)
    with pytest.raises(TypeError, match="tt.register"):
        call()
    assert RULES == before


@pytest.mark.parametrize("base", [tt.Function, torch.autograd.Function], ids=["tt_function", "torch_function"])
@pytest.mark.parametrize("make", [tt.tracer, torch.tensor], ids=["tracer", "torch_tensor"])
def test_saving_a_number_for_backward_is_refused_as_torch(base, make):
    """ctx.save_for_backward(3) was kept and handed back by saved_tensors; torch refuses anything but tensors and
    None there (other values belong on ctx as attributes)."""
    class Scale(base):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x, None, 3)
            return x * 3

        @staticmethod
        def backward(ctx, g):
            return g * 3

    x = make([1.0, 2.0], requires_grad=True)
    if base is torch.autograd.Function and make is torch.tensor:
        with pytest.raises(TypeError, match="save_for_backward can only save variables, but argument 2 is of type int"):
            Scale.apply(x)
    else:
        with pytest.raises(TypeError, match="save_for_backward can only save tensors .*argument 2 is of type int"):
            Scale.apply(x)


@pytest.mark.parametrize("base", [tt.Function, torch.autograd.Function], ids=["tt_function", "torch_function"])
@pytest.mark.parametrize("returned", ["a view", "the input"])
def test_in_place_on_a_view_a_function_returned_is_refused_as_torch(base, returned):
    """y = F.apply(h) returning h.view(-1) (or h), then y.mul_(2): the write went into h around F's backward (x.grad
    2 where the backward multiplies by 5). torch forbids it; so does torchtrace. Under no_grad it is allowed."""
    class Times5(base):
        @staticmethod
        def forward(ctx, x):
            return x.view(-1) if returned == "a view" else x

        @staticmethod
        def backward(ctx, g):
            return g * 5

    makers = [lambda: tt.tracer(torch.ones(6), requires_grad=True)]
    if base is torch.autograd.Function:  # (a tt.Function on plain tensors is an ordinary call: nothing recorded)
        makers.append(lambda: torch.ones(6, requires_grad=True))
    for make in makers:
        h = make() * 1
        y = Times5.apply(h)
        with pytest.raises(RuntimeError, match="Output 0 of .* is a view and is being modified inplace"):
            y.mul_(2)
        with torch.no_grad():
            y.mul_(2)
    fresh = Times5.apply(tt.tracer(torch.ones(6), requires_grad=True) * 1) * 1
    fresh.mul_(2)  # a result computed from it is an ordinary tensor
