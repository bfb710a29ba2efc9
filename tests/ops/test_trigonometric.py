"""Rules of torchtrace/ops/trigonometric.py (inverse trig, hyperbolic, sinc, deg2rad/rad2deg, hypot)."""
from typing import Callable

import pytest
import torch
from elementwise_cases import DTYPES, INF, NAN, broadcast_test, case, double, run, run_edges, signed, uniform, values
from helpers import double_backward_matches

import torchtrace as tt

UNIT, WIDE = uniform(-0.9, 0.9, 3, 4), uniform(-2.0, 2.0, 3, 4)

CASES = [
    case("asin", torch.asin, UNIT),
    case("arcsin", torch.arcsin, uniform(-0.9, 0.9, 5)),
    case("asin-method-noncontig", lambda x: x.asin(), uniform(-0.9, 0.9, 3, 4, nc=True)),
    case("arcsin-method-0d", lambda x: x.arcsin(), uniform(-0.9, 0.9)),
    case("acos", torch.acos, UNIT),
    case("arccos-method", lambda x: x.arccos(), uniform(-0.9, 0.9, 4)),
    case("acos-inplace", lambda x: (x * 1).acos_(), UNIT),
    case("atan", torch.atan, WIDE),
    case("arctan-twice", lambda x: torch.arctan(x) * x, uniform(-3, 3, 5)),
    case("atan-method", lambda x: x.atan(), WIDE),
    case("arctan-method", lambda x: x.arctan(), uniform(-3, 3)),
    case("sinh", torch.sinh, WIDE),
    case("sinh-method", lambda x: x.sinh(), uniform(-2, 2, 4, nc=True)),
    case("cosh", torch.cosh, WIDE),
    case("cosh-method-0d", lambda x: x.cosh(), uniform(-2, 2)),
    case("sinh-cosh-inplace", lambda x: (x * 1).sinh_().cosh_(), uniform(-1, 1, 4)),
    case("asinh", torch.asinh, WIDE),
    case("arcsinh-method", lambda x: x.arcsinh(), WIDE),
    case("acosh", torch.acosh, uniform(1.2, 4.0, 3, 4)),
    case("arccosh", torch.arccosh, uniform(1.2, 4.0, 5)),
    case("acosh-method", lambda x: x.acosh(), uniform(1.2, 4.0, 2, 3)),
    case("atanh", torch.atanh, UNIT),
    case("arctanh-method", lambda x: x.arctanh(), uniform(-0.9, 0.9, 4)),
    case("atan-inplace", lambda x: (x * 0.5).atan_(), UNIT),
    case("sinc", torch.sinc, uniform(-3, 3, 3, 4)),
    case("sinc-special", torch.special.sinc, signed(0.1, 2.5, 5)),
    case("sinc-method-twice", lambda x: x.sinc() * x, uniform(-2, 2, 4, nc=True)),
    case("deg2rad", torch.deg2rad, uniform(-200, 200, 3, 4)),
    case("deg2rad-method", lambda x: x.deg2rad(), uniform(-200, 200, 4)),
    case("rad2deg", torch.rad2deg, WIDE),
    case("rad2deg-method-inplace", lambda x: (x * 1).rad2deg_(), WIDE),
    case("hypot", torch.hypot, WIDE, WIDE),
    case("hypot-broadcast", torch.hypot, uniform(-2, 2, 3, 1), uniform(-2, 2, 4, nc=True)),
    case("hypot-method-0d", lambda a, b: a.hypot(b), uniform(-2, 2), uniform(-2, 2, 3)),
    case("hypot-twice", lambda a: torch.hypot(a, a * 2), WIDE),
    case("hypot-constant", lambda a: torch.hypot(a, torch.ones(4, dtype=a.dtype)), WIDE),
    case("hypot-inplace", lambda a, b: (a * 1).hypot_(b), WIDE, uniform(-2, 2, 4)),
]


@DTYPES
@pytest.mark.parametrize("fn, args", CASES)
def test_rule_matches_torch(fn: Callable, args: tuple, dtype: torch.dtype) -> None:
    run(fn, args, dtype)


EDGE = values(0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 3.0, INF, -INF, NAN, 1e-30, 1e-8)
PAIRS = (values(0.0, -0.0, 0.0, 1.0, INF, NAN, 3.0, -2.0, INF), values(0.0, 0.0, -0.0, 0.0, 1.0, 1.0, INF, -0.0, INF))
EDGES = [case(name, fn, EDGE) for name, fn in [
    ("asin", torch.asin), ("acos", torch.acos), ("atan", torch.atan), ("sinh", torch.sinh), ("cosh", torch.cosh),
    ("asinh", torch.asinh), ("acosh", torch.acosh), ("atanh", torch.atanh), ("sinc", torch.sinc),
    ("deg2rad", torch.deg2rad), ("rad2deg", torch.rad2deg)]] + [case("hypot", torch.hypot, *PAIRS)]


@DTYPES
@pytest.mark.parametrize("fn, args", EDGES)
def test_edges_match_torch(fn: Callable, args: tuple, dtype: torch.dtype) -> None:
    """|x| = 1 (asin, acosh, atanh), x = 0 (sinc), the origin (hypot: NaN as torch), infinities and NaN."""
    run_edges(fn, args, dtype)


def test_sinc_gradient_at_zero_is_zero() -> None:
    x = tt.tracer([0.0, -0.0], requires_grad=True)
    torch.sinc(x).sum().backward()
    assert x.grad.tolist() == [0.0, 0.0]


# ---- property: every broadcast-compatible pair of shapes -------------------------------------------------------------

BROADCAST = {
    "hypot": (torch.hypot, (-2.0, 2.0), (0.5, 2.0)),
}


test_broadcasting_property = broadcast_test(BROADCAST)


DOUBLE_BACKWARD = [
    case("asin", torch.asin, double(-0.9, 0.9, 4)),
    case("acos", torch.acos, double(-0.9, 0.9, 4)),
    case("atan", torch.atan, double(-2, 2, 4)),
    case("sinh-cosh", lambda x: torch.sinh(x) * torch.cosh(x), double(-2, 2, 4)),
    case("asinh", torch.asinh, double(-2, 2, 4)),
    case("acosh", torch.acosh, double(1.2, 3, 4)),
    case("atanh", torch.atanh, double(-0.9, 0.9, 4)),
    case("sinc", torch.sinc, double(-2, 2, 5)),
    case("deg2rad-rad2deg", lambda x: torch.deg2rad(x) * torch.rad2deg(x), double(-2, 2, 4)),
    case("hypot", torch.hypot, double(-2, 2, 4), double(-2, 2, 4)),
]


@pytest.mark.parametrize("fn, inputs", DOUBLE_BACKWARD)
def test_double_backward(fn: Callable, inputs: tuple) -> None:
    double_backward_matches(fn, *inputs)
