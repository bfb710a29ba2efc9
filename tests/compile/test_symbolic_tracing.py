"""Symbolic tracing of rules: each category decided by mechanism on named rules, and the refusals behind it."""
import io
import math
import re

import pytest
import torch
import torch.nn.functional as F

import torchtrace as tt
from torchtrace.__main__ import parser
from torchtrace.compiler.tracing import report, straight_line, trace_rule
from torchtrace.compiler.tracing.calls import calls_of
from torchtrace.compiler.tracing.judge import BRANCHES, CLEAN, CLEAN_FLOATS, ESCAPES, fixed_float_trace, perturb
from torchtrace.compiler.tracing.symbolic_float import Apply, Const, FloatSteering, SymbolicFloat, Var
from torchtrace.ops.listing import rules


def _leaf(*shape, dtype=torch.float64):
    torch.manual_seed(len(shape))
    return tt.as_tracer(torch.randn(*shape, dtype=dtype), requires_grad=True)


def _only_verdict(fn, *args, **kwargs):
    calls = calls_of(fn, *args, **kwargs)
    assert len(calls) == 1, [c.rule.__name__ for c in calls]
    call = calls[0]
    return trace_rule(call.rule, call.args, call.kwargs, call.mask)


# --- the symbolic float ---------------------------------------------------------------------------------------

def test_arithmetic_is_recorded_and_evaluates_to_the_value():
    a, b = SymbolicFloat(0.3, Var(0)), SymbolicFloat(2.0, Var(1))
    c = (1 - a) * b ** 2 / 4 + -a
    assert float.__float__(c) == (1 - 0.3) * 2.0 ** 2 / 4 + -0.3
    assert c.expression.evaluate([0.3, 2.0]) == float.__float__(c)
    assert c.expression.evaluate([0.5, 1.0]) == (1 - 0.5) * 1.0 ** 2 / 4 + -0.5
    assert c.expression.render() == "((((1 - f0) * (f1 ** 2)) / 4) + -f0)"
    assert isinstance(c, SymbolicFloat) and isinstance(Apply("neg", Const(1.5)).evaluate([]), float)


def test_constants_without_a_literal_are_rendered_so_they_evaluate():
    for value in (float("nan"), float("inf"), -float("inf"), 0.1, -0.0, 3):
        got = eval(Const(value).render())
        assert repr(got) == repr(value)


@pytest.mark.parametrize("steer", [bool, int, round, math.floor, math.ceil, math.trunc, hash, float, repr, str,
                                   lambda x: f"{x:.2f}", lambda x: x > 0, lambda x: x == 1.0, lambda x: x <= 0,
                                   lambda x: {x: 1}, lambda x: [1, 2][x], lambda x: x.is_integer()])
def test_every_way_to_steer_python_is_refused(steer):
    with pytest.raises(FloatSteering):
        steer(SymbolicFloat(1.0, Var(0)))


def test_float_and_repr_are_escapes_comparisons_are_branches():
    x = SymbolicFloat(1.0, Var(0))
    with pytest.raises(FloatSteering) as escape:
        float(x)
    with pytest.raises(FloatSteering) as branch:
        x < 2
    assert escape.value.escapes and not branch.value.escapes


def test_perturbed_float_stays_a_probability_and_moves():
    for p in (0.0, 0.1, 0.5, 1.0, -3.0, 2.0):
        q = perturb(p)
        assert q != p and (not 0 <= p <= 1 or 0 <= q <= 1)


# --- the named categories ---------------------------------------------------------------------------------------

def test_mul_is_clean_without_floats():
    verdict = _only_verdict(torch.mul, _leaf(3, 4), _leaf(3, 4))
    assert (verdict.rule.__name__, verdict.category) == ("Mul", CLEAN)
    code = straight_line(verdict)
    assert "def forward(x0, x1):" in code.source and "def backward(x0, x1, g0):" in code.source
    assert code.saved == ["x0", "x1"] and code.n_floats == 0


