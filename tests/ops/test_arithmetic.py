"""Arithmetic rules (torchtrace/ops/arithmetic.py): + - * / ** in operator, method and function form."""
from typing import Any, Callable, NamedTuple, Optional

import pytest
import torch
from helpers import check_op, double_backward_matches, non_contiguous
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import mutually_broadcastable_shapes

import torchtrace as tt


class In(NamedTuple):
    """A tensor input drawn uniformly from [low, high) when the test runs (optionally with a random sign)."""

    shape: tuple
    low: float = -2.0
    high: float = 2.0
    nc: bool = False
    dtype: Optional[torch.dtype] = None  # None: the dtype the test is parametrised with
    signed: bool = False

    def build(self, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
        t = torch.rand(self.shape, generator=gen, dtype=torch.float64) * (self.high - self.low) + self.low
        if self.signed:
            t = t * (torch.randint(0, 2, self.shape, generator=gen) * 2 - 1)
        t = t.to(self.dtype or dtype)
        return non_contiguous(t) if self.nc else t


def x(*shape: int, nc: bool = False, dtype: Optional[torch.dtype] = None) -> In:
    return In(shape, nc=nc, dtype=dtype)


def positive(*shape: int, nc: bool = False) -> In:
    """[0.5, 2): a safe base for a ** b with a tensor exponent."""
    return In(shape, 0.5, 2.0, nc)


def nonzero(*shape: int, nc: bool = False) -> In:
    """|v| in [0.5, 2) with either sign: a safe divisor."""
    return In(shape, 0.5, 2.0, nc, signed=True)


def run(fn: Callable, specs: tuple, dtype: torch.dtype) -> None:
    """tt.check in `dtype`; finite differences (always float64) once, with the float64 case."""
    gen = torch.Generator().manual_seed(0)
    inputs = [s.build(dtype, gen) if isinstance(s, In) else s for s in specs]
    check_op(fn, *inputs, gradcheck=dtype == torch.float64)


def case(name: str, fn: Callable, *specs: Any, marks: Any = ()) -> Any:
    return pytest.param(fn, specs, id=name, marks=marks)


DTYPES = pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
INTS = torch.tensor([1, -2, 3, 0])

ADD_SUB = [
    case("add-operator", lambda a, b: a + b, x(3, 4), x(3, 4)),
    case("add-broadcast", lambda a, b: a + b, x(3, 1), x(4)),
    case("add-broadcast-ranks", lambda a, b: a + b, x(2, 1, 4), x(3, 1)),
    case("add-number", lambda a: a + 2.5, x(3)),
    case("radd-number", lambda a: 2.5 + a, x(3)),
    case("add-0d", lambda a, b: a + b, x(), x(3)),
    case("add-0d-both", lambda a, b: a + b, x(), x()),
    case("add-noncontig", lambda a, b: a + b, x(3, 4, nc=True), x(4, nc=True)),
    case("add-twice", lambda a: a + a, x(4)),
    case("add-int-tensor", lambda a, i: a + i, x(4), INTS),
    case("add-mixed-dtype", lambda a, b: a + b, x(4), x(4, dtype=torch.float64)),
    case("add-method", lambda a, b: a.add(b), x(3, 4), x(4)),
    case("add-method-alpha", lambda a, b: a.add(b, alpha=2), x(3, 4), x(3, 1)),
    case("add-function", torch.add, x(3, 4), x(4)),
    case("add-function-alpha", lambda a, b: torch.add(a, b, alpha=-0.5), x(3, 4), x(4)),
    case("add-function-number-alpha", lambda a: torch.add(a, 3, alpha=2), x(4)),
    case("add-function-other-kw", lambda a, b: torch.add(a, other=b, alpha=3), x(4), x(2, 1)),
    case("add-dunder", lambda a, b: a.__add__(b), x(4), x(4)),
    case("add-inplace-method", lambda a, b: (a * 1).add_(b, alpha=2), x(3, 4), x(4)),
    case("sub-operator", lambda a, b: a - b, x(3, 4), x(3, 4)),
    case("sub-broadcast", lambda a, b: a - b, x(4), x(3, 1)),
    case("sub-number", lambda a: a - 1.5, x(3)),
    case("sub-0d", lambda a, b: a - b, x(3), x()),
    case("sub-twice", lambda a: a - a * a, x(4)),
    case("sub-method-alpha", lambda a, b: a.sub(b, alpha=2), x(3, 4), x(4)),
    case("sub-function-alpha", lambda a, b: torch.sub(a, b, alpha=-1.5), x(3, 4, nc=True), x(3, 4)),
    case("sub-function-number", lambda a: torch.sub(a, 2, alpha=3), x(4)),
    case("subtract", torch.subtract, x(3, 4), x(4)),
    case("subtract-method", lambda a, b: a.subtract(b, alpha=0.5), x(3, 4), x(4)),
    case("sub-inplace-method", lambda a, b: (a * 1).sub_(b, alpha=2), x(3, 4), x(4)),
    case("rsub-operator", lambda a: 2 - a, x(3, 4)),
    case("rsub-operator-0d", lambda a: 2 - a, x()),
    case("rsub-function", torch.rsub, x(3, 4), x(4)),
    case("rsub-function-alpha", lambda a, b: torch.rsub(a, b, alpha=2), x(3, 4), x(3, 1)),
    case("rsub-function-number", lambda a: torch.rsub(a, 2), x(4, nc=True)),
    case("rsub-twice", lambda a: 1 - a * (3 - a), x(4)),
]

MUL_DIV = [
    case("mul-operator", lambda a, b: a * b, x(3, 4), x(3, 4)),
    case("mul-broadcast", lambda a, b: a * b, x(2, 1, 4), x(3, 1)),
    case("mul-number", lambda a: a * 3, x(4)),
    case("rmul-number", lambda a: 3 * a, x(4)),
    case("mul-0d", lambda a, b: a * b, x(), x(2, 3)),
    case("mul-noncontig", lambda a, b: a * b, x(3, 4, nc=True), x(3, 4, nc=True)),
    case("mul-twice", lambda a: a * a, x(3, 4)),
    case("mul-int-tensor", lambda a, i: a * i, x(4), INTS),
    case("mul-mixed-dtype", lambda a, b: a * b, x(3, 1), x(4, dtype=torch.float64)),
    case("mul-method", lambda a, b: a.mul(b), x(3, 4), x(4)),
    case("mul-function", torch.mul, x(3, 4), x(4)),
    case("multiply", torch.multiply, x(3, 4), x(3, 1)),
    case("multiply-method", lambda a, b: a.multiply(b), x(4), x(4)),
    case("mul-inplace-method", lambda a, b: (a * 1).mul_(b), x(3, 4), x(4)),
    case("div-operator", lambda a, b: a / b, x(3, 4), nonzero(3, 4)),
    case("div-broadcast", lambda a, b: a / b, x(4), nonzero(3, 1)),
    case("div-number", lambda a: a / 4, x(4)),
    case("div-0d", lambda a, b: a / b, x(3), nonzero()),
    case("div-noncontig", lambda a, b: a / b, x(3, 4, nc=True), nonzero(4, nc=True)),
    case("div-twice", lambda a: (a + 3) / a, nonzero(4)),
    case("div-method", lambda a, b: a.div(b), x(3, 4), nonzero(4)),
    case("div-function", torch.div, x(3, 4), nonzero(4)),
    case("divide", torch.divide, x(3, 4), nonzero(3, 1)),
    case("divide-method", lambda a, b: a.divide(b), x(4), nonzero(4)),
    case("true_divide", torch.true_divide, x(4), nonzero(4)),
    case("true_divide-method", lambda a, b: a.true_divide(b), x(4), nonzero(2, 1)),
    case("div-inplace-method", lambda a, b: (a * 1).div_(b), x(3, 4), nonzero(4)),
    case("div-floor", lambda a, b: torch.div(a, b, rounding_mode="floor"), x(3, 4), nonzero(3, 4)),
    case("div-trunc-method", lambda a, b: a.div(b, rounding_mode="trunc"), x(3, 4), nonzero(4)),
    case("div-floor-number", lambda a: a.div(0.7, rounding_mode="floor"), x(4)),
    case("divide-trunc", lambda a, b: torch.divide(a, b, rounding_mode="trunc"), x(4), nonzero(3, 1)),
    case("div-floor-twice", lambda a: a * torch.div(a, 0.3, rounding_mode="floor"), x(4)),
    case("rdiv-operator", lambda a: 1 / a, nonzero(3, 4)),
    case("rdiv-operator-number", lambda a: 2.5 / a, nonzero(4, nc=True)),
    case("rdiv-0d", lambda a: 1 / a, nonzero()),
    case("rdiv-function-number-first", lambda a: torch.div(2, a), nonzero(4)),
    case("rdiv-twice", lambda a: a * (1 / a) + 1 / (a * a), nonzero(4)),
]

POWERS = [
    case("pow-square", lambda a: a ** 2, x(3, 4)),
    case("pow-cube-noncontig", lambda a: a ** 3, x(3, 4, nc=True)),
    case("pow-zero", lambda a: a ** 0, x(4)),
    case("pow-zero-float", lambda a: a.pow(0.0), x(4)),
    case("pow-negative", lambda a: a ** -2, nonzero(4)),
    case("pow-negative-fraction", lambda a: a ** -1.5, positive(4)),
    case("pow-half", lambda a: a ** 0.5, positive(3, 4)),
    case("pow-0d", lambda a: a ** 3, x()),
    case("pow-tensor", lambda a, b: a ** b, positive(3, 4), x(3, 4)),
    case("pow-tensor-broadcast", lambda a, b: a ** b, positive(3, 1), x(4)),
    case("pow-tensor-0d-exponent", lambda a, b: a ** b, positive(3), x()),
    case("pow-tensor-with-zero-exponents", lambda a, b: a ** (b * 0), positive(4), x(4)),
    case("pow-int-exponent", lambda a, i: a ** i, nonzero(4), INTS),
    case("pow-twice", lambda a: a ** a, positive(4)),
    case("pow-method", lambda a, b: a.pow(b), positive(3, 4), x(4)),
    case("pow-method-number", lambda a: a.pow(3), x(4)),
    case("pow-function", torch.pow, positive(3, 4), x(3, 1)),
    case("pow-function-number", lambda a: torch.pow(a, -1), nonzero(4)),
    case("pow-function-exponent-kw", lambda a, b: torch.pow(a, exponent=b), positive(4), x(4)),
    case("pow-dunder", lambda a, b: a.__pow__(b), positive(4), x(4)),
    case("pow-inplace-method", lambda a: (a * 1).pow_(2), x(3, 4)),
    case("rpow-operator", lambda a: 2 ** a, x(3, 4)),
    case("rpow-operator-fraction", lambda a: 0.5 ** a, x(4, nc=True)),
    case("rpow-0d", lambda a: 3 ** a, x()),
    case("rpow-function", lambda a: torch.pow(2, a), x(3, 4)),
    case("rpow-twice", lambda a: a * 2 ** a, x(4)),
]

UNARY = [
    case("neg-operator", lambda a: -a, x(3, 4)),
    case("neg-operator-0d", lambda a: -a, x()),
    case("neg-function", torch.neg, x(3, 4, nc=True)),
    case("negative", torch.negative, x(4)),
    case("neg-method", lambda a: a.neg(), x(4)),
    case("negative-method", lambda a: a.negative(), x(2, 3)),
    case("neg-dunder", lambda a: a.__neg__(), x(4)),
    case("neg-twice", lambda a: a * -a, x(4)),
    case("reciprocal", torch.reciprocal, nonzero(3, 4)),
    case("reciprocal-method", lambda a: a.reciprocal(), nonzero(4, nc=True)),
    case("reciprocal-0d", torch.reciprocal, nonzero()),
    case("reciprocal-twice", lambda a: a * torch.reciprocal(a * a), nonzero(4)),
]


@DTYPES
@pytest.mark.parametrize("fn, specs", ADD_SUB + MUL_DIV + POWERS + UNARY)
def test_arithmetic(fn: Callable, specs: tuple, dtype: torch.dtype) -> None:
    run(fn, specs, dtype)


def test_rounding_division_has_zero_gradient() -> None:
    a = tt.tracer([3.5, -2.5, 7.0], requires_grad=True)
    b = tt.tracer([2.0, 2.0, -3.0], requires_grad=True)
    for mode in ("floor", "trunc"):
        a.grad = b.grad = None
        torch.div(a, b, rounding_mode=mode).sum().backward()
        assert a.grad.tolist() == [0.0, 0.0, 0.0] and b.grad.tolist() == [0.0, 0.0, 0.0]


def test_pow_at_zero_base_follows_torch() -> None:
    """0 ** b: d/da is b * 0^(b-1) (1 for b == 1, 0 for b == 0 by convention); d/db is 0 for b >= 0."""
    base = torch.tensor([0.0, 0.0, 0.0, 0.0, 2.0])
    exponent = torch.tensor([0.0, 1.0, 2.0, 3.0, 0.0])
    check_op(torch.pow, base, exponent, gradcheck=False)
    check_op(lambda a: a ** 0, base, gradcheck=False)


@pytest.mark.parametrize("fn", [lambda e: 0.0 ** e, lambda e: torch.pow(0, e), lambda e: (-2.0) ** e],
                         ids=["zero-operator", "zero-function", "negative-operator"])
def test_rpow_with_non_positive_number_base(fn: Callable) -> None:
    """torch: d(0^e)/de = 0 where e >= 0, and NaN for a negative base."""
    check_op(fn, torch.tensor([1.0, 2.0, 3.0]), gradcheck=False)


@pytest.mark.parametrize("fn", [lambda a: 1 / a, lambda a: 2 ** a], ids=["rdiv", "rpow"])
def test_reflected_rule_backward_twice_with_retain_graph(fn: Callable) -> None:
    a = tt.tracer([1.0, 2.0, 3.0], requires_grad=True)
    y = fn(a).sum()
    y.backward(retain_graph=True)
    first = a.grad.clone()
    a.grad = None
    y.backward()
    assert a.grad is not None and torch.equal(a.grad, first)


def test_number_over_tensor_equals_torchs_bit_for_bit() -> None:
    """torch computes c / x as reciprocal(x) * c (not div(c, x), which rounds differently): so does torchtrace,
    and its gradient -c r^2 comes out identical too."""
    x = torch.randn(4096) * 100
    ours, theirs = tt.tracer(x, requires_grad=True), x.clone().requires_grad_(True)
    z_ours, z_theirs = 3.7 / ours, 3.7 / theirs
    (z_ours * z_ours).sum().backward()
    (z_theirs * z_theirs).sum().backward()
    assert torch.equal(z_ours.as_subclass(torch.Tensor), z_theirs)
    assert torch.equal(ours.grad, theirs.grad)


def test_number_over_tensor_records_torchs_two_nodes() -> None:
    """c / x is a Mul of a Reciprocal, as in torch's graph; a plain tensor over a tracer stays one Div."""
    x = tt.tracer(torch.tensor([1.0, 2.0]), requires_grad=True)
    z = 3.0 / x
    assert z.grad_fn.name == "MulBackward"
    assert [n.name for n, _ in z.grad_fn.next_functions] == ["ReciprocalBackward"]
    assert (torch.tensor([3.0, 4.0]) / x).grad_fn.name == "DivBackward"
    with pytest.raises(TypeError, match="unsupported operand"):
        "3" / x


def test_second_derivative_through_number_over_tensor_at_zero_equals_torchs() -> None:
    """d2/dx2 of sum(w t) with t = 1/x and w = where(t > 1.2, 2, t), at x = 0 and x = 2. At x = 0 two gradients meet
    at t, one of them zero (the masked branch); torch sums them before the reciprocal's -t^2 (= -inf) scales them and
    gets inf. A single fused c / x node scaled the zero alone: 0 * inf = NaN. (At x = 2, finite differences agree.)"""
    def f(x):
        t = 1 / x
        return (torch.where(t > 1.2, 2.0, t) * t).sum()

    def second(x, grad):
        g, = grad(f(x), [x], create_graph=True)
        return grad(g.sum(), [x])[0]

    value = torch.tensor([0.0, 2.0], dtype=torch.float64)
    ours = second(tt.tracer(value, requires_grad=True), tt.grad)
    theirs = second(value.clone().requires_grad_(True), torch.autograd.grad)
    assert torch.equal(ours, theirs) and ours[0] == float("inf")
    def first(x0):  # f'(x0) by torchtrace: at x0 near 2, t = 1/x0 <= 1.2, so f = sum(t t) and f'(x) = -2 / x^3
        x = tt.tracer(torch.tensor([x0], dtype=torch.float64), requires_grad=True)
        return tt.grad(f(x), [x])[0].item()

    eps = 1e-6
    assert abs(ours[1].item() - (first(2.0 + eps) - first(2.0 - eps)) / (2 * eps)) < 1e-6
    assert abs(ours[1].item() - 6 / 2 ** 4) < 1e-12


# ---- property: every broadcast-compatible pair of shapes -------------------------------------------------------------

BROADCAST_OPS = {
    "add": (lambda a, b: a + b, x),
    "sub": (lambda a, b: torch.sub(a, b, alpha=2), x),
    "mul": (lambda a, b: a * b, x),
    "div": (lambda a, b: a / b, nonzero),
    "pow": (lambda a, b: b ** a, positive),  # the second operand is the base
}
SHAPE_PAIRS = mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=3, min_side=1, max_side=4)


