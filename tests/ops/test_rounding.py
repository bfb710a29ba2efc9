"""Rules of torchtrace/ops/rounding.py: frac, fmod, remainder (%), fmax/fmin, copysign, ldexp, frexp, float_power,
nan_to_num, sgn, positive."""
from typing import Callable

import pytest
import torch
from elementwise_cases import DTYPES, INF, NAN, broadcast_test, case, double, run, run_edges, signed, uniform, values
from helpers import double_backward_matches

import torchtrace as tt

WIDE, POS = uniform(-3.0, 3.0, 3, 4), uniform(0.5, 2.5, 3, 4)
# operands of fmod / remainder whose quotients stay away from integers (the jumps)
NUM = uniform(0.1, 0.4, 3, 4)
DEN = values(1.3, -1.7, 2.1, -0.9)

CASES = [
    case("frac", torch.frac, signed(0.1, 0.4, 3, 4)),
    case("frac-method-inplace", lambda x: (x * 1).frac_() + x.frac(), signed(1.1, 1.4, 5, nc=True)),
    case("positive", torch.positive, WIDE),
    case("positive-method", lambda x: x.positive() * x, WIDE),
    case("nan_to_num", torch.nan_to_num, WIDE),
    case("nan_to_num-method-keywords", lambda x: x.nan_to_num(nan=1.0, posinf=2.0, neginf=-2.0), WIDE),
    case("nan_to_num-inplace", lambda x: (x * 1).nan_to_num_(0.5), WIDE),
    case("sgn", lambda x: torch.sgn(x) * x, signed(0.2, 2, 3, 4)),
    case("sgn-method-inplace", lambda x: (x * 1).sgn_() + x.sgn(), signed(0.2, 2, 4)),
    case("fmod-number", lambda x: torch.fmod(x, 1.5), signed(0.1, 1.4, 3, 4)),
    case("fmod-tensors", torch.fmod, NUM, DEN),
    case("fmod-broadcast-method", lambda a, b: a.fmod(b), uniform(0.1, 0.4, 3, 1), values(1.3, -1.7, 2.1)),
    case("fmod-inplace", lambda a, b: (a * 1).fmod_(b), NUM, DEN),
    case("fmod-integer-divisor", lambda a: torch.fmod(a, torch.tensor([2, -3, 5, 7])), signed(0.1, 1.9, 3, 4)),
    case("remainder-number", lambda x: torch.remainder(x, 1.5), uniform(0.1, 1.4, 3, 4)),
    case("remainder-tensors", torch.remainder, NUM, DEN),
    case("remainder-method-0d", lambda a, b: a.remainder(b), uniform(0.1, 0.4), DEN),
    case("mod-operator", lambda a, b: a % b, NUM, DEN),
    case("mod-operator-number", lambda a: a % -0.7, uniform(0.1, 0.6, 3, 4)),
    case("mod-inplace", lambda a, b: a.clone().__imod__(b), NUM, DEN),
    case("remainder-inplace", lambda a, b: (a * 1).remainder_(b), NUM, DEN),
    case("fmax", torch.fmax, WIDE, uniform(-3, 3, 3, 4)),
    case("fmax-broadcast-method", lambda a, b: a.fmax(b), uniform(-3, 3, 3, 1), uniform(-3, 3, 4, nc=True)),
    case("fmin", torch.fmin, WIDE, uniform(-3, 3, 3, 4)),
    case("fmin-method-0d", lambda a, b: a.fmin(b), uniform(-3, 3), uniform(-3, 3, 4)),
    case("fmax-fmin-twice", lambda a: torch.fmax(a, a * 2) + torch.fmin(a, -a), signed(0.2, 2, 5)),
    case("copysign-tensors", torch.copysign, signed(0.2, 2, 3, 4), WIDE),
    case("copysign-number", lambda x: torch.copysign(x, -1.0), signed(0.2, 2, 3, 4)),
    case("copysign-method-broadcast", lambda a, b: a.copysign(b), signed(0.2, 2, 3, 1), uniform(-3, 3, 4)),
    case("copysign-inplace", lambda a, b: (a * 1).copysign_(b), signed(0.2, 2, 3, 4), uniform(-3, 3, 4)),
    case("ldexp-integer-exponent", lambda x: torch.ldexp(x, torch.tensor([1, 2, 0, 3])), WIDE),
    case("ldexp-float-exponent", torch.ldexp, WIDE, WIDE),
    case("ldexp-method", lambda a, b: a.ldexp(b), uniform(-3, 3, 3, 1), uniform(-2, 2, 4)),
    case("float_power-number", lambda x: torch.float_power(x, 2.5), POS),
    case("float_power-integer", lambda x: torch.float_power(x, 3), WIDE),
    case("float_power-tensors", torch.float_power, POS, WIDE),
    case("float_power-number-base", lambda x: torch.float_power(2.0, x), WIDE),
    case("float_power-method-broadcast", lambda a, b: a.float_power(b), uniform(0.5, 2, 3, 1), uniform(-2, 2, 4)),
    case("frexp-mantissa", lambda x: torch.frexp(x)[0], WIDE),
    case("frexp-named-method", lambda x: x.frexp().mantissa * x, signed(0.3, 30, 3, 4)),
]


