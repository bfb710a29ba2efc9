"""The notebooks' exercise checkers: right answers pass; wrong ones (wrong only at a kink or a zero, a wrong type,
a wrong number of gradients) are called wrong with the full tt.check message and a hint; nothing crashes, and no
checker prints the values it expects."""
import importlib.util
from pathlib import Path

import pytest
import torch

import torchtrace as tt

_path = Path(__file__).resolve().parents[1] / "examples" / "notebooks" / "checkers.py"
_spec = importlib.util.spec_from_file_location("checkers", _path)
checkers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(checkers)


def verdict(capsys, check, *args) -> str:
    torch.manual_seed(0)
    check(*args)
    return capsys.readouterr().out


def assert_right(capsys, check, *args):
    printed = verdict(capsys, check, *args)
    assert printed.startswith("right") or "right" in printed.splitlines()[-1], printed


def assert_wrong(capsys, check, *args, naming=None):
    printed = verdict(capsys, check, *args)
    assert printed.startswith("wrong") or "wrong" in printed, printed
    assert "\nhint: " in printed, printed
    assert "tensor(" not in printed and "Traceback" not in printed, printed
    if naming:
        assert naming in printed, printed  # the full tt.check message names the student's rule
    return printed


def rule(forward, backward):
    """A tt.Function from two plain functions (forward(ctx, *args), backward(ctx, grad))."""
    return type("Rule", (tt.Function,), {"forward": staticmethod(forward), "backward": staticmethod(backward)})


def saving(f):
    def forward(ctx, x, *rest):
        ctx.save_for_backward(x)
        ctx.rest = rest
        return f(x, *rest)
    return forward


def not_done(ctx, *args):
    raise NotImplementedError


# ------------------------------------------------------------------ 02


def test_softplus(capsys):
    forward = saving(lambda x: torch.log1p(torch.exp(x)))
    assert_right(capsys, checkers.softplus, rule(forward, lambda ctx, g: g * torch.sigmoid(ctx.saved_tensors[0])))
    wrong = rule(forward, lambda ctx, g: g * torch.exp(ctx.saved_tensors[0]))
    printed = assert_wrong(capsys, checkers.softplus, wrong, naming="First diverging node: RuleBackward (Rule.apply)")
    assert "gradient of input 0 differs" in printed
    assert verdict(capsys, checkers.softplus, rule(forward, not_done)).startswith("not done yet")


def test_leaky_wrong_only_at_zero_is_caught(capsys):
    forward = saving(lambda x, s: torch.where(x > 0, x, s * x))

    def right(ctx, g):
        (x,) = ctx.saved_tensors
        return torch.where(x > 0, g, ctx.rest[0] * g), None

    def slope_one_at_zero(ctx, g):  # agrees everywhere except x = 0, which random inputs never hit
        (x,) = ctx.saved_tensors
        return torch.where(x >= 0, g, ctx.rest[0] * g), None

    assert_right(capsys, checkers.leaky, rule(forward, right))
    assert_wrong(capsys, checkers.leaky, rule(forward, slope_one_at_zero), naming="RuleBackward")
    printed = assert_wrong(capsys, checkers.leaky, rule(forward, lambda ctx, g: "a string"))
    assert "raised" in printed


# ------------------------------------------------------------------ 03


def test_mse(capsys):
    def forward(ctx, p, t):
        ctx.save_for_backward(p, t)
        return ((p - t) ** 2).mean()

    def right(ctx, g):
        p, t = ctx.saved_tensors
        d = g * 2 * (p - t) / p.numel()
        return d, -d

    def one_gradient_for_both(ctx, g):
        p, t = ctx.saved_tensors
        d = g * 2 * (p - t) / p.numel()
        return d, d

    def without_the_mean(ctx, g):
        p, t = ctx.saved_tensors
        return g * 2 * (p - t), -g * 2 * (p - t)

    assert_right(capsys, checkers.mse, rule(forward, right))
    assert "input 2" in assert_wrong(capsys, checkers.mse, rule(forward, one_gradient_for_both), naming="RuleBackward")
    assert_wrong(capsys, checkers.mse, rule(forward, without_the_mean), naming="RuleBackward")


def test_swish(capsys):
    forward = saving(lambda x: x * torch.sigmoid(x))

    def right(ctx, g):
        (x,) = ctx.saved_tensors
        s = torch.sigmoid(x)
        return g * (s + x * s * (1 - s))

    def sigmoid_only(ctx, g):
        return g * torch.sigmoid(ctx.saved_tensors[0])

    assert_right(capsys, checkers.swish, rule(forward, right))
    assert_wrong(capsys, checkers.swish, rule(forward, sigmoid_only), naming="RuleBackward")