@pytest.mark.parametrize("name", list(BROADCAST_OPS))
@settings(max_examples=40, deadline=None)
@given(shapes=SHAPE_PAIRS, dtype=st.sampled_from([torch.float32, torch.float64]), seed=st.integers(0, 2 ** 16))
def test_broadcasting_property(name: str, shapes: Any, dtype: torch.dtype, seed: int) -> None:
    fn, second = BROADCAST_OPS[name]
    gen = torch.Generator().manual_seed(seed)
    a, b = x(*shapes.input_shapes[0]).build(dtype, gen), second(*shapes.input_shapes[1]).build(dtype, gen)
    report = tt.check(fn, a, b)
    assert report.ok and report.n_gradients == 2


# ---- double backward -------------------------------------------------------------------------------------------------

_gen = torch.Generator().manual_seed(1)


def _double(*shape: int, low: float = -2.0, high: float = 2.0) -> torch.Tensor:
    return torch.rand(shape, generator=_gen, dtype=torch.float64) * (high - low) + low


DOUBLE_BACKWARD = [
    case("mul", lambda a, b: a * b * a, _double(3, 4), _double(4)),
    case("mul-number", lambda a: 3 * a * a, _double(4)),
    case("div", lambda a, b: a / b, _double(3, 4), _double(4, low=0.5)),
    case("div-twice", lambda a: (a + 3) / a, _double(4, low=0.5)),
    case("rdiv", lambda a: 2 / a, _double(4, low=0.5)),
    case("rdiv-function", lambda a: torch.div(2, a), _double(4, low=0.5)),
    case("pow-number", lambda a: a ** 3, _double(3, 4)),
    case("pow-negative", lambda a: a ** -2, _double(4, low=0.5)),
    case("pow-tensor", lambda a, b: a ** b, _double(3, 4, low=0.5), _double(4)),
    case("rpow", lambda a: 2 ** a, _double(4)),
    case("rpow-function", lambda a: torch.pow(2, a), _double(4)),
    case("rsub", lambda a: (2 - a) * a, _double(4)),
    case("add-sub-alpha", lambda a, b: torch.sub(a * b, b, alpha=2) + torch.add(a, a * a, alpha=3),
         _double(3), _double(3)),
    case("neg-reciprocal", lambda a: -torch.reciprocal(a), _double(4, low=0.5)),
]


