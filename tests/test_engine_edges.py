"""Calls at the edges of the engine behave as torch's: keyword spellings of builtins that torch's argument parser
accepts (x1= / x2= / x= / input= / other=), torch.detach as a function, deepcopy of a non-leaf, tt.grad's message,
tt.check of a function that draws random numbers, and torch's weight_norm parametrization on a ported module."""
import copy

import pytest
import torch
import torch.nn.functional as F
from helpers import WrongSquare

import torchtrace as tt


def _positive(*shape):
    return torch.rand(*shape, dtype=torch.float64) + 0.5


SPELLINGS = [  # (name, torch callable, keyword arguments)
    ("xlogy(input=, other=)", torch.xlogy, lambda a, b: {"input": a, "other": b}),
    ("xlogy(x1=, x2=)", torch.xlogy, lambda a, b: {"x1": a, "x2": b}),
    ("xlogy(x=, y=)", torch.xlogy, lambda a, b: {"x": a, "y": b}),  # torch refuses y=
    ("mul(x1=, x2=)", torch.mul, lambda a, b: {"x1": a, "x2": b}),
    ("mul(x=, other=)", torch.mul, lambda a, b: {"x": a, "other": b}),
    ("mul(self=, other=)", torch.mul, lambda a, b: {"self": a, "other": b}),  # torch refuses self=
    ("sub(a=, other=, alpha=)", torch.sub, lambda a, b: {"a": a, "other": b, "alpha": 3}),
    ("t_copy(input=)", torch.t_copy, lambda a, b: {"input": a}),
    ("t_copy(x=)", torch.t_copy, lambda a, b: {"x": a}),
    ("diagonal_copy(input=, offset=)", torch.diagonal_copy, lambda a, b: {"input": a, "offset": 1}),
    ("diagonal_copy(a=)", torch.diagonal_copy, lambda a, b: {"a": a}),
    ("detach(input=)", torch.detach, lambda a, b: {"input": a * b}),
    ("fill(input=, value=)", torch.fill, lambda a, b: {"input": a, "value": 2.5}),  # torch.overrides lacks fill
]


def _outcome(call, kwargs, a, b):
    """(value, gradients of a and b) of call(**kwargs(a, b)).sum() backward, or the error torch's parser raised."""
    try:
        out = call(**kwargs(a, b))
    except TypeError as error:
        return str(error)
    if out.requires_grad:
        (out * torch.arange(1.0, out.numel() + 1, dtype=out.dtype).view(out.shape)).sum().backward()
    return out.detach().as_subclass(torch.Tensor), a.grad, b.grad


@pytest.mark.parametrize("name, call, kwargs", SPELLINGS, ids=[s[0] for s in SPELLINGS])
def test_keyword_spellings_behave_as_torch(name, call, kwargs):
    a, b = _positive(3, 3), _positive(3, 3)
    theirs = _outcome(call, kwargs, a.clone().requires_grad_(True), b.clone().requires_grad_(True))
    ours = _outcome(call, kwargs, tt.tracer(a, requires_grad=True), tt.tracer(b, requires_grad=True))
    if isinstance(theirs, str):  # torch refuses the spelling: the same error, raised by torch's own parser
        assert ours.replace("tracer", "Tensor") == theirs  # torch's message names the argument types
        return
    assert not isinstance(ours, str), ours
    for got, expected in zip(ours, theirs):
        if expected is None:
            assert got is None
        else:
            torch.testing.assert_close(got.as_subclass(torch.Tensor), expected, rtol=1e-12, atol=1e-12)
    if call is not torch.detach:  # and torch's gradient is the derivative: finite differences
        assert torch.autograd.gradcheck(lambda x, y: call(**kwargs(x, y)), (a.requires_grad_(True),
                                                                            b.requires_grad_(True)))