# ------------------------------------------------------------------ 04


@pytest.fixture
def broken():
    torch.manual_seed(1)
    layers = []
    for i in range(10):
        layers += [torch.nn.Linear(4, 4), torch.nn.ReLU()]
    network = torch.nn.Sequential(*layers[:19])
    with torch.no_grad():
        network[6].weight.mul_(1e-6)
    return network


def test_vanishing_layer_answers_of_any_type(capsys, broken):
    assert_right(capsys, checkers.vanishing_layer, 6, broken)
    assert verdict(capsys, checkers.vanishing_layer, None, broken).startswith("not done yet")
    assert_wrong(capsys, checkers.vanishing_layer, 8, broken)
    for answer in (7, 40, -3, "6", 6.0, True, [6]):  # KeyError, TypeError before: now each is a wrong answer
        assert_wrong(capsys, checkers.vanishing_layer, answer, broken)


def test_sigmoid(capsys):
    def forward(ctx, a):
        y = torch.sigmoid(a)
        ctx.save_for_backward(y)
        return y

    def right(ctx, g):
        (y,) = ctx.saved_tensors
        return g * y * (1 - y)

    def from_the_formula_of_the_input(ctx, g):  # y(1 - y) with y taken as the input
        (y,) = ctx.saved_tensors
        return g * torch.sigmoid(y) * (1 - torch.sigmoid(y))

    assert_right(capsys, checkers.sigmoid, rule(forward, right), 8)
    assert_wrong(capsys, checkers.sigmoid, rule(forward, from_the_formula_of_the_input), 8, naming="RuleBackward")


# ------------------------------------------------------------------ 05


def test_bessel_i0_is_checked_against_finite_differences(capsys):
    forward = saving(torch.special.modified_bessel_i0)
    right = rule(forward, lambda ctx, g: g * torch.special.modified_bessel_i1(ctx.saved_tensors[0]))
    even = rule(forward, lambda ctx, g: g * torch.special.modified_bessel_i1(ctx.saved_tensors[0].abs()))
    assert_right(capsys, checkers.bessel_i0, right.apply)
    printed = assert_wrong(capsys, checkers.bessel_i0, even.apply)  # wrong for x < 0 only
    assert "finite differences" in printed
    assert verdict(capsys, checkers.bessel_i0, rule(forward, not_done).apply).startswith("not done yet")


# ------------------------------------------------------------------ 06


def test_quartic_and_its_second_derivative(capsys):
    forward = saving(lambda x: x ** 4)
    right = rule(forward, lambda ctx, g: g * 4 * ctx.saved_tensors[0] ** 3)
    detached = rule(forward, lambda ctx, g: g * 4 * ctx.saved_tensors[0].detach() ** 3)
    half_recorded = rule(forward, lambda ctx, g: g * 4 * ctx.saved_tensors[0] * ctx.saved_tensors[0].detach() ** 2)
    assert_right(capsys, checkers.quartic, right)
    assert_right(capsys, checkers.quartic_second_derivative, right)
    assert "does not require grad" in assert_wrong(capsys, checkers.quartic_second_derivative, detached)
    printed = assert_wrong(capsys, checkers.quartic_second_derivative, half_recorded)
    assert "wrong at x = -1, 0.5, 2\n" in printed  # 4 x^2 instead of 12 x^2: right only at x = 0
    assert_wrong(capsys, checkers.quartic, rule(forward, lambda ctx, g: g * 4 * ctx.saved_tensors[0].abs() ** 3),
                 naming="RuleBackward")


def test_hessian_never_prints_the_expected_matrix(capsys):
    x0 = torch.tensor([1.0, -2.0, 0.5])
    expected = torch.diag(12 * x0 ** 2) + torch.tensor([[0.0, 1, 0], [1, 0, 0], [0, 0, 0]])
    assert_right(capsys, checkers.hessian, lambda x: expected.clone(), x0)
    printed = assert_wrong(capsys, checkers.hessian, lambda x: torch.diag(12 * x ** 2), x0)
    assert "(0, 1), (1, 0)" in printed and "48" not in printed
    assert_wrong(capsys, checkers.hessian, lambda x: torch.zeros(3), x0)
    assert_wrong(capsys, checkers.hessian, lambda x: "H", x0)