@pytest.mark.parametrize("fn, inputs", DOUBLE_BACKWARD)
def test_double_backward(fn: Callable, inputs: tuple) -> None:
    double_backward_matches(fn, *inputs)


INF = float("inf")

# An inf arriving from sqrt at 0 meets each rule's mask: torch masks (0) or multiplies (NaN); torchtrace must agree.
INF_UPSTREAM = {
    "div floor by a number": (lambda a: torch.sqrt(torch.div(a, 2.0, rounding_mode="floor")), [[0.5, 1.5, 4.0]]),
    "div trunc by a tensor": (lambda a, b: torch.sqrt(torch.div(a, b, rounding_mode="trunc")),
                              [[0.5, 1.5, 4.0], [2.0, 2.0, 3.0]]),
    "pow with exponent 0.0": (lambda a: torch.sqrt(a ** 0.0 - 1), [[0.5, 0.0, 3.0]]),
    "pow exponent at base 0": (lambda e: torch.sqrt(torch.pow(torch.zeros(3, dtype=e.dtype), e)), [[1.0, 2.0, 0.5]]),
    "pow tensors at base 0": (lambda a, e: torch.sqrt(torch.pow(a, e)), [[0.0, 0.0, 2.0], [1.0, 0.0, 0.0]]),
    "rpow number base 0": (lambda e: torch.sqrt(0.0 ** e), [[1.0, 2.0, 0.0]]),
}