def test_leaky_relu_is_clean_with_its_slope_as_a_parameter_never_a_literal():
    verdict = _only_verdict(F.leaky_relu, _leaf(5), 0.125)
    assert (verdict.rule.__name__, verdict.category) == ("LeakyRelu", CLEAN_FLOATS)
    code = straight_line(verdict)
    assert "def backward(x0, g0, f0):" in code.source and "0.125" not in code.source
    assert "leaky_relu_backward(g0, x0, f0, False)" in code.source  # the slope passed as f0 on every call


def test_cross_entropy_with_label_smoothing_branches_on_it():
    logits = _leaf(4, 5)
    target = tt.as_tracer(torch.tensor([0, 3, 1, 4]))
    verdict = _only_verdict(F.cross_entropy, logits, target, label_smoothing=0.1)
    assert (verdict.rule.__name__, verdict.category) == ("CrossEntropy", BRANCHES)
    assert verdict.reason.startswith("branches on a float of the call") and verdict.trace is None
    with pytest.raises(ValueError, match="not clean"):
        straight_line(verdict)


def test_a_p_norm_lets_its_p_escape():
    verdict = _only_verdict(torch.linalg.vector_norm, _leaf(6), 3.0)
    assert (verdict.rule.__name__, verdict.category) == ("VectorNorm", ESCAPES)
    assert "leaves the record" in verdict.reason


def test_with_its_floats_fixed_a_branching_or_escaping_rule_traces_and_a_value_read_does_not():
    for func, args, kwargs in ((F.cross_entropy, (_leaf(4, 5), tt.as_tracer(torch.tensor([0, 3, 1, 4]))),
                                {"label_smoothing": 0.1}), (torch.linalg.vector_norm, (_leaf(6), 3.0), {})):
        (call,) = calls_of(func, *args, **kwargs)
        verdict = trace_rule(call.rule, call.args, call.kwargs, call.mask)
        trace = fixed_float_trace(call.rule, call.args, call.kwargs, call.mask, verdict)
        assert verdict.category in (BRANCHES, ESCAPES) and trace is not None and trace.floats
        body = straight_line(trace).source.split("def backward")[1].split(":", 1)[1]
        assert "f0" not in body  # the float is a constant of this code, not a parameter
    (call,) = calls_of(torch.prod, _leaf(6))
    verdict = trace_rule(call.rule, call.args, call.kwargs, call.mask)
    assert fixed_float_trace(call.rule, call.args, call.kwargs, call.mask, verdict) is None


def test_prod_reads_a_value():
    verdict = _only_verdict(torch.prod, _leaf(6))
    assert (verdict.rule.__name__, verdict.category) == ("Prod", BRANCHES)
    assert verdict.reason.startswith("reads a value")


# --- refusals on rules written for the test ------------------------------------------------------------------

_MADE_ELSEWHERE = torch.full((3,), 2.0, dtype=torch.float64)


class _UsesOutsideTensor(tt.Function):
    """y = x  ->  dx = 2 g, with the 2 from a tensor made outside the rule's calls."""

    @staticmethod
    def forward(ctx, x, scale):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return g * _MADE_ELSEWHERE, None


class _CatchesItsBranch(tt.Function):
    """y = scale x  ->  dx = scale g, written with a branch it hides behind a try."""

    @staticmethod
    def forward(ctx, x, scale):
        ctx.scale = scale
        return x * scale

    @staticmethod
    def backward(ctx, g):
        try:
            fast = ctx.scale == 1.0
        except Exception:
            fast = False
        return (g if fast else g * ctx.scale), None


class _SqrtInC(tt.Function):
    """y = sqrt(s) x  ->  dx = sqrt(s) g, with sqrt taken by C code (math.sqrt reads the float's value)."""

    @staticmethod
    def forward(ctx, x, scale):
        ctx.root = math.sqrt(scale)
        return x * ctx.root

    @staticmethod
    def backward(ctx, g):
        return g * ctx.root, None


def _plain(n=3):
    return torch.randn(n, dtype=torch.float64)


def test_a_tensor_made_outside_the_recorded_calls_is_refused():
    verdict = trace_rule(_UsesOutsideTensor, (_plain(), 2.0), {}, 1)
    assert verdict.category == BRANCHES and verdict.reason.startswith("unknown tensor")