def test_torch_detach_as_a_function_is_x_detach():
    x = tt.tracer(_positive(4), requires_grad=True)
    y = x * 2
    detached = torch.detach(y)
    assert isinstance(detached, tt.tracer) and not detached.requires_grad and detached.is_leaf
    assert detached.grad_fn is None and detached.data_ptr() == y.data_ptr()
    assert torch.equal(detached.as_subclass(torch.Tensor), y.detach().as_subclass(torch.Tensor))
    v = _positive(4)
    assert tt.check(lambda v: v * torch.detach(v).exp(), v).ok  # torch autograd: no gradient through the factor
    ours = tt.tracer(v, requires_grad=True)
    (ours * torch.detach(ours).exp()).sum().backward()
    assert tt.gradcheck(lambda u: u * v.exp(), v)  # d/du (u * c) by finite differences, c = exp(v) held fixed
    torch.testing.assert_close(ours.grad, v.exp(), rtol=1e-12, atol=0)


def test_deepcopy_of_a_non_leaf_raises_as_torch():
    with pytest.raises(RuntimeError, match="graph leaves"):
        copy.deepcopy(torch.ones(2, requires_grad=True) * 2)
    with pytest.raises(RuntimeError, match="graph leaves"):
        copy.deepcopy(tt.tracer([1.0, 2.0], requires_grad=True) * 2)
    leaf = tt.tracer([1.0, 2.0], requires_grad=True)
    copied = copy.deepcopy(leaf)
    assert copied.requires_grad and copied.is_leaf and copied.data_ptr() != leaf.data_ptr()
    without_graph = copy.deepcopy(tt.tracer([1.0, 2.0]) * 2)  # no gradient needed: a leaf, copied as in torch
    assert without_graph.tolist() == [2.0, 4.0] and not without_graph.requires_grad


def test_the_non_scalar_message_names_the_argument_of_the_call():
    x = tt.tracer([1.0, 2.0], requires_grad=True)
    with pytest.raises(RuntimeError, match="grad_outputs=") as grad_error:
        tt.grad(x * 2, x)
    assert "gradient=" not in str(grad_error.value)
    with pytest.raises(RuntimeError, match="pass gradient="):
        (x * 2).backward()


def test_check_replays_the_random_numbers_for_the_reference_run():
    x = torch.randn(6, 5, dtype=torch.float64)
    model = tt.port(torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Dropout(0.5), torch.nn.Linear(4, 1)).double())
    for fn in (lambda v: F.dropout(v, 0.5, training=True), lambda v: torch.dropout(v * 2, 0.3, True).exp(),
               lambda v: F.dropout1d(v.unsqueeze(-1), 0.5, training=True), model):
        torch.manual_seed(0)
        assert tt.check(fn, x).ok
    with pytest.raises(tt.GradientMismatch):  # a wrong rule is still caught
        tt.check(lambda v: F.dropout(WrongSquare.apply(v), 0.5, training=True), x)


def test_check_by_finite_differences_replays_the_random_numbers_at_every_evaluation():
    class Exp(torch.autograd.Function):  # torch runs its backward as written: tt.check uses finite differences
        @staticmethod
        def forward(ctx, v):
            out = v.exp()
            ctx.save_for_backward(out)
            return out

        @staticmethod
        def backward(ctx, grad):
            return grad * ctx.saved_tensors[0]

    def fn(v):
        return F.dropout(Exp.apply(v), 0.5, training=True)

    x = torch.randn(3, 4, dtype=torch.float64)
    torch.manual_seed(3)
    report = tt.check(fn, x)
    assert report.ok and report.reference.startswith("finite differences")
    after_check = torch.rand(3)
    torch.manual_seed(3)
    fn(x)
    assert torch.equal(after_check, torch.rand(3))  # the generator moved on as after one run of fn


def test_weight_norm_on_a_ported_module_has_torchs_gradients():
    torch.manual_seed(0)
    theirs = torch.nn.Linear(4, 3).double()
    ours = tt.port(copy.deepcopy(theirs))
    for module in (theirs, ours):
        torch.nn.utils.parametrizations.weight_norm(module)
    x = torch.randn(5, 4, dtype=torch.float64)
    for module in (theirs, ours):
        (module(x) ** 2).sum().backward()
    names = [name for name, _ in theirs.named_parameters()]
    assert names == [name for name, _ in ours.named_parameters()] and len(names) == 3
    for (name, a), (_, b) in zip(ours.named_parameters(), theirs.named_parameters()):
        assert isinstance(a, torch.nn.Parameter) and a.requires_grad
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-12, atol=1e-12, msg=name)
    named = {name: p.detach().clone().requires_grad_(True) for name, p in theirs.named_parameters()}
    g, v, bias = named["parametrizations.weight.original0"], named["parametrizations.weight.original1"], named["bias"]
    assert torch.autograd.gradcheck(lambda g, v, bias: F.linear(x, torch._weight_norm(v, g, 0), bias) ** 2,
                                    (g, v, bias))  # torch's gradient of the same function by finite differences