@pytest.mark.parametrize("name", list(INF_UPSTREAM))
def test_an_infinite_upstream_gradient_is_masked_like_torch(name: str) -> None:
    fn, values = INF_UPSTREAM[name]
    check_op(fn, *[torch.tensor(v, dtype=torch.float64) for v in values], gradcheck=False)


def _second_order(fn: Callable, inputs: list, ours: bool) -> list:
    """d/dx of sum((dL/dx)^2), L = fn(x).sum(): by torchtrace with create_graph, or by torch autograd."""
    if ours:
        xs = [tt.tracer(v, requires_grad=True) for v in inputs]
        first = tt.grad(fn(*xs).sum(), xs, create_graph=True)
        return [g.as_subclass(torch.Tensor) for g in tt.grad(sum((g * g).sum() for g in first), xs)]
    xs = [v.clone().requires_grad_(True) for v in inputs]
    first = torch.autograd.grad(fn(*xs).sum(), xs, create_graph=True)
    return list(torch.autograd.grad(sum((g * g).sum() for g in first), xs))


@pytest.mark.parametrize("fn", [torch.pow, lambda a, b: torch.remainder(a, b) * b], ids=["pow", "remainder"])
def test_second_derivatives_at_zero_bases_and_infinite_divisors_match_torch(fn: Callable) -> None:
    a = torch.tensor([0.0, -0.0, 0.0, 1.0, -1.0, 2.0], dtype=torch.float64)
    b = torch.tensor([1.0, 2.0, 0.5, -INF, INF, 1.5], dtype=torch.float64)
    for ours, theirs in zip(_second_order(fn, [a, b], True), _second_order(fn, [a, b], False)):
        torch.testing.assert_close(ours, theirs, equal_nan=True)