def test_a_refusal_the_rule_catches_still_counts():
    verdict = trace_rule(_CatchesItsBranch, (_plain(), 2.0), {}, 1)
    assert verdict.category == BRANCHES and "comparison" in verdict.reason


def test_a_float_escaping_through_c_code_is_found_by_the_perturbed_run():
    verdict = trace_rule(_SqrtInC, (_plain(), 2.0), {}, 1)
    assert verdict.category == ESCAPES and "outside the record" in verdict.reason


def test_a_value_read_and_a_nested_apply_are_refused():
    class ReadsItem(tt.Function):
        """y = x  ->  dx = g max(x)"""

        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * x.max().item()

    class CallsAnotherRule(tt.Function):
        """y = x^3  ->  dx = 3 x^2 g, through another Function."""

        @staticmethod
        def forward(ctx, x):
            return ReadsItem.apply(x) ** 3

        @staticmethod
        def backward(ctx, g):
            return g

    assert trace_rule(ReadsItem, (_plain(),), {}, 1).reason == "reads a value: torch.Tensor.item"
    assert trace_rule(CallsAnotherRule, (_plain(),), {}, 1).reason.startswith("nested rule: ReadsItem.apply")


def test_a_layout_read_becomes_a_check_of_the_generated_code():
    class ReadsShape(tt.Function):
        """y = x  ->  dx = g reshaped to x's shape"""

        @staticmethod
        def forward(ctx, x):
            ctx.shape = x.shape
            return x.flatten()

        @staticmethod
        def backward(ctx, g):
            return g.reshape(ctx.shape)

    x = torch.randn(2, 3, dtype=torch.float64)
    verdict = trace_rule(ReadsShape, (x,), {}, 1)
    assert verdict.category == CLEAN
    code = straight_line(verdict)
    assert "expect(x0.shape, torch.Size([2, 3]), 'x0.shape')" in code.source
    out, saved = code.forward(x)
    assert torch.equal(code.backward(*saved, torch.ones(6, dtype=torch.float64)), torch.ones(2, 3, dtype=torch.float64))
    with pytest.raises(ValueError, match="x0.shape is torch.Size"):
        code.forward(torch.randn(3, 2, dtype=torch.float64))


# --- the command ----------------------------------------------------------------------------------------------

def test_ops_compile_prints_each_unclean_rule_with_its_reason_and_the_totals():
    out = io.StringIO()
    verdicts = report.main(only=["mul", "nn.functional.cross_entropy", "prod"], per_op=2, out=out)
    text = out.getvalue()
    assert re.search(r"^branches or reads +CrossEntropy +branches on a float of the call: .+ "
                     r"\[nn\.functional\.cross_entropy\]; compiled: traced with its floats fixed, checked each call$",
                     text, flags=re.MULTILINE), text
    assert re.search(r"^branches or reads +Prod +reads a value: .+ \[prod\]$", text, flags=re.MULTILINE), text
    totals = re.search(r"rules: (\d+) registered, (\d+) exercised by OpInfo samples \(2 per entry\) -- clean (\d+), "
                       r"clean, floats in arithmetic (\d+), branches or reads (\d+), float escapes (\d+), "
                       r"code differs (\d+); not exercised (\d+)", text)
    registered, exercised, *categories, unexercised = map(int, totals.groups())
    assert registered == len(rules()) == len(verdicts) and exercised + unexercised == registered
    assert sum(categories) == exercised and categories[0] >= 1 and categories[-1] == 0  # Mul clean; code all right
    assert re.search(r"of the unclean, 1 trace clean with their floats fixed", text), text  # CrossEntropy, not Prod
    assert parser().parse_args(["ops", "--compile"]).compile


def test_ops_traced_prints_a_rules_straight_line_code():
    out = io.StringIO()
    verdict = report.show_traced("Mul", out=out)
    assert verdict.category == CLEAN and "def backward(x0, x1, g0):" in out.getvalue()
    with pytest.raises(SystemExit, match="no registered rule"):
        report.find_rule("NoSuchRule")
