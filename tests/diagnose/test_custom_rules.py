"""tt.diagnose checks a user's own rules against their forward: <u, J v> by the backward against central differences
of the forward in float64. A wrong backward is a `wrong_rule` finding; right ones, a surrogate gradient on purpose (a
straight-through estimator) and a rule that draws random numbers are not."""
import pytest
import torch
from helpers import Cube, RoundSTE, WrongSquare

import torchtrace as tt


class ScaledProduct(torch.autograd.Function):
    """z = s a b (s a number)  ->  dz/da = s b, dz/db = s a (`wrong`: dz/db = a)"""

    @staticmethod
    def forward(a, b, s, wrong):
        return s * a * b

    @staticmethod
    def setup_context(ctx, inputs, output):
        a, b, ctx.s, ctx.wrong = inputs
        ctx.save_for_backward(a, b)

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        return g * ctx.s * b, g * a * (1 if ctx.wrong else ctx.s), None, None


class ScaledDropout(tt.Function):
    """y = x m / (1 - p), m ~ Bernoulli(1 - p) drawn in forward  ->  dy/dx = m / (1 - p)"""

    @staticmethod
    def forward(ctx, x):
        mask = (torch.rand_like(x) > 0.5).to(x.dtype) * 2
        ctx.save_for_backward(mask)
        return x * mask

    @staticmethod
    def backward(ctx, g):
        (mask,) = ctx.saved_tensors
        return g * mask


def wrong_rules(fn, *args):
    d = tt.diagnose(fn, *args)
    return [f for f in d.findings if f.kind == "wrong_rule"], d


def test_a_wrong_backward_is_named_with_both_numbers_and_a_right_one_is_not():
    torch.manual_seed(0)
    w, x = tt.randn(4, requires_grad=True), tt.randn(4)
    (finding,), d = wrong_rules(lambda a: WrongSquare.apply(a * w).sum(), x)
    assert finding.rule == "WrongSquare" and finding.line.startswith("test_custom_rules.py:")
    by_backward, by_forward = _numbers(finding.message)
    assert by_backward == pytest.approx(by_forward / 2, rel=1e-5)  # g x against 2 g x
    assert "tt.gradcheck(WrongSquare.apply" in finding.advice and d.alarms == [finding]
    assert wrong_rules(lambda a: Cube.apply(a * w).sum(), x)[0] == []


def _numbers(message):
    backward = message.split(") is ")[1].split(" by its backward and ")
    return float(backward[0]), float(backward[1].split(" by central")[0])


@pytest.mark.parametrize("wrong", [False, True])
def test_a_torch_autograd_function_with_setup_context_and_number_arguments(wrong):
    torch.manual_seed(0)
    a, b = tt.randn(3, requires_grad=True), tt.randn(3, requires_grad=True)
    found, _ = wrong_rules(lambda: ScaledProduct.apply(a, b, 2.5, wrong).pow(2).sum())
    assert [f.rule for f in found] == (["ScaledProduct"] if wrong else [])


def test_a_straight_through_estimator_and_a_rule_drawing_random_numbers_raise_no_alarm():
    torch.manual_seed(0)
    w = tt.randn(6, requires_grad=True)
    assert wrong_rules(lambda: RoundSTE.apply(w * 3).pow(2).sum())[0] == []
    assert wrong_rules(lambda: ScaledDropout.apply(w).tanh().sum())[0] == []
