"""Pointwise rules (torchtrace/ops/pointwise.py) against torch autograd and finite differences."""
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F
from elementwise_cases import DTYPES, Arg, case
from helpers import check_op, double_backward_matches

import torchtrace as tt

_gen = torch.Generator().manual_seed(0)


def _draw(shape: tuple) -> torch.Tensor:
    return torch.rand(shape, generator=_gen, dtype=torch.float64)


def randn(*shape: int, nc: bool = False) -> Arg:
    return Arg(torch.randn(shape, generator=_gen, dtype=torch.float64), nc)


def pos(*shape: int, nc: bool = False) -> Arg:
    """Values in [0.5, 2.5): inside the domain of log, sqrt, rsqrt, and safe as a divisor."""
    return Arg(_draw(shape) * 2 + 0.5, nc)


def small(*shape: int, nc: bool = False) -> Arg:
    """Values in (-1, 1): inside the domain of tan with moderate slopes."""
    return Arg(_draw(shape) * 2 - 1, nc)


def off_zero(*shape: int, nc: bool = False) -> Arg:
    """|x| in [0.2, 1.2) with random sign: away from the kinks of abs, sign and relu."""
    sign = torch.where(_draw(shape) < 0.5, -1.0, 1.0).double()
    return Arg(sign * (_draw(shape) + 0.2), nc)


def off_integer(*shape: int, nc: bool = False) -> Arg:
    """k + [0.1, 0.4) or k + [0.6, 0.9): away from the jumps of floor, ceil, round, trunc."""
    k = torch.randint(-3, 4, shape, generator=_gen).double()
    frac = _draw(shape) * 0.3 + 0.1
    return Arg(k + torch.where(_draw(shape) < 0.5, frac, frac + 0.5), nc)


def mask(*shape: int) -> Arg:
    return Arg(torch.rand(shape, generator=_gen) < 0.5)


def run(fn: Callable, args: tuple, dtype: torch.dtype, **kwargs: Any) -> None:
    """tt.check in `dtype`; the finite-difference check (always float64) runs once, with the float64 case."""
    inputs = [a.make(dtype) if isinstance(a, Arg) else a for a in args]
    check_op(fn, *inputs, gradcheck=dtype == torch.float64, **kwargs)