@pytest.mark.parametrize("base", [torch.tensor(2.5, dtype=torch.bfloat16), torch.tensor(2.5, dtype=torch.float32),
                                  torch.tensor([1.5, 2.5, 3.5], dtype=torch.float16), torch.tensor([1, 2, 3])])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_exponents_gradient_takes_the_log_of_the_base_in_the_results_dtype(base, dtype):
    """torch promotes a lower-precision or integer base before its log: d(a^x)/dx = a^x ln a, ln a in float32/64."""
    exponent = torch.tensor([1.25, 2.5, 3.75], dtype=dtype)
    theirs = exponent.clone().requires_grad_()
    (base ** theirs).sum().backward()
    ours = tt.tracer(exponent, requires_grad=True)
    (base ** ours).sum().backward()
    assert ours.grad.dtype == theirs.grad.dtype == dtype
    torch.testing.assert_close(ours.grad, theirs.grad, rtol=0, atol=0)
    exact = (base.double() ** exponent.double()) * torch.log(base.double())
    torch.testing.assert_close(ours.grad.double(), exact, rtol=1e-6 if dtype == torch.float32 else 1e-12, atol=0)


def test_the_bases_gradient_multiplies_in_torchs_order():
    """g (b a^(b-1)), as torch: 2 * 1e308 overflows to inf before g = -0.2 scales it (torch: -inf)."""
    theirs = torch.tensor([1e308], dtype=torch.float64, requires_grad=True)
    (theirs ** 2).backward(torch.tensor([-0.2], dtype=torch.float64))
    ours = tt.tracer([1e308], dtype=torch.float64, requires_grad=True)
    (ours ** 2).backward(torch.tensor([-0.2], dtype=torch.float64))
    assert theirs.grad.item() == ours.grad.item() == -float("inf")
