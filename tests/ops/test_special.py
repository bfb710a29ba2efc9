"""Rules of torchtrace/ops/special.py: gamma family, Bessel I0/I1, ndtr family, erfinv/erfcx, logaddexp, logit,
xlogy/xlog1py, entr."""
from typing import Callable

import pytest
import torch
from elementwise_cases import DTYPES, INF, NAN, broadcast_test, case, double, run, run_edges, uniform, values
from helpers import check_op, double_backward_matches

import torchtrace as tt

S = torch.special
UNIT, WIDE, POS = uniform(-0.9, 0.9, 3, 4), uniform(-3.0, 3.0, 3, 4), uniform(0.3, 4.0, 3, 4)
PROB = uniform(0.05, 0.95, 3, 4)

CASES = [
    case("erfinv", torch.erfinv, UNIT),
    case("erfinv-special", S.erfinv, uniform(-0.9, 0.9, 5, nc=True)),
    case("erfinv-method-inplace", lambda x: (x * 1).erfinv_() * x.erfinv(), UNIT),
    case("erfcx", S.erfcx, WIDE),
    case("ndtr", S.ndtr, WIDE),
    case("ndtri", S.ndtri, PROB),
    case("log_ndtr", S.log_ndtr, uniform(-5, 3, 3, 4)),
    case("lgamma", torch.lgamma, POS),
    case("lgamma-negative-non-integer", torch.lgamma, uniform(-2.9, -2.1, 5)),
    case("gammaln", S.gammaln, POS),
    case("lgamma-method-0d", lambda x: x.lgamma(), uniform(0.3, 4.0)),
    case("digamma", torch.digamma, POS),
    case("digamma-special", S.digamma, uniform(0.3, 4, 4, nc=True)),
    case("psi", S.psi, POS),
    case("digamma-method-inplace", lambda x: (x * 1).digamma_(), POS),
    case("polygamma-0", lambda x: torch.polygamma(0, x), POS),
    case("polygamma-1", lambda x: torch.polygamma(1, x), POS),
    case("polygamma-special-2", lambda x: S.polygamma(2, x), POS),
    case("polygamma-keyword", lambda x: torch.polygamma(3, input=x), uniform(0.5, 4, 4)),
    case("polygamma-method", lambda x: x.polygamma(1), POS),
    case("polygamma-method-inplace", lambda x: (x * 1).polygamma_(2), uniform(0.5, 3, 4)),
    case("polygamma-method-keyword", lambda x: x.polygamma(n=2), POS),
    case("mvlgamma", lambda x: torch.mvlgamma(x, 3), uniform(1.2, 4, 3, 4)),
    case("mvlgamma-keyword", lambda x: torch.mvlgamma(x, p=1), POS),
    case("multigammaln", lambda x: S.multigammaln(x, 2), uniform(0.7, 4, 5)),
    case("mvlgamma-method-inplace", lambda x: (x * 1).mvlgamma_(p=2) * x.mvlgamma(4), uniform(1.7, 4, 4)),
    case("i0", torch.i0, WIDE),
    case("i0-special", S.i0, uniform(-3, 3, 4, nc=True)),
    case("i0-method-inplace", lambda x: (x * 1).i0_() + x.i0(), WIDE),
    case("i0e", S.i0e, WIDE),
    case("i1", S.i1, WIDE),
    case("i1e", S.i1e, WIDE),
    case("entr", S.entr, POS),
    case("logit", torch.logit, PROB),
    case("logit-eps", lambda x: torch.logit(x, 0.2), uniform(0.0, 1.0, 3, 4)),
    case("logit-eps-keyword", lambda x: torch.logit(x, eps=0.1), uniform(-0.5, 1.5, 6)),
    case("logit-special", lambda x: S.logit(x, eps=0.3), PROB),
    case("logit-method-inplace", lambda x: (x * 1).logit_(0.1) + x.logit(), PROB),
    case("logaddexp", torch.logaddexp, WIDE, WIDE),
    case("logaddexp-broadcast-method", lambda a, b: a.logaddexp(b), uniform(-3, 3, 3, 1), uniform(-3, 3, 4, nc=True)),
    case("logaddexp-twice", lambda a: torch.logaddexp(a, a * 2), WIDE),
    case("logaddexp2", torch.logaddexp2, WIDE, WIDE),
    case("logaddexp2-method-0d", lambda a, b: a.logaddexp2(b), uniform(-3, 3), uniform(-3, 3, 4)),
    case("xlogy", torch.xlogy, WIDE, POS),
    case("xlogy-special", S.xlogy, uniform(-3, 3, 3, 1), uniform(0.3, 4, 4)),
    case("xlogy-number-self", lambda y: torch.xlogy(2.0, y), POS),
    case("xlogy-number-other", lambda x: torch.xlogy(x, 3.0), WIDE),
    case("xlogy-special-number-self", lambda y: S.xlogy(-1.5, y), POS),
    case("xlogy-method-twice", lambda x: x.xlogy(x), POS),
    case("xlogy-inplace", lambda x, y: (x * 1).xlogy_(y), WIDE, POS),
    case("xlog1py", S.xlog1py, WIDE, uniform(-0.7, 3, 3, 4)),
    case("xlog1py-number-self", lambda y: S.xlog1py(2.0, y), uniform(-0.7, 3, 4)),
    case("xlog1py-number-other", lambda x: S.xlog1py(x, 0.5), WIDE),
]