def test_a_detached_tt_parameter_is_not_a_parameter():
    p = tt.nn.Parameter(torch.ones(2))
    detached = p.detach()
    assert not isinstance(detached, torch.nn.Parameter) and not detached.requires_grad
    assert detached.data_ptr() == p.data_ptr() and "Parameter" not in repr(detached)
    module = torch.nn.Module()
    module.value = detached  # a plain attribute, as torch's p.detach() would be
    assert list(module.parameters()) == []
    assert not isinstance(copy.deepcopy(detached), torch.nn.Parameter)
    wrapped = torch.nn.Parameter(tt.tracer([1.0]))  # a tracer torch's Parameter marks as a parameter stays one
    assert isinstance(copy.deepcopy(wrapped), torch.nn.Parameter)


def _builtins_with_rules() -> list:
    """OpInfo ops with a rule whose torch callable is a builtin (torch's parser reads its keywords)."""
    from torch.testing._internal.common_methods_invocations import op_db

    from torchtrace.autograd.arguments import _signature_parameters
    from torchtrace.autograd.function import RULES

    return [op for op in op_db if op.supports_autograd and op.op in RULES and not op.name.startswith("__")
            and not _signature_parameters(op.op)[1]]


def _spelled_call(op, kwargs, make):
    """op(**kwargs) on `make` copies of its floating tensors, the sum of its floating outputs backward: (outputs,
    gradients), or torch's error."""
    made = {k: make(v) if isinstance(v, torch.Tensor) and v.is_floating_point() else v for k, v in kwargs.items()}
    try:
        out = op.op(**made)
    except (TypeError, RuntimeError) as error:
        return f"{type(error).__name__}: {error}".replace("tracer", "Tensor")
    outputs = [o for o in (out if isinstance(out, (tuple, list)) else [out]) if isinstance(o, torch.Tensor)]
    floating = [o for o in outputs if o.is_floating_point() and o.requires_grad]
    if floating:
        sum(o.sum() for o in floating).backward()
    leaves = [v for v in made.values() if isinstance(v, torch.Tensor) and v.is_floating_point()]
    return [o.detach().as_subclass(torch.Tensor) for o in outputs] + [v.grad for v in leaves]


def test_parser_names_of_every_builtin_with_a_rule_behave_as_torch():
    """input= / other= and torch's numpy names for them (x1= / x2=, x=) on the first sample of every OpInfo builtin
    with a rule and at most two operands (beyond two, the parser's names differ by op): torch's value and gradients
    wherever torch accepts the spelling."""
    compared, wrong = 0, []
    for op in _builtins_with_rules():
        sample = next(iter(op.sample_inputs("cpu", torch.float64, requires_grad=False)))
        operands = [sample.input, *sample.args]
        if len(operands) > 2 or not isinstance(sample.input, torch.Tensor):
            continue
        for names in (("input", "other"), ("x1", "x2"), ("x", "other")):
            kwargs = {**dict(zip(names, operands)), **sample.kwargs}
            theirs = _spelled_call(op, kwargs, lambda v: v.clone().requires_grad_(True))
            if isinstance(theirs, str):
                continue  # torch refuses this spelling (its parser raises before any tensor is looked at)
            compared += 1
            ours = _spelled_call(op, kwargs, lambda v: tt.tracer(v, requires_grad=True))
            try:
                assert not isinstance(ours, str), ours
                for got, expected in zip(ours, theirs):
                    assert (got is None) == (expected is None)
                    if expected is not None:
                        torch.testing.assert_close(got.as_subclass(torch.Tensor), expected, equal_nan=True)
            except AssertionError as error:
                wrong.append(f"{op.name}{names}: {str(error).splitlines()[0]}")
    assert not wrong, "\n".join(wrong)
    assert compared > 400  # 507 spellings when this was written