UNARY = [
    case("exp", torch.exp, randn(3, 4)),
    case("exp-method-0d", lambda x: x.exp(), randn()),
    case("exp-noncontig-twice", lambda x: torch.exp(x) * x, randn(3, 4, nc=True)),
    case("exp2", torch.exp2, randn(5)),
    case("exp2-method", lambda x: x.exp2(), randn(2, 3)),
    case("exp2-special", torch.special.exp2, randn(4)),
    case("expm1", torch.expm1, randn(3, 2)),
    case("expm1-method", lambda x: x.expm1(), randn()),
    case("expm1-special", torch.special.expm1, randn(4)),
    case("log", torch.log, pos(3, 4)),
    case("log-method-noncontig", lambda x: x.log(), pos(3, 4, nc=True)),
    case("log-0d", torch.log, pos()),
    case("log-twice", lambda x: x * torch.log(x), pos(5)),
    case("log2", torch.log2, pos(4)),
    case("log2-method", lambda x: x.log2(), pos(2, 2)),
    case("log10", torch.log10, pos(4)),
    case("log10-method", lambda x: x.log10(), pos(2, 2, nc=True)),
    case("log1p", torch.log1p, pos(4)),
    case("log1p-method", lambda x: x.log1p(), small(3)),
    case("log1p-special", torch.special.log1p, pos(2, 3)),
    case("sqrt", torch.sqrt, pos(3, 4)),
    case("sqrt-method-0d", lambda x: x.sqrt(), pos()),
    case("sqrt-noncontig", torch.sqrt, pos(4, 3, nc=True)),
    case("rsqrt", torch.rsqrt, pos(3, 4)),
    case("rsqrt-method", lambda x: x.rsqrt(), pos(5)),
    case("square", torch.square, randn(3, 4)),
    case("square-method-0d", lambda x: x.square(), randn()),
    case("abs", torch.abs, off_zero(3, 4)),
    case("absolute", torch.absolute, off_zero(4)),
    case("abs-method", lambda x: x.abs(), off_zero(2, 3, nc=True)),
    case("abs-absolute-method", lambda x: x.absolute(), off_zero(4)),
    case("abs-builtin", lambda x: abs(x), off_zero(3)),
    case("abs-dunder", lambda x: x.__abs__(), off_zero(3)),
    case("abs-0d", torch.abs, off_zero()),
    case("sign", torch.sign, off_zero(3, 4)),
    case("sign-method-twice", lambda x: x * x.sign(), off_zero(5)),
    case("sin", torch.sin, randn(3, 4)),
    case("sin-method-noncontig", lambda x: x.sin(), randn(3, 4, nc=True)),
    case("cos", torch.cos, randn(3, 4)),
    case("cos-method-0d", lambda x: x.cos(), randn()),
    case("sin-cos-twice", lambda x: torch.sin(x) * torch.cos(x), randn(5)),
    case("tan", torch.tan, small(3, 4)),
    case("tan-method", lambda x: x.tan(), small(5)),
    case("tanh", torch.tanh, randn(3, 4)),
    case("tanh-method-0d", lambda x: x.tanh(), randn()),
    case("tanh-functional", F.tanh, randn(3, 4, nc=True)),
    case("sigmoid", torch.sigmoid, randn(3, 4)),
    case("sigmoid-method", lambda x: x.sigmoid(), randn(5)),
    case("sigmoid-expit", torch.special.expit, randn(2, 3)),
    case("sigmoid-functional-0d", F.sigmoid, randn()),
    case("sigmoid-twice", lambda x: x * torch.sigmoid(x), randn(4, 3, nc=True)),
    case("relu", torch.relu, off_zero(3, 4)),
    case("relu-method", lambda x: x.relu(), off_zero(5)),
    case("relu-functional", F.relu, off_zero(2, 3, nc=True)),
    case("relu-functional-inplace", lambda x: F.relu(x * 1, inplace=True), off_zero(3, 4)),
    case("relu-inplace-method", lambda x: (x * 1).relu_(), off_zero(3, 4)),
    case("relu-0d", torch.relu, off_zero()),
    case("floor", torch.floor, off_integer(3, 4)),
    case("floor-method-twice", lambda x: x * x.floor(), off_integer(5)),
    case("ceil", torch.ceil, off_integer(3, 4)),
    case("ceil-method", lambda x: x.ceil(), off_integer(4, nc=True)),
    case("round", torch.round, off_integer(3, 4)),
    case("round-method", lambda x: x.round(), off_integer(4)),
    case("round-decimals", lambda x: torch.round(x, decimals=1), randn(4)),
    case("round-special", torch.special.round, off_integer(4)),
    case("trunc", torch.trunc, off_integer(3, 4)),
    case("trunc-method", lambda x: x.trunc(), off_integer(4)),
    case("fix", torch.fix, off_integer(4)),
    case("fix-method-0d", lambda x: x.fix(), off_integer()),
]


@DTYPES
@pytest.mark.parametrize("fn, args", UNARY)
def test_unary(fn: Callable, args: tuple, dtype: torch.dtype) -> None:
    run(fn, args, dtype)


LOW, HIGH = -0.5, 0.5
LOW_T = torch.full((4,), -0.3, dtype=torch.float64)