@DTYPES
@pytest.mark.parametrize("fn, args", CASES)
def test_rule_matches_torch(fn: Callable, args: tuple, dtype: torch.dtype) -> None:
    run(fn, args, dtype)


EDGE = values(0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 3.0, INF, -INF, NAN, 1e-30, 1e-8, -1e-8, 0.99, 40.0, -40.0)
A = values(0.0, 0.0, 0.0, -0.0, 1.0, 2.0, 0.0, 0.0, NAN, 3.0, INF, -INF)
B = values(0.0, -1.0, -2.0, 1.0, 0.0, -1.0, INF, NAN, 1.0, -INF, INF, INF)
EDGES = [case(name, fn, EDGE) for name, fn in [
    ("erfinv", torch.erfinv), ("erfcx", S.erfcx), ("ndtr", S.ndtr), ("ndtri", S.ndtri), ("log_ndtr", S.log_ndtr),
    ("lgamma", torch.lgamma), ("digamma", torch.digamma), ("polygamma", lambda x: torch.polygamma(2, x)),
    ("mvlgamma", lambda x: torch.mvlgamma(x, 2)), ("i0", torch.i0), ("i0e", S.i0e), ("i1", S.i1), ("i1e", S.i1e),
    ("entr", S.entr),
    ("xlogy-number-other", lambda x: torch.xlogy(x, 0.0) + torch.xlogy(x, -1.0) + torch.xlogy(x, 2.0)),
    ("xlog1py-number-other", lambda x: S.xlog1py(x, -1.0) + S.xlog1py(x, -2.0) + S.xlog1py(x, 0.5)),
    ("xlogy-number-self", lambda y: torch.xlogy(0.0, y) + torch.xlogy(2.0, y)),
]] + [case(name, fn, A, B) for name, fn in [
    ("xlogy", torch.xlogy), ("xlog1py", S.xlog1py), ("logaddexp", torch.logaddexp), ("logaddexp2", torch.logaddexp2)]]
# logit: not at -0.0 (torch's float32 kernel gives -inf there, its float64 kernel +inf) nor NaN with eps (torch's
# vectorized kernel gives 0, its scalar tail NaN): torchtrace follows the scalar float64 formula at those two.
LOGIT_EDGE = values(0.0, 1.0, -1.0, 0.5, 0.01, 0.99, 0.005, 0.995, 2.0, INF, -INF, 1e-30, 1e-8, -1e-8)
EDGES += [case("logit", torch.logit, LOGIT_EDGE), case("logit-nan", torch.logit, values(NAN, 0.5)),
          case("logit-eps", lambda x: torch.logit(x, 0.01), LOGIT_EDGE)]


@DTYPES
@pytest.mark.parametrize("fn, args", EDGES)
def test_edges_match_torch(fn: Callable, args: tuple, dtype: torch.dtype) -> None:
    """Poles, domain ends, x = 0 (i1'(0) = 1/2, xlogy's 0 ln 0), infinities and NaN give torch's values."""
    run_edges(fn, args, dtype)


def test_i1_gradient_near_zero_is_one_half() -> None:
    x = tt.tracer(torch.tensor([0.0, 1e-20, -1e-20], dtype=torch.float64), requires_grad=True)
    (S.i1(x) + S.i1e(x)).sum().backward()
    assert x.grad.tolist() == [1.0, 1.0, 1.0]


def test_xlogy_gradient_at_zero_times_log_zero_is_zero() -> None:
    x = tt.tracer([0.0, 0.0], requires_grad=True)
    torch.xlogy(x, torch.tensor([0.0, -1.0])).sum().backward()
    assert x.grad.tolist() == [0.0, 0.0]


# ---- property: every broadcast-compatible pair of shapes -------------------------------------------------------------