@DTYPES
@pytest.mark.parametrize("fn, args", CASES)
def test_rule_matches_torch(fn: Callable, args: tuple, dtype: torch.dtype) -> None:
    run(fn, args, dtype)


EDGE = values(0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 3.0, INF, -INF, NAN, 1e-30, 6.0, -4.5)
A = values(0.0, -0.0, 1.0, 1.0, 2.0, NAN, 3.0, NAN, INF, -INF, 4.5, -4.5, 1e-30, 2.0)
B = values(0.0, 0.0, 1.0, NAN, 2.0, 1.0, NAN, NAN, 1.0, 2.0, 1.5, 1.5, 0.0, -INF)
EDGES = [case(name, fn, EDGE) for name, fn in [
    ("frac", torch.frac), ("nan_to_num", torch.nan_to_num), ("sgn", torch.sgn), ("positive", torch.positive),
    ("frexp", lambda x: torch.frexp(x)[0]), ("copysign-number", lambda x: torch.copysign(x, -0.0)),
    ("fmod-number", lambda x: torch.fmod(x, 1.5)), ("remainder-number", lambda x: x % -1.5),
    ("float_power-numbers", lambda x: torch.float_power(x, 2.5) + torch.float_power(x, 0) + torch.float_power(x, -1)),
    ("float_power-number-base", lambda x: torch.float_power(2.0, x) + torch.float_power(-2.0, x)),
]] + [case(name, fn, A, B) for name, fn in [
    ("fmax", torch.fmax), ("fmin", torch.fmin), ("copysign", torch.copysign), ("fmod", torch.fmod),
    ("remainder", torch.remainder), ("ldexp", torch.ldexp), ("float_power", torch.float_power)]]


@DTYPES
@pytest.mark.parametrize("fn, args", EDGES)
def test_edges_match_torch(fn: Callable, args: tuple, dtype: torch.dtype) -> None:
    """Ties and NaN operands (fmax/fmin), x = 0 (copysign), non-finite values, zero divisors, negative bases."""
    run_edges(fn, args, dtype)


@pytest.mark.parametrize("fn", [lambda b: 0.25 % b, lambda b: torch.remainder(0.25, b),
                                lambda x: torch.ldexp(x, torch.tensor([1, -2, 0, -3]))])
def test_gradients_torch_gets_wrong_or_lacks_match_finite_differences(fn: Callable) -> None:
    """torch has no derivative for remainder(number, tensor), and its ldexp rule computes 2^b in b's integer dtype
    (2^-2 -> 0, a zero gradient): these are checked against finite differences alone."""
    assert tt.gradcheck(fn, torch.tensor([1.3, -1.7, 2.1, -0.9], dtype=torch.float64))