CLAMP = [
    case("clamp-numbers", lambda x: torch.clamp(x, LOW, HIGH), randn(3, 4)),
    case("clamp-min-kw", lambda x: torch.clamp(x, min=LOW), randn(3, 4)),
    case("clamp-max-kw", lambda x: torch.clamp(x, max=HIGH), randn(3, 4)),
    case("clamp-max-only-positional", lambda x: torch.clamp(x, None, HIGH), randn(5)),
    case("clamp-method", lambda x: x.clamp(LOW, HIGH), randn(3, 4, nc=True)),
    case("clamp-method-0d", lambda x: x.clamp(min=LOW), randn()),
    case("clip", lambda x: torch.clip(x, LOW, HIGH), randn(3, 4)),
    case("clip-method", lambda x: x.clip(max=HIGH), randn(3, 4)),
    case("clamp-crossed-numbers", lambda x: torch.clamp(x, 1.0, -1.0), randn(5)),
    case("clamp-tensors", torch.clamp, randn(3, 4), randn(3, 4) - 0.5, randn(3, 4) + 0.5),
    case("clamp-tensors-broadcast", torch.clamp, randn(3, 4), randn(3, 1) - 0.5, randn(4) + 0.5),
    case("clamp-tensor-bounds-broadcast-out", torch.clamp, randn(4), randn(2, 4) - 0.5, randn(2, 1) + 0.5),
    case("clamp-tensors-crossed", torch.clamp, randn(6), randn(6), randn(6)),
    case("clamp-all-crossed", lambda x, lo, gap: torch.clamp(x, lo, lo - gap), randn(3, 4), randn(4), pos(3, 1)),
    case("clamp-tensor-min-kw", lambda x, lo: torch.clamp(x, min=lo), randn(3, 4), randn(4)),
    case("clamp-tensor-max-kw", lambda x, hi: torch.clamp(x, max=hi), randn(3, 4), randn(3, 1)),
    case("clamp-tensor-method", lambda x, lo, hi: x.clamp(lo, hi), randn(3, 4, nc=True), randn(3, 4) - 1, randn(4) + 1),
    case("clip-tensors", torch.clip, randn(4), randn(4) - 0.5, randn(4) + 0.5),
    case("clamp-constant-bound", lambda x: torch.clamp(x, min=LOW_T), randn(3, 4)),
    case("clamp-0d-bounds", torch.clamp, randn(3), randn() - 0.5, randn() + 0.5),
    case("clamp-twice", lambda x: x * torch.clamp(x, LOW, HIGH), randn(5)),
    case("clamp-inplace-method", lambda x: (x * 1).clamp_(LOW, HIGH), randn(3, 4)),
    case("clamp_min", lambda x: torch.clamp_min(x, LOW), randn(3, 4)),
    case("clamp_min-tensor", torch.clamp_min, randn(3, 4), randn(4)),
    case("clamp_min-method", lambda x, lo: x.clamp_min(lo), randn(3, 4), randn(3, 1)),
    case("clamp_max", lambda x: torch.clamp_max(x, HIGH), randn(3, 4)),
    case("clamp_max-tensor", torch.clamp_max, randn(3, 4), randn(4)),
    case("clamp_max-method-number", lambda x: x.clamp_max(HIGH), randn(4, nc=True)),
    case("clamp_max-method-tensor-kw", lambda x, hi: x.clamp_max(max=hi), randn(3, 4), randn(3, 1)),
]


@DTYPES
@pytest.mark.parametrize("fn, args", CLAMP)
def test_clamp(fn: Callable, args: tuple, dtype: torch.dtype) -> None:
    run(fn, args, dtype)


