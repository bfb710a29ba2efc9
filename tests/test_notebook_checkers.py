"""The notebooks' exercise checkers: right answers pass; wrong ones (wrong only at a kink or a zero, a wrong type,
a wrong number of gradients) are called wrong with the full tt.check message and a hint; nothing crashes, and no
checker prints the values it expects."""
import functools
import importlib.util
import math
import re
from pathlib import Path

import pytest
import torch

import torchtrace as tt

_path = Path(__file__).resolve().parents[1] / "examples" / "notebooks" / "checkers.py"
_spec = importlib.util.spec_from_file_location("checkers", _path)
checkers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(checkers)
_training_spec = importlib.util.spec_from_file_location("lesson_training", _path.parents[2] / "tests" / "diagnose" /
                                                       "lesson_training.py")
lesson_training = importlib.util.module_from_spec(_training_spec)
_training_spec.loader.exec_module(lesson_training)


def _lesson_checkers(name: str):
    """Another checkers module of the notebooks' folder, loaded as a notebook imports it."""
    spec = importlib.util.spec_from_file_location(name, _path.parent / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


curvature_checkers, precision_checkers = _lesson_checkers("curvature_checkers"), _lesson_checkers("precision_checkers")


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


# ------------------------------------------------------------------ 00a


class Value:
    """The notebook's Value, with the exercises' methods added by each test."""

    def __init__(self, data, _prev=()):
        self.data, self.grad, self._prev = float(data), 0.0, _prev
        self._backward = lambda: None

    def _make(self, data, parents, backward):
        out = Value(data, parents)

        def _backward():
            backward(out)

        out._backward = _backward
        return out

    def __add__(self, other):
        other = other if isinstance(other, Value) else Value(other)

        def backward(out):
            self.grad += out.grad
            other.grad += out.grad
        return self._make(self.data + other.data, (self, other), backward)

    def __mul__(self, other):
        other = other if isinstance(other, Value) else Value(other)

        def backward(out):
            self.grad += other.data * out.grad
            other.grad += self.data * out.grad
        return self._make(self.data * other.data, (self, other), backward)

    __radd__, __rmul__ = __add__, __mul__

    def backward(self):
        order, seen, stack = [], set(), [(self, False)]
        while stack:
            node, done = stack.pop()
            if done:
                order.append(node)
            elif id(node) not in seen:
                seen.add(id(node))
                stack.append((node, True))
                stack.extend((child, False) for child in node._prev)
        self.grad = 1.0
        for node in reversed(order):
            node._backward()


def with_pow_exp(pow_backward, exp_backward):
    import math

    def value_pow(self, k):
        return self._make(self.data ** k, (self,), lambda out: pow_backward(self, k, out))

    def value_exp(self):
        return self._make(math.exp(self.data), (self,), lambda out: exp_backward(self, out))

    Value.__pow__, Value.exp = value_pow, value_exp
    return Value


def test_value_pow_and_exp(capsys):
    def right_pow(self, k, out):
        self.grad += k * self.data ** (k - 1) * out.grad

    def right_exp(self, out):
        self.grad += out.data * out.grad

    def assigning_exp(self, out):  # the accumulation bug: right unless the value is used twice
        self.grad = out.data * out.grad

    def pow_off_by_one(self, k, out):  # k x^k: right only at x = 0
        self.grad += k * self.data ** k * out.grad

    def not_done(*args):
        raise NotImplementedError

    assert_right(capsys, checkers.value_pow_exp, with_pow_exp(right_pow, right_exp))
    assert "(a used twice)" in assert_wrong(capsys, checkers.value_pow_exp, with_pow_exp(right_pow, assigning_exp))
    assert "a ** 3 at a = -1.5" in assert_wrong(capsys, checkers.value_pow_exp, with_pow_exp(pow_off_by_one, right_exp))
    assert verdict(capsys, checkers.value_pow_exp, with_pow_exp(not_done, not_done)).startswith("not done yet")


def test_value_sub_and_div(capsys):
    with_pow_exp(lambda self, k, out: setattr(self, "grad", self.grad + k * self.data ** (k - 1) * out.grad),
                 lambda self, out: None)
    Value.__sub__ = lambda self, other: self + (-1) * other
    Value.__truediv__ = lambda self, other: self * other ** -1
    assert_right(capsys, checkers.value_sub_div, Value)
    Value.__sub__ = lambda self, other: Value(self.data - other.data)  # the right number, but no graph
    assert "d/da, d/db differ" in assert_wrong(capsys, checkers.value_sub_div, Value)
    Value.__sub__ = lambda self, other: "a - b"
    assert "raised AttributeError" in assert_wrong(capsys, checkers.value_sub_div, Value)


# ------------------------------------------------------------------ 01a


def test_momentum_step(capsys):
    def right(params, velocities, lr, momentum):
        for p, v in zip(params, velocities):
            v.mul_(momentum).add_(p.grad)
            p -= lr * v

    def velocity_not_kept(params, velocities, lr, momentum):  # right on the first step only
        for p, v in zip(params, velocities):
            v = momentum * v + p.grad
            p -= lr * v

    assert_right(capsys, checkers.momentum_step, right)
    assert "after step 2" in assert_wrong(capsys, checkers.momentum_step, velocity_not_kept)
    assert_wrong(capsys, checkers.momentum_step, lambda params, velocities, lr, momentum: params[0].grad.zero_())
    assert_wrong(capsys, checkers.momentum_step, None)  # not even a function


def test_weight_decay_step(capsys):
    def right(params, lr, weight_decay):
        for p in params:
            p -= lr * (p.grad + weight_decay * p)

    def decay_after_the_step(params, lr, weight_decay):
        for p in params:
            p -= lr * p.grad
            p *= 1 - weight_decay

    assert_right(capsys, checkers.weight_decay_step, right)
    assert "after step 1" in assert_wrong(capsys, checkers.weight_decay_step, decay_after_the_step)


# ------------------------------------------------------------------ 06a


def test_jvp_by_hand(capsys):
    def right(f, x, v):
        xt = tt.tracer(x, requires_grad=True)
        y = f(xt)
        u = tt.zeros(y.shape, dtype=y.dtype, requires_grad=True)
        (g,) = tt.grad(y, xt, u, create_graph=True)
        (jv,) = tt.grad(g, u, v.to(y.dtype), allow_unused=True)
        return jv

    def transposed(f, x, v):  # J^T v: a VJP, with the shape of x (wrong shape and values)
        xt = tt.tracer(x, requires_grad=True)
        y = f(xt)
        return tt.grad(y, xt, torch.ones_like(y) * v.sum())[0]

    assert_right(capsys, checkers.jvp_by_hand, right)
    assert_wrong(capsys, checkers.jvp_by_hand, transposed)
    assert_wrong(capsys, checkers.jvp_by_hand, lambda f, x, v: "Jv")


def test_hvp_forward_over_reverse(capsys):
    def right(f, x, v):
        return tt.jvp(lambda t: tt.grad(f(t), t, create_graph=True)[0], (x,), (v,))[1]

    def gradient_only(f, x, v):
        xt = tt.tracer(x, requires_grad=True)
        return tt.grad(f(xt), xt)[0]

    assert_right(capsys, checkers.hvp_forward_over_reverse, right)
    assert_wrong(capsys, checkers.hvp_forward_over_reverse, gradient_only)


# ------------------------------------------------------------------ 00 and 01 (for their notebooks' checker cells)


def test_by_hand_numbers(capsys):
    a, b = 3.0, -2.0
    da, db = 2 * a * b + b * math.cos(a * b), a ** 2 + a * math.cos(a * b)
    assert_right(capsys, checkers.by_hand_numbers, a, b, da, db)
    printed = assert_wrong(capsys, checkers.by_hand_numbers, a, b, 2 * a * b, db)
    assert "dq/da differ" in printed and "cos" not in printed  # the hint names the paths, not the formula
    assert "dq/da and dq/db" in assert_wrong(capsys, checkers.by_hand_numbers, a, b, math.nan, math.nan)
    for wrong_type in ("-12", [da], True, torch.tensor([da]), torch.tensor(True)):
        assert_wrong(capsys, checkers.by_hand_numbers, a, b, wrong_type, db)


def test_tanh(capsys):
    def forward(ctx, x):
        y = torch.tanh(x)
        ctx.save_for_backward(y)
        return y

    assert_right(capsys, checkers.tanh, rule(forward, lambda ctx, g: g * (1 - ctx.saved_tensors[0] ** 2)))
    assert_wrong(capsys, checkers.tanh, rule(forward, lambda ctx, g: g * (1 - torch.tanh(ctx.saved_tensors[0]) ** 2)),
                 naming="RuleBackward")
    two_gradients = rule(forward, lambda ctx, g: (g * (1 - ctx.saved_tensors[0] ** 2), g))
    assert "incorrect number of gradients" in assert_wrong(capsys, checkers.tanh, two_gradients)
    assert verdict(capsys, checkers.tanh, rule(forward, not_done)).startswith("not done yet")


def test_central_slope(capsys):
    assert_right(capsys, checkers.central_slope, lambda f, x, h: (f(x + h) - f(x - h)) / (2 * h))
    assert_wrong(capsys, checkers.central_slope, lambda f, x, h: (f(x + h) - f(x)) / h)
    assert_wrong(capsys, checkers.central_slope, lambda f, x, h: (f(x + h) - f(x - h)) / h)  # the 2 forgotten
    assert_wrong(capsys, checkers.central_slope, lambda f, x, h: "slope")
    assert_wrong(capsys, checkers.central_slope, lambda f, x: f(x))  # the wrong arity
    assert_wrong(capsys, checkers.central_slope, lambda f, x, h: math.nan)
    # central, but with a step of its own instead of h: closer than asked, and not the formula the exercise wants
    assert_wrong(capsys, checkers.central_slope, lambda f, x, h: (f(x + 1e-5) - f(x - 1e-5)) / 2e-5)


def test_cube(capsys):
    forward = saving(lambda x: x ** 3)
    assert_right(capsys, checkers.cube, rule(forward, lambda ctx, g: g * 3 * ctx.saved_tensors[0] ** 2))
    assert_wrong(capsys, checkers.cube, rule(forward, lambda ctx, g: 3 * ctx.saved_tensors[0] ** 2),  # grad dropped
                 naming="RuleBackward")
    slope_one_at_zero = rule(forward, lambda ctx, g: g * (3 * ctx.saved_tensors[0] ** 2 + (ctx.saved_tensors[0] == 0)))
    assert_wrong(capsys, checkers.cube, slope_one_at_zero, naming="RuleBackward")  # wrong at x = 0 only
    assert "expected 1, got 2" in assert_wrong(capsys, checkers.cube, rule(forward, lambda ctx, g: (g, g)))
    assert "raised TypeError" in assert_wrong(capsys, checkers.cube, rule(lambda ctx: 1.0, lambda ctx, g: g))


def test_prediction_never_prints_the_gradient(capsys):
    assert_right(capsys, checkers.prediction, lambda x: 2 * x ** 3)
    printed = assert_wrong(capsys, checkers.prediction, lambda x: 4 * x ** 3)  # both factors differentiated
    assert "wrong at x = -1, 1, 2, 3\n" in printed and "54" not in printed and "16" not in printed
    assert_wrong(capsys, checkers.prediction, lambda x: 2 * x[:2] ** 3)
    assert "wrong at x = -1\n" in assert_wrong(capsys, checkers.prediction, lambda x: 2 * x.abs() ** 3)
    for wrong_type in (lambda x: None, lambda x: "2 x^3", lambda: 2.0, None):
        assert_wrong(capsys, checkers.prediction, wrong_type)


RULE_CHECKERS = [(checkers.tanh, ()), (checkers.cube, ()), (checkers.softplus, ()), (checkers.leaky, ()),
                 (checkers.mse, ()), (checkers.swish, ()), (checkers.sigmoid, (8,)), (checkers.quartic, ()),
                 (checkers.quartic_second_derivative, ()), (checkers.softplus_in_code, ())]


@pytest.mark.parametrize("check, rest", RULE_CHECKERS, ids=[c.__name__ for c, _ in RULE_CHECKERS])
def test_a_rule_checker_given_anything_but_a_rule_says_so(capsys, check, rest):
    forward = saving(lambda x: x ** 3)
    for not_a_rule in (None, "Cube", rule(forward, not_done).apply, 3.0):
        printed = assert_wrong(capsys, check, not_a_rule, *rest)
        assert "a class deriving from tt.Function" in printed, printed


# ------------------------------------------------------------------ 07


def softplus_rule(backward):
    """A Softplus rule (named so, with its math line) whose backward is `backward(x, g)`."""
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.nn.functional.softplus(x)

    return type("Softplus", (tt.Function,), {"__doc__": "y = log(1 + e^x)  ->  dy/dx = sigmoid(x)",
                                            "forward": staticmethod(forward),
                                            "backward": staticmethod(lambda ctx, g: backward(ctx.saved_tensors[0], g))})


def test_softplus_in_code(capsys):
    printed = verdict(capsys, checkers.softplus_in_code, softplus_rule(lambda x, g: g * torch.sigmoid(x)))
    assert printed.splitlines()[-1].startswith("right: run without torchtrace"), printed
    assert "    # Softplus: y = log(1 + e^x)  ->  dy/dx = sigmoid(x)\n    g3 = torch.sigmoid(t1)\n" in printed
    assert_wrong(capsys, checkers.softplus_in_code, softplus_rule(lambda x, g: g * torch.exp(x)),
                 naming="First diverging node: SoftplusBackward (Softplus.apply)")
    saturates_early = softplus_rule(lambda x, g: g * torch.sigmoid(x).clamp(max=0.99))  # wrong for large x only
    assert_wrong(capsys, checkers.softplus_in_code, saturates_early, naming="SoftplusBackward")
    frozen = softplus_rule(lambda x, g: g * torch.tensor(torch.sigmoid(x).tolist()))  # right here, frozen in the code
    assert "frozen into the code" in assert_wrong(capsys, checkers.softplus_in_code, frozen)
    two_gradients = softplus_rule(lambda x, g: (g * torch.sigmoid(x), g))
    assert "incorrect number of gradients" in assert_wrong(capsys, checkers.softplus_in_code, two_gradients)
    not_yet = softplus_rule(lambda x, g: not_done(None))
    assert verdict(capsys, checkers.softplus_in_code, not_yet).startswith("not done yet")


@pytest.fixture
def mlp():
    torch.manual_seed(0)
    model = tt.nn.Sequential(tt.nn.Linear(2, 3), tt.nn.Tanh(), tt.nn.Linear(3, 1))
    return model, torch.randn(4, 2)


def test_step_with_one_path(capsys, mlp):
    model, x = mlp

    def mse(x, target):
        return torch.nn.functional.mse_loss(model(x), target)

    def scaled_loss(x, target):
        loss = mse(x, target)
        return loss * 0.5 if loss.item() > 1 else loss

    def right(x, target):
        loss = mse(x, target)
        return torch.where(loss > 1, loss * 0.5, loss)

    def scaled_from_one_on(x, target):  # differs from the original only at a loss of exactly 1
        loss = mse(x, target)
        return torch.where(loss >= 1, loss * 0.5, loss)

    def scale_without_its_gradient(x, target):  # the right values; the scale's branch detached from the graph
        loss = mse(x, target)
        return torch.where(loss > 1, loss.detach() * 0.5, loss)

    def not_yet(x, target):
        raise NotImplementedError

    assert_right(capsys, checkers.step_with_one_path, right, scaled_loss, model, x)
    printed = assert_wrong(capsys, checkers.step_with_one_path, scaled_loss, scaled_loss, model, x)
    assert "took 2 paths" in printed  # Python still picks the torch calls
    assert "exactly 1" in assert_wrong(capsys, checkers.step_with_one_path, scaled_from_one_on, scaled_loss, model, x)
    printed = assert_wrong(capsys, checkers.step_with_one_path, scale_without_its_gradient, scaled_loss, model, x)
    assert "gradients of the model's parameters differ" in printed
    assert verdict(capsys, checkers.step_with_one_path, not_yet, scaled_loss, model, x).startswith("not done yet")
    for wrong_type in (None, lambda x: x, lambda x, target: mse(x, target).item()):
        assert_wrong(capsys, checkers.step_with_one_path, wrong_type, scaled_loss, model, x)


# ------------------------------------------------------------------ hints: one per mistake, never the solution


SOLUTIONS = sorted((_path.parent / "solutions").glob("*.ipynb"))


def solution_lines() -> set:
    """The worked solutions' code, whitespace removed and comments cut: every line (but the trivial ones), and every
    expression that a line assigns or returns (`p -= lr * v` gives `lr*v`...), where it looks like code."""
    import nbformat

    pieces = set()
    for path in SOLUTIONS:
        for cell in nbformat.read(path, as_version=4).cells:
            for line in cell.source.splitlines() if cell.cell_type == "code" else ():
                code = line.split("  #", 1)[0]
                squeezed = "".join(code.split())
                if len(squeezed) >= 12 and not squeezed.startswith(("def", "class", "@", "import", "from", "checkers")):
                    pieces.add(squeezed)
                for expression in re.split(r"\breturn\b|[-+*/]?=(?!=)", code)[1:]:
                    squeezed = "".join(expression.split())
                    if len(squeezed) >= 6 and re.search(r"[-+*/(\[]", squeezed):
                        pieces.add(squeezed)
    return pieces


# Code in a hint: an assignment or in-place update, a method call, the rule's ctx, an attribute .grad
CODE = re.compile(r"\w\s*[-+*/]=|\w+\.\w+\(|\bctx\.|\.grad\b")


def hint_of(capsys, check, *args) -> str:
    printed = assert_wrong(capsys, check, *args)
    return printed.split("\nhint: ", 1)[1].strip()


def backward_of(forward, slope, saved_is_output=False):
    """A rule whose backward returns slope(saved, grad), saving the output (or the input) of forward."""
    def save(ctx, x):
        y = forward(x)
        ctx.save_for_backward(y if saved_is_output else x)
        return y

    return rule(save, lambda ctx, g: slope(ctx.saved_tensors[0], g))


def cube_like(k):
    forward = lambda x: x ** k  # noqa: E731
    return {"upstream dropped": backward_of(forward, lambda x, g: k * x ** (k - 1)),
            "sign": backward_of(forward, lambda x, g: -g * k * x ** (k - 1)),
            "exponent not brought down": backward_of(forward, lambda x, g: g * x ** (k - 1)),
            "power not lowered": backward_of(forward, lambda x, g: g * k * x ** k),
            "not finite at zero": backward_of(forward, lambda x, g: g * k * x ** k / x),
            "two gradients": backward_of(forward, lambda x, g: (g * k * x ** (k - 1), g))}


def output_slope(function, slope_of_output):
    return {"upstream dropped": backward_of(function, lambda y, g: slope_of_output(y), True),
            "sign": backward_of(function, lambda y, g: -g * slope_of_output(y), True),
            "function applied to the output again": backward_of(function, lambda y, g: g * slope_of_output(function(y)),
                                                                True),
            "input used as the output": backward_of(function, lambda x, g: g * slope_of_output(x)),
            "twice the slope": backward_of(function, lambda y, g: 2 * g * slope_of_output(y), True)}


def leaky_rule(slope):
    def forward(ctx, x, s):
        ctx.save_for_backward(x)
        return torch.where(x > 0, x, s * x)

    return rule(forward, lambda ctx, g: slope(ctx.saved_tensors[0], g))


def mse_rule(gradients):
    def forward(ctx, p, t):
        ctx.save_for_backward(p, t)
        return ((p - t) ** 2).mean()

    return rule(forward, lambda ctx, g: gradients(*ctx.saved_tensors, g))


def value_with(pow_backward, exp_backward):
    """The shared test Value with these closures, made when the checker is about to run (it is one class)."""
    return lambda: with_pow_exp(pow_backward, exp_backward)


def right_exp(self, out):
    self.grad += out.data * out.grad


def right_pow(self, k, out):
    self.grad += k * self.data ** (k - 1) * out.grad


def value_sub(sub):
    with_pow_exp(right_pow, right_exp)
    Value.__sub__ = sub
    Value.__truediv__ = lambda self, other: self * other ** -1
    return Value


def momentum_update(body):
    def update(params, velocities, lr, momentum):
        for p, v in zip(params, velocities):
            body(p, v, lr, momentum)
    return update


def decay_update(body):
    def update(params, lr, weight_decay):
        for p in params:
            body(p, lr, weight_decay)
    return update


def training_step(reset="first", order=("backward", "step"), loss_of=lambda e: e.sum(dim=1).mean(), returns=True):
    """A student's train_step(model, optimizer, x, y), right with the defaults."""
    def step(model, optimizer, x, y):
        if reset == "first":
            optimizer.zero_grad()
        loss = loss_of((model(x) - y) ** 2)
        for part in order:
            if part == "backward":
                loss.backward()
            if part == "step":
                optimizer.step()
            if part == "backward" and reset == "between":
                optimizer.zero_grad()
        return loss if returns else None
    return step


def test_training_step(capsys):
    assert_right(capsys, checkers.training_step, training_step())
    assert_right(capsys, checkers.training_step, training_step(loss_of=lambda e: e.sum(dim=1).mean().item() * 0 + (
        e.sum(dim=1).mean())))  # the same loss, written otherwise
    assert verdict(capsys, checkers.training_step, lambda *args: not_done(None)).startswith("not done yet")


def wrong_answers(mlp_model, mlp_x):
    """checker -> (the arguments after the answer, {mistake: a wrong answer that makes it})."""
    sig = torch.sigmoid
    i0, i1 = torch.special.modified_bessel_i0, torch.special.modified_bessel_i1
    x0 = torch.tensor([1.0, -2.0, 0.5])
    diag = torch.diag(12 * x0 ** 2)
    a, b = 3.0, -2.0
    da, db = 2 * a * b + b * math.cos(a * b), a ** 2 + a * math.cos(a * b)
    model = mlp_model

    def mse_of(x, target):
        return torch.nn.functional.mse_loss(model(x), target)

    def scaled_loss(x, target):
        loss = mse_of(x, target)
        return loss * 0.5 if loss.item() > 1 else loss

    def compiled_step(choose):
        return lambda x, target: choose(mse_of(x, target))

    return {
        "tanh": (checkers.tanh, (), output_slope(torch.tanh, lambda y: 1 - y ** 2)),
        "sigmoid": (checkers.sigmoid, (8,), output_slope(torch.sigmoid, lambda y: y * (1 - y))),
        "cube": (checkers.cube, (), {**cube_like(3), "special case at zero": backward_of(
            lambda x: x ** 3, lambda x, g: g * (3 * x ** 2 + (x == 0)))}),
        "quartic": (checkers.quartic, (), cube_like(4)),
        "softplus": (checkers.softplus, (), {
            "only the inner exponential": backward_of(torch.nn.functional.softplus, lambda x, g: g * torch.exp(x)),
            "exponent's sign": backward_of(torch.nn.functional.softplus, lambda x, g: g * sig(-x)),
            "upstream dropped": backward_of(torch.nn.functional.softplus, lambda x, g: sig(x)),
            "sign": backward_of(torch.nn.functional.softplus, lambda x, g: -g * sig(x)),
            "NaN above x = 88.7": backward_of(torch.nn.functional.softplus,
                                              lambda x, g: g * torch.exp(x) / (1 + torch.exp(x)))}),
        "leaky": (checkers.leaky, (), {
            "slope 1 on both sides": leaky_rule(lambda x, g: (g, None)),
            "slopes swapped": leaky_rule(lambda x, g: (torch.where(x > 0, 0.1 * g, g), None)),
            "flat negative side": leaky_rule(lambda x, g: (torch.where(x > 0, g, 0 * g), None)),
            "slope 1 at the kink": leaky_rule(lambda x, g: (torch.where(x >= 0, g, 0.1 * g), None)),
            "no None for the number": leaky_rule(lambda x, g: torch.where(x > 0, g, 0.1 * g))}),
        "mse": (checkers.mse, (), {
            "no mean": mse_rule(lambda p, t, g: (g * 2 * (p - t), -g * 2 * (p - t))),
            "off by the batch size": mse_rule(lambda p, t, g: (g * 2 * (p - t) / len(p), -g * 2 * (p - t) / len(p))),
            "no 2": mse_rule(lambda p, t, g: (g * (p - t) / p.numel(), -g * (p - t) / p.numel())),
            "t with p's sign": mse_rule(lambda p, t, g: (g * 2 * (p - t) / p.numel(),) * 2),
            "no gradient for t": mse_rule(lambda p, t, g: (g * 2 * (p - t) / p.numel(), None)),
            "upstream dropped": mse_rule(lambda p, t, g: (2 * (p - t) / p.numel(), -2 * (p - t) / p.numel())),
            "sign": mse_rule(lambda p, t, g: (-g * 2 * (p - t) / p.numel(), g * 2 * (p - t) / p.numel()))}),
        "swish": (checkers.swish, (), {
            "only the term of x": backward_of(lambda x: x * sig(x), lambda x, g: g * sig(x)),
            "only the term of the sigmoid": backward_of(lambda x: x * sig(x),
                                                        lambda x, g: g * x * sig(x) * (1 - sig(x))),
            "upstream dropped": backward_of(lambda x: x * sig(x), lambda x, g: sig(x) + x * sig(x) * (1 - sig(x))),
            "sign": backward_of(lambda x: x * sig(x), lambda x, g: -g * (sig(x) + x * sig(x) * (1 - sig(x))))}),
        "bessel_i0": (checkers.bessel_i0, (), {
            "I0 for I1": backward_of(i0, lambda x, g: g * i0(x)).apply,
            "I1 made even": backward_of(i0, lambda x, g: g * i1(x.abs())).apply,
            "upstream dropped": backward_of(i0, lambda x, g: i1(x)).apply,
            "sign": backward_of(i0, lambda x, g: -g * i1(x)).apply}),
        "quartic_second_derivative": (checkers.quartic_second_derivative, (), {
            "detached": backward_of(lambda x: x ** 4, lambda x, g: g * 4 * x.detach() ** 3),
            "half recorded": backward_of(lambda x: x ** 4, lambda x, g: g * 4 * x * x.detach() ** 2),
            "first derivative wrong": backward_of(lambda x: x ** 4, lambda x, g: g * x ** 3),
            "zero": backward_of(lambda x: x ** 4, lambda x, g: 0 * g),
            "sign": backward_of(lambda x: x ** 4, lambda x, g: -g * 4 * x ** 3)}),
        "hessian": (checkers.hessian, (x0,), {
            "cross term missing": lambda x: diag.clone(), "nothing recorded": lambda x: torch.zeros(3, 3),
            "the gradient": lambda x: 4 * x ** 3, "first derivatives": lambda x: torch.diag(4 * x ** 3) + torch.tensor(
                [[0.0, 1, 0], [1, 0, 0], [0, 0, 0]])}),
        "by_hand_numbers": (checkers.by_hand_numbers, None, {
            "only the path through a^2 b": (a, b, 2 * a * b, a ** 2), "only the sine's path": (
                a, b, b * math.cos(a * b), a * math.cos(a * b)),
            "sine for cosine": (a, b, 2 * a * b + b * math.sin(a * b), a ** 2 + a * math.sin(a * b)),
            "minus cosine": (a, b, 2 * a * b - b * math.cos(a * b), a ** 2 - a * math.cos(a * b)),
            "inner factor dropped": (a, b, 2 * a * b + math.cos(a * b), a ** 2 + math.cos(a * b)),
            "swapped": (a, b, db, da), "zero": (a, b, 0.0, 0.0), "sign": (a, b, -da, -db)}),
        "central_slope": (checkers.central_slope, (), {
            "one-sided": lambda f, x, h: (f(x + h) - f(x)) / h,
            "the 2 forgotten": lambda f, x, h: (f(x + h) - f(x - h)) / h,
            "sign": lambda f, x, h: (f(x - h) - f(x + h)) / (2 * h),
            "a step of its own": lambda f, x, h: (f(x + 1e-5) - f(x - 1e-5)) / 2e-5}),
        "prediction": (checkers.prediction, (), {
            "both factors": lambda x: 4 * x ** 3, "chain rule dropped": lambda x: x ** 2,
            "constant dropped": lambda x: 2 * x, "sign": lambda x: -2 * x ** 3, "even": lambda x: 2 * x.abs() ** 3}),
        "value_pow_exp": (checkers.value_pow_exp, (), {
            "assigning": value_with(right_pow, lambda self, out: setattr(self, "grad", out.data * out.grad)),
            "power not lowered": value_with(lambda self, k, out: setattr(
                self, "grad", self.grad + k * self.data ** k * out.grad), right_exp),
            "exponent not brought down": value_with(lambda self, k, out: setattr(
                self, "grad", self.grad + self.data ** (k - 1) * out.grad), right_exp),
            "upstream dropped": value_with(lambda self, k, out: setattr(
                self, "grad", self.grad + k * self.data ** (k - 1)), right_exp),
            "input's value for e^x": value_with(right_pow, lambda self, out: setattr(
                self, "grad", self.grad + self.data * out.grad))}),
        "value_sub_div": (checkers.value_sub_div, (), {
            "no graph": lambda: value_sub(lambda self, other: Value(self.data - other.data)),
            "wrong value": lambda: value_sub(lambda self, other: self + other)}),
        "momentum_step": (checkers.momentum_step, (), {
            "velocity not kept": momentum_update(lambda p, v, lr, m: p.sub_(lr * (m * v + p.grad))),
            "velocity does not fade": momentum_update(lambda p, v, lr, m: (v.add_(p.grad), p.sub_(lr * v))),
            "averaged": momentum_update(lambda p, v, lr, m: (v.mul_(m).add_((1 - m) * p.grad), p.sub_(lr * v))),
            "uphill": momentum_update(lambda p, v, lr, m: (v.mul_(m).add_(p.grad), p.add_(lr * v))),
            "stale velocity": momentum_update(lambda p, v, lr, m: (p.sub_(lr * v), v.mul_(m).add_(p.grad))),
            "nothing moves": momentum_update(lambda p, v, lr, m: v.mul_(m).add_(p.grad))}),
        "weight_decay_step": (checkers.weight_decay_step, (), {
            "shrunk after the step": decay_update(lambda p, lr, wd: (p.sub_(lr * p.grad), p.mul_(1 - wd))),
            "decoupled": decay_update(lambda p, lr, wd: (p.sub_(lr * p.grad), p.mul_(1 - lr * wd))),
            "no decay": decay_update(lambda p, lr, wd: p.sub_(lr * p.grad)),
            "away from zero": decay_update(lambda p, lr, wd: p.sub_(lr * (p.grad - wd * p))),
            "decay not scaled": decay_update(lambda p, lr, wd: p.sub_(lr * p.grad + wd * p)),
            "nothing moves": decay_update(lambda p, lr, wd: None)}),
        "jvp_by_hand": (checkers.jvp_by_hand, (), {
            "transposed": lambda f, x, v: torch.func.vjp(f, x)[1](v)[0],
            "tangent ignored": lambda f, x, v: torch.func.vjp(f, x)[1](torch.ones_like(f(x)))[0],
            "nothing recorded": lambda f, x, v: torch.zeros_like(f(x))}),
        "hvp_forward_over_reverse": (checkers.hvp_forward_over_reverse, (), {
            "the gradient": lambda f, x, v: torch.func.grad(f)(x), "nothing recorded": lambda f, x, v: 0 * x,
            "f's own directional derivative": lambda f, x, v: torch.func.jvp(f, (x,), (v,))[1]}),
        "softplus_in_code": (checkers.softplus_in_code, (), {
            "only the inner exponential": softplus_rule(lambda x, g: g * torch.exp(x)),
            "exponent's sign": softplus_rule(lambda x, g: g * torch.sigmoid(-x)),
            "frozen into the code": softplus_rule(lambda x, g: g * torch.tensor(torch.sigmoid(x).tolist()))}),
        "step_with_one_path": (checkers.step_with_one_path, (scaled_loss, model, mlp_x), {
            "still guarded": scaled_loss,
            "not strict": compiled_step(lambda loss: torch.where(loss >= 1, loss * 0.5, loss)),
            "detached": compiled_step(lambda loss: torch.where(loss > 1, loss.detach() * 0.5, loss)),
            "other values": compiled_step(lambda loss: torch.where(loss > 1, loss * 2, loss)),
            "zero": compiled_step(lambda loss: 0 * loss),
            "sign": compiled_step(lambda loss: -torch.where(loss > 1, loss * 0.5, loss))}),
        "training_step": (checkers.training_step, (), {
            "zero_grad forgotten": training_step(reset=None),
            "reset between backward and step": training_step(reset="between"),
            "step before backward": training_step(order=("step", "backward")),
            "axes swapped": training_step(loss_of=lambda e: e.sum(dim=0).mean()),
            "averaged over the outputs": training_step(loss_of=lambda e: e.mean()),
            "the loss not returned": training_step(returns=False)}),
        **lesson_08_wrong_answers(),
    }


CHECKED = ["tanh", "sigmoid", "cube", "quartic", "softplus", "leaky", "mse", "swish", "bessel_i0",
           "quartic_second_derivative", "hessian", "by_hand_numbers", "central_slope", "prediction", "value_pow_exp",
           "value_sub_div", "momentum_step", "weight_decay_step", "jvp_by_hand", "hvp_forward_over_reverse",
           "softplus_in_code", "step_with_one_path", "found_the_nan", "dead_layer", "detached_branch", "learning_rate",
           "bf16_step", "repaired_rule", "training_step"]


# checkers.py's checkers fed their wrong answers outside the table below: lesson 08's standardisation exercise
# (tests/diagnose/test_lesson_checkers.py, with the doctor's models) and lesson 04's vanishing layer, whose answer is
# a number (test_vanishing_layer_answers_of_any_type)
FED_MISTAKES_ELSEWHERE = {"vanishing_layer", "standardised"}


def test_every_checker_of_the_notebooks_is_fed_mistakes():
    import nbformat

    used = {name for path in sorted(_path.parent.glob("*.ipynb")) for cell in nbformat.read(path, 4).cells
            for name in re.findall(r"(?<!\w)checkers\.(\w+)\(", cell.source)}  # checkers.py's, not the lessons' own
    assert used - FED_MISTAKES_ELSEWHERE <= set(CHECKED), used - set(CHECKED)


@pytest.mark.parametrize("name", CHECKED)
def test_each_mistake_gets_its_own_hint_and_no_hint_gives_the_solution(capsys, mlp, name):
    check, rest, answers = wrong_answers(*mlp)[name]
    forbidden = solution_lines()
    assert len(forbidden) > 50
    hints = {}
    for mistake, answer in answers.items():
        answer = answer() if name.startswith("value_") else answer  # the one Value class, set up for this answer
        args = answer if rest is None else (answer, *rest)
        hint = hint_of(capsys, check, *args)
        squeezed = "".join(hint.split())
        leaked = [piece for piece in forbidden if piece in squeezed]
        assert not leaked, f"{name}, {mistake}: the hint gives the solution's code {leaked[0]!r}: {hint}"
        assert not CODE.search(hint), f"{name}, {mistake}: the hint writes code: {hint}"
        hints[mistake] = hint
    same = [(m, n) for m in hints for n in hints if m < n and hints[m] == hints[n]]
    assert not same, f"{name}: {same[0]} get the same hint: {hints[same[0][0]]}"


def test_vanishing_layer_hints_tell_the_side(capsys, broken):
    hints = {hint_of(capsys, checkers.vanishing_layer, answer, broken) for answer in (4, 8, 7, "6")}
    assert len(hints) == 4


# ------------------------------------------------------------------ 08 (small equivalents of the notebook's setup)


@functools.lru_cache(maxsize=None)
def lesson_08():
    """The objects notebook 08's exercises pass to their checkers, built the same way on random data."""
    F = torch.nn.functional
    torch.manual_seed(0)
    x, y = torch.randn(256, 64), torch.randint(0, 10, (256,))

    def mlp(seed=0):
        torch.manual_seed(seed)
        return tt.port(torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32),
                                           torch.nn.ReLU(), torch.nn.Linear(32, 10)))

    def mystery_loss():
        logits = mlp(3)(x) * 200
        return (torch.log(1 + torch.exp(logits)) - logits.gather(1, y[:, None])).mean()

    torch.manual_seed(4)
    deep_net = tt.port(torch.nn.Sequential(*[m for _ in range(5) for m in (torch.nn.Linear(64, 64), torch.nn.ReLU())],
                                           torch.nn.Linear(64, 10)))
    with torch.no_grad():
        deep_net[4].bias.fill_(-30.0)

    class TwoBranches(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.features, self.gate = torch.nn.Linear(64, 32), torch.nn.Linear(64, 32)
            self.head = torch.nn.Linear(32, 10)

        def forward(self, inputs):
            return self.head(torch.relu(self.features(inputs)) * torch.sigmoid(self.gate(inputs)).detach())

    torch.manual_seed(0)
    repaired = tt.port(TwoBranches())

    def train(lr):
        return lesson_training.train_watched(mlp(), x, y, lr, steps=15)

    torch.manual_seed(0)
    small = tt.port(torch.nn.Sequential(torch.nn.Linear(64, 16), torch.nn.Tanh(), torch.nn.Linear(16, 10)))

    def float32_loss():
        return F.cross_entropy(small(x), y)

    def bfloat16_loss():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return F.cross_entropy(small(x).float(), y)

    return dict(x=x, y=y, mystery_loss=mystery_loss, deep_net=deep_net,
                deep_loss=lambda: F.cross_entropy(deep_net(x), y), repaired=repaired, train=train,
                float32_loss=float32_loss, bfloat16_loss=bfloat16_loss)


def two_branches_loss(gate):
    """A repair of TwoBranches' forward whose gate's weights are gate(model, inputs)."""
    def forward(inputs):
        m, y = lesson_08()["repaired"], lesson_08()["y"]
        return torch.nn.functional.cross_entropy(m.head(torch.relu(m.features(inputs)) * gate(m, inputs)), y)
    return forward


def gelu_tanh_rule(slope):
    """A TanhGelu rule whose backward is grad * slope(x)."""
    return backward_of(lambda a: torch.nn.functional.gelu(a, approximate="tanh"), lambda a, g: g * slope(a))


def gelu_tanh_parts(a):
    c, k = math.sqrt(2 / math.pi), 0.044715
    t = torch.tanh(c * (a + k * a ** 3))
    return 0.5 * (1 + t), t, c * (1 + 3 * k * a ** 2)


def lesson_08_wrong_answers():
    lesson = lesson_08()
    phi = lambda a: gelu_tanh_parts(a)[0]  # noqa: E731
    dphi = lambda a: 0.5 * (1 - gelu_tanh_parts(a)[1] ** 2) * gelu_tanh_parts(a)[2]  # noqa: E731
    whole = lambda a: phi(a) + a * dphi(a)  # noqa: E731
    exact = lambda a: 0.5 * (1 + torch.erf(a / math.sqrt(2))) + a * torch.exp(-a ** 2 / 2) / math.sqrt(  # noqa: E731
        2 * math.pi)
    repaired = lesson["repaired"]
    right_branches = two_branches_loss(lambda m, a: torch.sigmoid(m.gate(a)))
    first_bf16 = tt.diff(lesson["float32_loss"], lesson["bfloat16_loss"], rtol=3e-3).first.rule
    return {
        "found_the_nan": (checkers.found_the_nan, (lesson["mystery_loss"],), {
            "a rule that only received the NaN": "Log", "the loss itself": "Mean", "a rule with finite values": "Mul",
            "a rule that never ran": "Sqrt", "not a name": 3}),
        "dead_layer": (checkers.dead_layer, (lesson["deep_net"], lesson["deep_loss"]), {
            "the linear layer that causes it": 4, "a healthy ReLU": 3, "another linear layer": 0,
            "out of range": 42, "not an int": "5"}),
        "detached_branch": (checkers.detached_branch, (lesson["repaired"], lesson["x"], lesson["y"]), {
            "still detached": two_branches_loss(lambda m, a: torch.sigmoid(m.gate(a)).detach()),
            "cut by a Python number": two_branches_loss(lambda m, a: torch.sigmoid(m.gate(a)).mean().item()),
            "other values": two_branches_loss(lambda m, a: torch.sigmoid(m.gate(a)) * 2),
            "the logits": lambda a: repaired.head(torch.relu(repaired.features(a)) * torch.sigmoid(repaired.gate(a))),
            "zero": lambda a: 0 * right_branches(a), "sign": lambda a: -right_branches(a)}),
        "learning_rate": (checkers.learning_rate, (lesson["train"],), {
            "too large": 50.0, "barely moves the loss": 1e-6, "ascent": -0.1, "zero": 0, "not a number": "0.1"}),
        "bf16_step": (checkers.bf16_step, (lesson["float32_loss"], lesson["bfloat16_loss"], 3e-3), {
            "after the first divergence": "Tanh", "never differs": "CrossEntropy", "never runs": "Relu",
            "not a name": 2, "empty": "", "spelled otherwise": first_bf16.lower()}),
        "repaired_rule": (checkers.repaired_rule, (), {
            "Φ only": gelu_tanh_rule(phi), "x Φ' only": gelu_tanh_rule(lambda a: a * dphi(a)),
            "inner slope dropped": gelu_tanh_rule(
                lambda a: phi(a) + a * 0.5 * (1 - gelu_tanh_parts(a)[1] ** 2)),
            "tanh's slope": gelu_tanh_rule(lambda a: phi(a) + a * 0.5 * (1 - gelu_tanh_parts(a)[1]) * gelu_tanh_parts(
                a)[2]),
            "cubic term's slope dropped": gelu_tanh_rule(
                lambda a: phi(a) + a * 0.5 * (1 - gelu_tanh_parts(a)[1] ** 2) * math.sqrt(2 / math.pi)),
            "c dropped from u's slope": gelu_tanh_rule(
                lambda a: phi(a) + a * 0.5 * (1 - gelu_tanh_parts(a)[1] ** 2) * (1 + 3 * 0.044715 * a ** 2)),
            "the exact GELU's slope": gelu_tanh_rule(exact),
            "sign": gelu_tanh_rule(lambda a: -whole(a)),
            "upstream dropped": backward_of(lambda a: torch.nn.functional.gelu(a, approximate="tanh"),
                                            lambda a, g: whole(a))}),
    }


def test_lesson_08_right_answers_pass(capsys):
    lesson = lesson_08()
    assert_right(capsys, checkers.found_the_nan, "Exp", lesson["mystery_loss"])
    assert_right(capsys, checkers.dead_layer, 5, lesson["deep_net"], lesson["deep_loss"])
    assert_right(capsys, checkers.detached_branch, two_branches_loss(lambda m, a: torch.sigmoid(m.gate(a))),
                 lesson["repaired"], lesson["x"], lesson["y"])
    assert_right(capsys, checkers.learning_rate, 0.1, lesson["train"])
    first = tt.diff(lesson["float32_loss"], lesson["bfloat16_loss"], rtol=3e-3).first.rule
    assert_right(capsys, checkers.bf16_step, first, lesson["float32_loss"], lesson["bfloat16_loss"], 3e-3)
    phi, t, du = (lambda a: gelu_tanh_parts(a)[0]), (lambda a: gelu_tanh_parts(a)[1]), (lambda a: gelu_tanh_parts(a)[2])
    assert_right(capsys, checkers.repaired_rule, gelu_tanh_rule(lambda a: phi(a) + a * 0.5 * (1 - t(a) ** 2) * du(a)))
    assert verdict(capsys, checkers.found_the_nan, None, lesson["mystery_loss"]).startswith("not done yet")
    unfinished = two_branches_loss(lambda m, a: not_done(None))
    assert verdict(capsys, checkers.detached_branch, unfinished, lesson["repaired"], lesson["x"],
                   lesson["y"]).startswith("not done yet")


# A zero answer, a sign error, an answer that only looks right (lr = 1e-6 moves the loss by 1e-6, a sigmoid written
# with e^x is NaN above x = 88.7) and a forgotten inner factor each get a hint of their own.
OWN_HINTS = [
    ("by_hand_numbers", "zero", "your answer is zero"), ("by_hand_numbers", "sign", "opposite sign"),
    ("quartic_second_derivative", "zero", "yours returns zero"),
    ("quartic_second_derivative", "sign", "a minus sign too many"),
    ("step_with_one_path", "zero", "your step returns zero"), ("step_with_one_path", "sign", "negated"),
    ("detached_branch", "the logits", "scores (logits)"), ("detached_branch", "zero", "a zero loss"),
    ("detached_branch", "sign", "a step uphill"),
    ("learning_rate", "zero", "the weights never move"), ("learning_rate", "ascent", "gradient ascent"),
    ("learning_rate", "barely moves the loss", "too small"),
    ("bf16_step", "empty", "read the first rule it reports"), ("bf16_step", "spelled otherwise", "spelled otherwise"),
    ("softplus", "NaN above x = 88.7", "not a number (inf or NaN) at some edge points"),
    ("repaired_rule", "cubic term's slope dropped", "cubic term"),
    ("repaired_rule", "c dropped from u's slope", "the constant c in front of u"),
    ("training_step", "zero_grad forgotten", "without a reset"), ("training_step", "axes swapped", "axes are swapped"),
    ("training_step", "reset between backward and step", "never move"),
    ("training_step", "step before backward", "never move"), ("training_step", "averaged over the outputs", "too"),
]


@pytest.mark.parametrize("name, mistake, phrase", OWN_HINTS, ids=[f"{n}: {m}" for n, m, _ in OWN_HINTS])
def test_a_mistake_that_looked_alike_gets_its_own_hint(capsys, mlp, name, mistake, phrase):
    check, rest, answers = wrong_answers(*mlp)[name]
    answer = answers[mistake]
    assert phrase in hint_of(capsys, check, *(answer if rest is None else (answer, *rest)))


def test_a_learning_rate_that_barely_moves_the_loss_is_too_small(capsys):
    train = lesson_08()["train"]
    losses = train(1e-4)[1]
    assert losses[-1] < losses[0]  # it moves, by a few millionths: "the loss went down" is not enough
    printed = assert_wrong(capsys, checkers.learning_rate, 1e-4, train)
    assert "too small to train" in printed


def test_a_wrong_rule_is_located_in_the_students_code_not_in_the_checker(capsys, mlp):
    answers = wrong_answers(*mlp)["repaired_rule"][2]
    printed = assert_wrong(capsys, checkers.repaired_rule, answers["Φ only"])
    assert "the first wrong step (tt.diff): " in printed and "Rule.backward, test_notebook_checkers.py:" in printed
    assert not re.search(r"(?<![\w_])checkers\.py", printed), printed


# ------------------------------------------------------------------ a right answer in another form, a wrong one named


def _standardise_in_float64(biased: bool = True, eps: float = 1e-5):
    def standardise(h):
        h = h.double()
        return (h - h.mean(-1, keepdim=True)) / (h.var(-1, keepdim=True, unbiased=not biased) + eps).sqrt()
    return standardise


def test_standardised_compares_a_float64_answer_in_float64(capsys):
    assert_right(capsys, checkers.standardised, _standardise_in_float64())
    assert "n - 1" in assert_wrong(capsys, checkers.standardised, _standardise_in_float64(biased=False))
    assert "gives NaN" in assert_wrong(capsys, checkers.standardised, _standardise_in_float64(eps=0.0))


def _newton(f, theta):
    return theta - torch.linalg.solve(torch.func.hessian(f)(theta), torch.func.grad(f)(theta))


def test_newton_step_of_another_shape_is_told_its_shape(capsys):
    printed = assert_wrong(capsys, curvature_checkers.newton_step, lambda f, t: _newton(f, t)[None])
    assert "your step has shape (1, 2); Newton's step has shape (2,)" in printed
    assert "arranged in another shape" in printed
    printed = assert_wrong(capsys, curvature_checkers.newton_step, lambda f, t: (t - torch.func.grad(f)(t))[:, None])
    assert "your step has shape (2, 1)" in printed and "arranged in another shape" not in printed
    assert verdict(capsys, curvature_checkers.newton_step, _newton) == "right\n"


def test_stable_learning_rate_of_several_numbers_is_told_to_return_one(capsys):
    printed = assert_wrong(capsys, curvature_checkers.stable_learning_rate, lambda H: 2 / torch.linalg.eigvalsh(H))
    assert "return one number" in printed and "a threshold of its own" in printed
    printed = assert_wrong(capsys, curvature_checkers.stable_learning_rate, lambda H: H.sum(dim=0))
    assert "return one number" in printed and "a threshold of its own" not in printed


SCALES = (12, [3, 4, 9], 1024.0, 3)


def test_scale_trajectory_in_any_container_of_numbers(capsys):
    np = pytest.importorskip("numpy")
    truth = precision_checkers._torch_scales(*SCALES)
    for answer in (truth, tuple(truth), np.array(truth), torch.tensor(truth), [torch.tensor(s) for s in truth],
                   [np.float32(s) for s in truth]):
        assert verdict(capsys, precision_checkers.scale_trajectory, answer, *SCALES) == "right\n", type(answer)
    late = precision_checkers._scales(*SCALES, after_update=True)
    for answer in (np.array(late), torch.tensor(late), [torch.tensor(s) for s in late]):
        assert "before scaler.update()" in verdict(capsys, precision_checkers.scale_trajectory, answer, *SCALES)
    for answer in (torch.tensor([truth]), ["1024"] * 12, torch.tensor(1024.0), [True] * 12):
        assert "give a list of 12 numbers" in verdict(capsys, precision_checkers.scale_trajectory, answer, *SCALES)
    assert "not 11" in verdict(capsys, precision_checkers.scale_trajectory, torch.tensor(truth[:-1]), *SCALES)


def test_by_hand_numbers_as_0d_tensors(capsys):
    np = pytest.importorskip("numpy")
    a, b = 1.5, -0.7
    da, db = 2 * a * b + b * math.cos(a * b), a ** 2 + a * math.cos(a * b)
    assert_right(capsys, checkers.by_hand_numbers, a, b, torch.tensor(da), torch.tensor(db))
    assert_right(capsys, checkers.by_hand_numbers, a, b, np.array(da), np.float32(db))
    printed = assert_wrong(capsys, checkers.by_hand_numbers, a, b, torch.tensor(db), torch.tensor(da))
    assert "swapped" in printed


def test_float32s_largest_is_not_named_bfloat16s(capsys):
    printed = verdict(capsys, precision_checkers.largest_float16, torch.finfo(torch.float32).max)
    assert printed.startswith("wrong") and "float32's largest" in printed and "bfloat16" not in printed, printed
    for bfloat16s in (torch.finfo(torch.bfloat16).max, 3.4e38):
        assert "bfloat16's largest" in verdict(capsys, precision_checkers.largest_float16, bfloat16s)