def test_fmax_fmin_give_a_tie_to_the_first_operand_and_skip_nan() -> None:
    a = tt.tracer([1.0, NAN, 2.0], requires_grad=True)
    b = tt.tracer([1.0, 3.0, NAN], requires_grad=True)
    (torch.fmax(a, b) + 10 * torch.fmin(a, b)).sum().backward()
    assert a.grad.tolist() == [11.0, 0.0, 11.0] and b.grad.tolist() == [0.0, 11.0, 0.0]


def test_float_power_gradient_comes_back_in_the_input_dtype() -> None:
    x = tt.tracer(torch.tensor([0.5, 2.0]), requires_grad=True)
    y = torch.float_power(x, 2)
    assert y.dtype == torch.float64
    y.sum().backward()
    assert x.grad.dtype == torch.float32 and x.grad.tolist() == [1.0, 4.0]


def test_frexp_exponent_carries_no_gradient() -> None:
    x = tt.tracer([3.0, -0.75], requires_grad=True)
    mantissa, exponent = torch.frexp(x)
    assert exponent.dtype == torch.int32 and not exponent.requires_grad and mantissa.requires_grad
    (mantissa * exponent).sum().backward()
    assert x.grad.tolist() == [2 / 4, 0 / 1]


def test_sgn_of_a_complex_tensor_is_refused() -> None:
    z = tt.tracer(torch.tensor([1 + 1j, -2j]), requires_grad=True)
    with pytest.raises(NotImplementedError, match=r"torch\.sgn: complex inputs are not supported — "):
        torch.sgn(z)


# ---- property: every broadcast-compatible pair of shapes -------------------------------------------------------------

BROADCAST = {
    "fmod": (torch.fmod, (0.1, 0.4), (1.1, 1.9)),
    "remainder": (torch.remainder, (0.1, 0.4), (1.1, 1.9)),
    "fmax": (torch.fmax, (-2.0, 2.0), (-2.0, 2.0)),
    "fmin": (torch.fmin, (-2.0, 2.0), (-2.0, 2.0)),
    "copysign": (torch.copysign, (0.2, 2.0), (-2.0, 2.0)),
    "ldexp": (torch.ldexp, (-2.0, 2.0), (-2.0, 2.0)),
    "float_power": (torch.float_power, (0.5, 2.0), (-2.0, 2.0)),
}


test_broadcasting_property = broadcast_test(BROADCAST)


DOUBLE_BACKWARD = [
    case("frac", lambda x: torch.frac(x) * x, double(0.1, 0.4, 4)),
    case("fmod", lambda a, b: torch.fmod(a, b) * b, double(0.1, 0.4, 4), DEN.data[:4]),
    case("remainder", lambda a, b: torch.remainder(a * a, b) * b, double(0.1, 0.4, 4), DEN.data[:4]),
    case("fmax-fmin", lambda a, b: torch.fmax(a, b) * torch.fmin(a, b), double(-2, 2, 4), double(-2, 2, 4)),
    case("copysign", lambda a, b: torch.copysign(a * a, b) * a, double(-2, 2, 4), double(-2, 2, 4)),
    case("ldexp", torch.ldexp, double(-2, 2, 4), double(-2, 2, 4)),
    case("float_power", torch.float_power, double(0.5, 2, 4), double(-2, 2, 4)),
    case("frexp", lambda x: torch.frexp(x * x)[0], double(0.3, 3, 4)),
    case("nan_to_num", lambda x: torch.nan_to_num(x * x), double(-2, 2, 4)),
    case("positive-sgn", lambda x: torch.positive(x) * x * torch.sgn(x), double(-2, 2, 4)),
]


@pytest.mark.parametrize("fn, inputs", DOUBLE_BACKWARD)
def test_double_backward(fn: Callable, inputs: tuple) -> None:
    double_backward_matches(fn, *inputs)


def test_integer_operands_record_nothing() -> None:
    x = tt.tracer(torch.tensor([5, -7, 9]))
    assert (x % 4).tolist() == [1, 1, 1] and torch.fmod(x, 4).grad_fn is None