def test_clamp_ties_follow_torch() -> None:
    """At x == min or x == max (and min == max) torch gives the gradient to x; no finite differences at a kink."""
    x = torch.tensor([-1.0, 0.0, 0.5, 1.0, 2.0, 1.0])
    low = torch.tensor([0.0, 0.0, 0.0, 0.0, 3.0, 1.0])
    high = torch.tensor([1.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    check_op(torch.clamp, x, low, high, gradcheck=False)
    check_op(lambda x: torch.clamp(x, 0.0, 1.0), x, gradcheck=False)
    check_op(torch.clamp_min, x, low, gradcheck=False)
    check_op(torch.clamp_max, x, high, gradcheck=False)


def test_clamp_refuses_mixed_number_and_tensor_bounds() -> None:
    x = tt.tracer([0.0, 1.0], requires_grad=True)
    with pytest.raises(TypeError, match="clamp"):
        torch.clamp(x, torch.zeros(2), 0.5)


BINARY = [
    case("maximum", torch.maximum, randn(3, 4), randn(3, 4)),
    case("maximum-method-broadcast", lambda a, b: a.maximum(b), randn(3, 1), randn(4, nc=True)),
    case("maximum-0d", torch.maximum, randn(3), randn()),
    case("maximum-twice", lambda a: torch.maximum(a, a), randn(3, 4)),
    case("maximum-constant", lambda a: torch.maximum(a, LOW_T), randn(3, 4)),
    case("minimum", torch.minimum, randn(3, 4), randn(3, 4)),
    case("minimum-method-broadcast", lambda a, b: a.minimum(b), randn(2, 1, 3), randn(4, 1)),
    case("minimum-twice", lambda a: torch.minimum(a, a * 2), randn(5)),
    case("atan2", torch.atan2, randn(3, 4), randn(3, 4)),
    case("arctan2", torch.arctan2, randn(4), randn(3, 1)),
    case("atan2-method", lambda a, b: a.atan2(b), randn(3, 4, nc=True), randn(4)),
    case("arctan2-method-0d", lambda a, b: a.arctan2(b), randn(), randn(3)),
]


@DTYPES
@pytest.mark.parametrize("fn, args", BINARY)
def test_binary(fn: Callable, args: tuple, dtype: torch.dtype) -> None:
    run(fn, args, dtype)


def test_maximum_minimum_split_ties_like_torch() -> None:
    a = torch.tensor([1.0, 2.0, 3.0, 2.0])
    b = torch.tensor([1.0, 3.0, 2.0, 2.0])
    for fn in (torch.maximum, torch.minimum):
        check_op(fn, a, b, gradcheck=False)
    x = tt.tracer(a, requires_grad=True)
    torch.maximum(x, tt.tracer(b)).sum().backward()
    assert x.grad.tolist() == [0.5, 0.0, 1.0, 0.5]


WHERE = [
    case("where", torch.where, mask(3, 4), randn(3, 4), randn(3, 4)),
    case("where-broadcast", torch.where, mask(3, 1), randn(4), randn(2, 1, 1)),
    case("where-number-other", lambda c, x: torch.where(c, x, 2.0), mask(3, 4), randn(3, 4, nc=True)),
    case("where-number-input", lambda c, y: torch.where(c, 0.5, y), mask(4), randn(3, 4)),
    case("where-kwargs", lambda c, x, y: torch.where(c, input=x, other=y), mask(4), randn(4), randn(4)),
    case("where-method", lambda c, x, y: x.where(c, y), mask(3, 4), randn(3, 4), randn(4)),
    case("where-method-keyword", lambda c, x, y: x.where(c, other=y), mask(4), randn(3, 4, nc=True), randn(4)),
    case("where-0d", torch.where, mask(), randn(), randn(3)),
    case("where-twice", lambda x: torch.where(x > 0, x, -2 * x), randn(3, 4)),
    case("where-constant", lambda c, x: torch.where(c, LOW_T, x), mask(3, 1), randn(3, 4)),
    case("where-method", lambda x, c, y: x.where(c, y), randn(3, 4), mask(3, 4), randn(4)),
    case("where-method-number", lambda x, c: x.where(c, 0.0), randn(3, 4, nc=True), mask(4)),
    case("where-method-0d", lambda x, c, y: x.where(c, y), randn(), mask(2), randn(2)),
]


@DTYPES
@pytest.mark.parametrize("fn, args", WHERE)
def test_where(fn: Callable, args: tuple, dtype: torch.dtype) -> None:
    run(fn, args, dtype)


def test_where_with_only_a_condition_is_not_recorded() -> None:
    x = tt.tracer([[-1.0, 2.0], [3.0, -4.0]], requires_grad=True)
    rows, cols = torch.where(x > 0)
    expected = torch.where(x.detach().as_subclass(torch.Tensor) > 0)
    assert rows.tolist() == expected[0].tolist() and cols.tolist() == expected[1].tolist()
    assert rows.grad_fn is None and not rows.requires_grad


TERNARY = [
    case("lerp-number", lambda a, b: torch.lerp(a, b, 0.3), randn(3, 4), randn(3, 4)),
    case("lerp-tensor", torch.lerp, randn(3, 4), randn(3, 4), pos(3, 4)),
    case("lerp-broadcast", torch.lerp, randn(3, 1), randn(4, nc=True), randn(2, 1, 1)),
    case("lerp-0d-weight", torch.lerp, randn(3), randn(3), randn()),
    case("lerp-method", lambda a, b, w: a.lerp(b, w), randn(3, 4, nc=True), randn(4), randn(3, 1)),
    case("lerp-method-number", lambda a, b: a.lerp(b, -0.5), randn(4), randn()),
    case("lerp-twice", lambda a, b: torch.lerp(a, b, a), randn(5), randn(5)),
    case("addcmul", torch.addcmul, randn(3, 4), randn(3, 4), randn(3, 4)),
    case("addcmul-value", lambda x, a, b: torch.addcmul(x, a, b, value=0.5), randn(3, 1), randn(4), randn(2, 1, 1)),
    case("addcmul-method", lambda x, a, b: x.addcmul(a, b, value=-2), randn(3, 4, nc=True), randn(3, 4), randn()),
    case("addcmul-twice", lambda x: torch.addcmul(x, x, x), randn(5)),
    case("addcmul-constant", lambda x, a: torch.addcmul(x, a, LOW_T), randn(3, 4), randn(3, 4)),
    case("addcdiv", torch.addcdiv, randn(3, 4), randn(3, 4), pos(3, 4)),
    case("addcdiv-value", lambda x, a, b: torch.addcdiv(x, a, b, value=-0.5), randn(4), randn(3, 1), pos(3, 4)),
    case("addcdiv-method", lambda x, a, b: x.addcdiv(a, b, value=3), randn(), randn(3), pos(3, nc=True)),
    case("addcdiv-twice", lambda x: torch.addcdiv(x, x, x + 3), pos(5)),
    # in place, self also the operand whose gradient only a constant would need: the rule saved it anyway, and
    # raised as changed (torch saves what a gradient reads)
    case("addcmul_-self-operand", lambda x: (lambda v: v.addcmul_(v, LOW_T.to(x.dtype), value=0.5))(x * 2), randn(4)),
    case("addcdiv_-self-operand", lambda x: (lambda v: v.addcdiv_(v, 1 - LOW_T.to(x.dtype), value=0.3))(x * 2),
         randn(4)),
]


@DTYPES
@pytest.mark.parametrize("fn, args", TERNARY)
def test_ternary(fn: Callable, args: tuple, dtype: torch.dtype) -> None:
    run(fn, args, dtype)


def test_relu_inplace_flag_changes_its_input_as_torch_does() -> None:
    leaf = tt.tracer([-1.0, 2.0, -3.0], requires_grad=True)
    x = leaf * 1.0
    y = F.relu(x, inplace=True)
    assert y is x and x.tolist() == [0.0, 2.0, 0.0]
    (x * leaf).sum().backward()  # x is used again after the in-place change: its new value counts
    expected_leaf = torch.tensor([-1.0, 2.0, -3.0], requires_grad=True)
    expected = expected_leaf * 1.0
    F.relu(expected, inplace=True)
    (expected * expected_leaf).sum().backward()
    assert leaf.grad.tolist() == expected_leaf.grad.tolist() == [0.0, 4.0, 0.0]


@pytest.mark.parametrize("fn", [torch.sign, torch.floor, torch.ceil, torch.round, torch.trunc])
def test_flat_ops_record_a_zero_gradient(fn: Callable) -> None:
    x = tt.tracer([-1.7, 0.3, 2.6], requires_grad=True)
    y = fn(x)
    assert y.grad_fn is not None
    y.sum().backward()
    assert x.grad.tolist() == [0.0, 0.0, 0.0]


def _double(*shape: int) -> torch.Tensor:
    return torch.randn(shape, generator=_gen, dtype=torch.float64)


CONDITION = torch.tensor([[True, False, True, False], [False, True, True, False], [True, True, False, False]])

DOUBLE_BACKWARD = [
    case("exp", torch.exp, _double(3, 4)),
    case("log", torch.log, _double(3, 4).abs() + 0.5),
    case("tanh", torch.tanh, _double(3, 4)),
    case("sigmoid", torch.sigmoid, _double(3, 4)),
    case("sqrt", torch.sqrt, _double(3, 4).abs() + 0.5),
    case("rsqrt", torch.rsqrt, _double(4).abs() + 0.5),
    case("sin-cos", lambda x: torch.sin(x) * torch.cos(x), _double(4)),
    case("tan", torch.tan, _double(4) / 3),
    case("abs", lambda x: torch.abs(x) * x, _double(4)),
    case("relu", lambda x: torch.relu(x) * x, _double(4)),
    case("clamp", lambda x, lo, hi: torch.clamp(x, lo, hi) * x, _double(3, 4), _double(3, 4) - 0.5, _double(4) + 0.5),
    case("where", lambda x, y: torch.where(CONDITION, x * x, y * x), _double(3, 4), _double(4)),
    case("maximum", lambda a, b: torch.maximum(a, b) * a, _double(3, 4), _double(4)),
    case("lerp", torch.lerp, _double(3), _double(3), _double(3)),
    case("addcmul", lambda x, a, b: torch.addcmul(x, a, b, value=2), _double(3), _double(3), _double(3)),
    case("addcdiv", lambda x, a, b: torch.addcdiv(x, a, b, value=2), _double(3), _double(3), _double(3).abs() + 1),
    case("atan2", torch.atan2, _double(4), _double(4)),
    case("log1p-expm1", lambda x: torch.log1p(torch.expm1(x)) * x, _double(4)),
]


@pytest.mark.parametrize("fn, inputs", DOUBLE_BACKWARD)
def test_double_backward(fn: Callable, inputs: tuple) -> None:
    double_backward_matches(fn, *inputs)


NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_atan2_gradient_at_the_origin_is_zero_like_torch(dtype: torch.dtype) -> None:
    a = torch.tensor([0.0, -0.0, 0.0, 1e-30, 0.0, INF, 1.0, NAN, 2.0], dtype=dtype)
    b = torch.tensor([0.0, 0.0, -0.0, 0.0, 1e-30, 1.0, INF, 1.0, -3.0], dtype=dtype)
    check_op(torch.atan2, a, b, gradcheck=False)
    x = tt.tracer(torch.zeros(2, dtype=dtype), requires_grad=True)
    torch.atan2(x, torch.zeros(2, dtype=dtype)).sum().backward()
    assert x.grad.tolist() == [0.0, 0.0]


def test_relu_passes_the_gradient_at_nan_like_torch() -> None:
    x = torch.tensor([NAN, -1.0, 0.0, 2.0, -INF, INF])
    check_op(torch.relu, x, gradcheck=False)
    check_op(lambda t: F.relu(t * 1, inplace=True), x, gradcheck=False)


def test_existing_rules_match_torch_at_edge_values() -> None:
    """0, -0, +-inf, NaN and negative bases: the same inf / NaN / 0 pattern as torch autograd."""
    edges = torch.tensor([0.0, -0.0, 1.0, -1.0, 0.5, -2.5, INF, -INF, NAN], dtype=torch.float64)
    a, b = edges.repeat_interleave(9), edges.repeat(9)
    for fn in (torch.sqrt, torch.rsqrt, torch.abs, torch.sign, torch.log, torch.reciprocal, torch.sigmoid, torch.tanh,
               torch.exp, lambda x: torch.clamp(x, 0.0, 1.0), lambda x: x ** 0.5 + x ** 0.0 + x ** -1.0 + x ** 3):
        check_op(fn, edges, gradcheck=False)
    for fn in (torch.pow, torch.div, torch.maximum, torch.minimum, torch.mul, lambda x, y: torch.where(x > 0, x, y),
               lambda x, y: torch.clamp(x, y, y + 1), lambda x, y: 2.0 ** x + (-2.0) ** y + 0.0 ** x):
        check_op(fn, a, b, gradcheck=False)