BROADCAST = {
    "logaddexp": (torch.logaddexp, (-3.0, 3.0), (-3.0, 3.0)),
    "logaddexp2": (torch.logaddexp2, (-3.0, 3.0), (-3.0, 3.0)),
    "xlogy": (torch.xlogy, (-2.0, 2.0), (0.3, 3.0)),
    "xlog1py": (torch.special.xlog1py, (-2.0, 2.0), (-0.7, 3.0)),
}


test_broadcasting_property = broadcast_test(BROADCAST)


DOUBLE_BACKWARD = [
    case("erfinv", torch.erfinv, double(-0.9, 0.9, 4)),
    case("erfcx", S.erfcx, double(-2, 2, 4)),
    case("ndtr", S.ndtr, double(-2, 2, 4)),
    case("ndtri", S.ndtri, double(0.1, 0.9, 4)),
    case("log_ndtr", S.log_ndtr, double(-3, 2, 4)),
    case("lgamma", torch.lgamma, double(0.3, 4, 4)),
    case("digamma", torch.digamma, double(0.3, 4, 4)),
    case("polygamma", lambda x: torch.polygamma(1, x) + x.polygamma(2), double(0.5, 4, 4)),
    case("mvlgamma", lambda x: torch.mvlgamma(x, 3), double(1.5, 4, 4)),
    case("i0", torch.i0, double(-3, 3, 4)),
    case("i0e", S.i0e, double(-3, 3, 4)),
    case("i1", S.i1, double(-3, 3, 4)),
    case("i1e", S.i1e, double(-3, 3, 4)),
    case("entr", S.entr, double(0.3, 3, 4)),
    case("logit", torch.logit, double(0.1, 0.9, 4)),
    case("logit-eps", lambda x: torch.logit(x, 0.2), double(0.0, 1.0, 6)),
    case("logaddexp", torch.logaddexp, double(-2, 2, 4), double(-2, 2, 4)),
    case("logaddexp2", torch.logaddexp2, double(-2, 2, 4), double(-2, 2, 4)),
    case("xlogy", torch.xlogy, double(-2, 2, 4), double(0.3, 3, 4)),
    case("xlog1py", S.xlog1py, double(-2, 2, 4), double(-0.5, 3, 4)),
]


@pytest.mark.parametrize("fn, inputs", DOUBLE_BACKWARD)
def test_double_backward(fn: Callable, inputs: tuple) -> None:
    double_backward_matches(fn, *inputs)


A_POS = torch.tensor([[0.5, 2.0, 3.5], [1.2, 0.8, 5.0]], dtype=torch.float64)


@pytest.mark.parametrize("fn", [S.gammainc, S.gammaincc, torch.igamma, torch.igammac, lambda a, x: a.igamma(x),
                                lambda a, x: a.expand(x.shape).clone().igammac_(x)])
def test_the_incomplete_gamma_functions_are_differentiated_in_x_as_torch(fn):
    """dP/dx = x^(a-1) e^-x / Gamma(a) (Q = 1 - P: the opposite), against torch autograd and finite differences,
    to second order; a broadcast a as well."""
    x = torch.linspace(0.3, 4.0, 6, dtype=torch.float64).reshape(2, 3)
    check_op(lambda x: fn(A_POS, x), x)
    check_op(lambda x: fn(A_POS[:1], x), x)
    double_backward_matches(lambda x: fn(A_POS, x), x)


def test_the_incomplete_gamma_functions_refuse_a_gradient_in_a_at_backward_as_torch():
    a = tt.tracer(A_POS, requires_grad=True)
    y = S.gammainc(a, tt.tracer(A_POS + 1))  # the forward runs, as torch's
    with pytest.raises(RuntimeError, match="with respect to its first argument .a. is not implemented"):
        y.sum().backward()
    theirs = A_POS.clone().requires_grad_(True)
    with pytest.raises(RuntimeError, match="not implemented"):
        S.gammainc(theirs, A_POS + 1).sum().backward()


def test_a_gamma_distributions_cdf_is_differentiated_in_its_rate_as_torch():
    """Gamma.cdf is gammainc(concentration, rate x), with concentration a broadcast output that needs no gradient."""
    def rate_grad(make):
        rate = make(torch.tensor([1.5, 0.7], dtype=torch.float64))
        torch.distributions.Gamma(torch.tensor([2.0, 3.0], dtype=torch.float64), rate).cdf(
            torch.tensor([1.0, 2.5], dtype=torch.float64)).sum().backward()
        return rate.grad

    torch.testing.assert_close(rate_grad(lambda t: tt.tracer(t, requires_grad=True)),
                               rate_grad(lambda t: t.clone().requires_grad_(True)))
