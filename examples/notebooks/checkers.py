"""The exercise checkers of the teaching notebooks (`import checkers` in a notebook of this folder).

Each prints `right`, `not done yet`, or `wrong` with what went wrong: tt.check's whole message (which gradient
differs and the first diverging node, named after your rule) and a hint. They test the points where rules usually
fail on purpose (kinks, zeros, saturation), never print the values they expect, and treat an exception in your code
(a wrong type, a wrong number of gradients) as a wrong answer, not a crash.

The hint depends on the mistake: each checker compares a wrong answer with what the exercise's common mistakes
(a flipped sign, a forgotten upstream gradient or factor, `=` where `+=` accumulates, a state that is not kept, ...)
would give, and names the idea behind the first one that explains it; never the code to write.
"""
import functools
import inspect
import math
import numbers
import os
import statistics
import warnings
from typing import Any, Callable, Dict, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F

import torchtrace as tt

Inputs = Sequence[torch.Tensor]
Gradients = Sequence[Optional[torch.Tensor]]
# A common mistake: the gradients (or values) it would give, computed from what the checker probes with, and its hint.
Mistake = Tuple[Callable[..., Any], str]

UPSTREAM = "the chain rule multiplies your local derivative by the gradient that arrives from above (the backward's " \
           "argument): your gradient is the local slope alone"
SIGN = "your gradient has the opposite sign everywhere: where the function rises its slope is positive"
FACTOR = "your gradient has the right shape but is off by the same factor everywhere: a constant of the derivative " \
         "is missing or extra"
COUNT = "backward returns one gradient for each argument of forward, in the same order (None for an argument " \
        "that is not a tensor)"
ALREADY_THE_OUTPUT = "the tensor you saved is already the output: write the slope with it directly, without " \
                     "applying the function to it a second time"
INPUT_FOR_OUTPUT = "the slope written through the output needs the output, but you used the input: save the output " \
                   "in forward (or compute it from the saved input)"
ZERO = "your answer is zero: nothing has been computed yet, or every contribution cancelled; follow the value from " \
       "the output back to each input and multiply the local slopes along the way"
NOT_FINITE = "your gradient is right at ordinary points but not a number (inf or NaN) at some edge points: avoid " \
             "dividing by what can be zero, and exponentials that overflow where the function saturates"


def _wrong(what: str, hint: str) -> None:
    print(f"wrong: {what}\nhint: {hint}")


def _explain(error: Exception) -> str:
    if isinstance(error, tt.GradientMismatch):
        return f"your gradient differs from the reference\n{str(error).strip()}"
    return f"your code raised {type(error).__name__}: {str(error).strip()}"


def _plain(t: torch.Tensor) -> torch.Tensor:
    return t.detach().as_subclass(torch.Tensor)


def _takes_rule(check: Callable) -> Callable:
    """A checker whose first argument is the student's rule: anything but a tt.Function subclass is a wrong answer."""
    @functools.wraps(check)
    def checked(rule: Any, *args: Any) -> Any:
        if not (isinstance(rule, type) and issubclass(rule, tt.Function)):
            return _wrong(f"expected your rule, a class deriving from tt.Function; got a {type(rule).__name__}",
                          "pass the class itself (MyRule), not an instance, MyRule.apply or its result")
        return check(rule, *args)
    return checked


def _same_gradients(fn: Callable, reference: Callable, inputs: Inputs, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    """fn's torchtrace gradients against reference's torch autograd gradients (raises tt.GradientMismatch)."""
    ours = [tt.tracer(x, requires_grad=True) for x in inputs]
    theirs = [x.detach().clone().requires_grad_(True) for x in inputs]
    weight = torch.randn(reference(*theirs).shape, generator=torch.Generator().manual_seed(0))
    (fn(*ours) * weight).sum().backward()
    (reference(*theirs) * weight).sum().backward()
    for i, (a, b) in enumerate(zip(ours, theirs)):
        got = a.grad if a.grad is not None else torch.zeros_like(b)
        differs = ~torch.isclose(_plain(got).double(), b.grad.double(), rtol=rtol, atol=atol, equal_nan=True)
        if differs.any():
            where = ", ".join(f"{v:g}" for v in _plain(a).flatten()[differs.flatten()][:4])  # NaN included
            raise tt.GradientMismatch(f"gradient of input {i} differs from torch's convention at x = {where}")


def _close(a: Any, b: Any) -> bool:
    """Same shape and values (float64, NaN never equal); False for anything that is not a tensor of numbers."""
    try:
        a, b = _plain(torch.as_tensor(a)).double(), _plain(torch.as_tensor(b)).double()
    except (TypeError, ValueError, RuntimeError):
        return False
    return a.shape == b.shape and bool(torch.isfinite(a).all()) and torch.allclose(a, b, rtol=1e-4, atol=1e-7)


def _all_close(got: Gradients, expected: Gradients) -> bool:
    return len(got) == len(expected) and all(
        (g is None) == (e is None) and (g is None or _close(g, e)) for g, e in zip(got, expected))


def _matching(got: Any, mistakes: Sequence[Mistake], *probe: Any) -> Optional[str]:
    """The hint of the first mistake whose result at `probe` equals `got` (None: no known mistake explains it)."""
    for result, hint in mistakes:
        try:
            if _all_close(got, result(*probe)):
                return hint
        except Exception:  # a mistake that cannot even be computed at this probe explains nothing
            continue
    return None


def _gradients(fn: Callable, inputs: Inputs, weight: Optional[torch.Tensor], torch_autograd: bool) -> list:
    """d (fn(*inputs) * weight).sum() / d inputs: torchtrace's through tracers, or torch autograd's."""
    leaves = [x.detach().clone().requires_grad_() if torch_autograd else tt.tracer(x.detach(), requires_grad=True)
              for x in inputs]
    out = fn(*leaves)
    (out * (weight if weight is not None else torch.ones(()))).sum().backward()
    return [None if x.grad is None else _plain(x.grad) for x in leaves]


def _factor(got: Gradients, expected: Gradients) -> bool:
    """Whether got = c * expected for one constant c other than 1 and -1."""
    pairs = [(_plain(g).double(), _plain(e).double()) for g, e in zip(got, expected) if g is not None and e is not None]
    ratios = torch.cat([(g / e)[e.abs() > 1e-6].flatten() for g, e in pairs]) if pairs else torch.zeros(0)
    if not len(ratios) or not torch.isfinite(ratios).all():
        return False
    c = ratios[0]
    return bool(torch.allclose(ratios, c.expand_as(ratios), rtol=1e-4)) and abs(abs(c.item()) - 1) > 1e-3 and c != 0


def rule_hint(fn: Callable, reference: Callable, shapes: Sequence[Tuple[int, ...]], general: str,
              mistakes: Sequence[Mistake] = (), edges: Sequence[Inputs] = (), edge_hint: Optional[str] = None) -> str:
    """The hint for a rule that fails: the student's gradients of fn at random inputs of these shapes (with an
    upstream gradient that is not all ones) against the reference's, explained by the first common mistake that
    gives them. Right there but wrong at `edges`: NOT_FINITE when not finite there, else `edge_hint` (a kink's
    convention). Its random numbers come from a generator of its own: the checks' draws stay as they were."""
    generator = torch.Generator().manual_seed(0)
    probe = [torch.randn(shape, dtype=torch.float64, generator=generator) for shape in shapes]  # edges keep float32
    weight = 0.5 + torch.rand(reference(*probe).shape, dtype=torch.float64, generator=generator)
    try:
        got = _gradients(fn, probe, weight, torch_autograd=False)
    except Exception as error:
        return COUNT if "number of gradients" in str(error) else general
    expected = _gradients(reference, probe, weight, torch_autograd=True)
    if _all_close(got, expected):
        for points in edges:
            try:
                at_edge = _gradients(fn, points, None, torch_autograd=False)
            except Exception:
                return general
            if not _all_close(at_edge, _gradients(reference, points, None, torch_autograd=True)):
                finite = all(g is None or bool(torch.isfinite(g).all()) for g in at_edge)
                return (edge_hint or general) if finite else NOT_FINITE
        return general
    common = [(lambda: _gradients(reference, probe, None, torch_autograd=True), UPSTREAM),
              (lambda: [None if e is None else -e for e in expected], SIGN)]
    return (_matching(got, common) or _matching(got, mistakes, *probe, weight)
            or (FACTOR if _factor(got, expected) else general))


def check_rule(fn: Callable, inputs: Inputs, hint: Union[str, Callable[[], str]], edges: Sequence[Inputs] = (),
               reference: Optional[Callable] = None, far: Sequence[Inputs] = ()) -> bool:
    """tt.check of fn at `inputs` and at every tuple of `edges`; `reference`: the same math in torch, whose gradient
    fixes the convention at kinks (tt.check alone compares your backward with your own forward) and is the only
    judge at the points of `far` (where a textbook forward overflows, so torch autograd of your own forward cannot
    be). `hint`: a text, or a function that finds the one for this mistake (called only when the answer is wrong).
    True when right."""
    try:
        report = tt.check(fn, *inputs, check_inputs=list(edges))
        for points in [*edges, *far] if reference is not None else ():
            _same_gradients(fn, reference, points)
    except NotImplementedError:
        print("not done yet: fill in the exercise above")
    except Exception as error:
        _wrong(_explain(error), hint() if callable(hint) else hint)
    else:
        print(f"right: the gradients match torch autograd ({report.n_gradients} gradients, "
              f"{1 + len(edges) + len(far)} sets of points including the edge cases)")
        return True
    return False


def check_by_finite_differences(fn: Callable, inputs: Inputs, hint: Union[str, Callable[[], str]],
                                edges: Sequence[Inputs] = ()) -> None:
    """For an op torch cannot differentiate: tt.gradcheck (central differences, float64) at inputs and edges."""
    try:
        for points in [inputs, *edges]:
            tt.gradcheck(fn, *[x.double() for x in points])
    except NotImplementedError:
        print("not done yet: fill in the exercise above")
    except Exception as error:
        _wrong(_explain(error), hint() if callable(hint) else hint)
    else:
        print(f"right: the gradients match finite differences ({1 + len(edges)} sets of points including the edges)")


# ------------------------------------------------------------------------- 00 · backprop by hand


def _by_hand_mistakes(a: float, b: float) -> list:
    """(dq/da, dq/db) that the usual slips give for q = a^2 b + sin(a b), each with its hint."""
    c, s = math.cos(a * b), math.sin(a * b)
    return [((2 * a * b, a * a), "each variable reaches q along two paths, through a^2 b and through sin(a b): you "
                                 "kept only the path through a^2 b; add the other one"),
            ((b * c, a * c), "each variable reaches q along two paths: you kept only the path through the sine; add "
                             "the one through a^2 b"),
            ((2 * a * b + b * s, a * a + a * s), "the slope of the sine is the cosine"),
            ((2 * a * b - b * c, a * a - a * c), "the sine's slope is the cosine with a plus sign (the cosine's own "
                                                 "slope is the one with a minus)"),
            ((2 * a * b + c, a * a + c), "the chain rule through sin(w) with w = a b multiplies by w's own slope with "
                                         "respect to a (or b)")]


def real_number(value: Any) -> Optional[float]:
    """A real number given as a Python or numpy number, or as a 0-d tensor or array; None for anything else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, numbers.Real):
        return float(value)
    if getattr(value, "ndim", None) == 0 and hasattr(value, "item"):
        return real_number(value.item())
    return None


def by_hand_numbers(a_val: float, b_val: float, dq_da: Any, dq_db: Any) -> None:
    """The student's numbers for q = a^2 b + sin(a b), against torch autograd."""
    hint = "a reaches q along two paths, through u = a^2 and through w = a b: add the products of the local " \
           "derivatives along each path (b likewise, through v and w)"
    if dq_da is None or dq_db is None:
        return print("not done yet: fill in the exercise above")
    dq_da, dq_db = real_number(dq_da), real_number(dq_db)
    if dq_da is None or dq_db is None:
        return _wrong("give both gradients as numbers (int or float)", hint)
    a, b = (torch.tensor(float(v), dtype=torch.float64, requires_grad=True) for v in (a_val, b_val))
    (a ** 2 * b + torch.sin(a * b)).backward()
    right = (a.grad.item(), b.grad.item())

    def near(got: float, value: float) -> bool:
        return abs(got - value) <= 1e-4 * max(1.0, abs(value))  # False for NaN

    off = [name for name, got, value in zip(("dq/da", "dq/db"), (dq_da, dq_db), right) if not near(got, value)]
    if not off:
        return print("right")
    if near(dq_da, right[1]) and near(dq_db, right[0]):
        hint = "your two answers are swapped: the first is the slope with respect to a"
    elif near(dq_da, 0) and near(dq_db, 0):
        hint = ZERO
    elif near(dq_da, -right[0]) and near(dq_db, -right[1]):
        hint = "both numbers have the opposite sign: check the sign of each local slope (the sine's slope is " \
               "the cosine, with a plus sign) and multiply without negating"
    else:
        hint = next((text for wrong, text in _by_hand_mistakes(float(a_val), float(b_val))
                     if all(near(got, w) or near(got, r) for got, w, r in zip((dq_da, dq_db), wrong, right))), hint)
    _wrong(f"{' and '.join(off)} differ from the chain rule's", hint)


def _output_slope_hint(rule: type, function: Callable, slope_of_output: Callable, general: str,
                       edge: torch.Tensor) -> Callable[[], str]:
    """The hint finder for a rule whose slope is best written through its output y (tanh: 1 - y^2)."""
    return lambda: rule_hint(rule.apply, function, [(8,)], general, edges=[(edge,)], mistakes=[
        (lambda x, g: [g * slope_of_output(function(function(x)))], ALREADY_THE_OUTPUT),
        (lambda x, g: [g * slope_of_output(x)], INPUT_FOR_OUTPUT)])


@_takes_rule
def tanh(rule: type) -> None:
    edge = torch.tensor([-20.0, 0.0, 20.0])
    check_rule(lambda x, w, b: rule.apply(x @ w + b), (torch.randn(4, 3), torch.randn(3), torch.randn(())),
               hint=_output_slope_hint(rule, torch.tanh, lambda y: 1 - y ** 2, "tanh's slope can be written with its "
                                       "output alone (differentiate sinh / cosh and simplify): save the output in "
                                       "forward", edge),
               edges=[(edge.view(3, 1), torch.ones(1), torch.zeros(()))],
               reference=lambda x, w, b: torch.tanh(x @ w + b))


def central_slope(slope: Callable) -> None:
    """(f(x + h) - f(x - h)) / 2h: at least 100 times closer than the one-sided slope for x^3 at 2, exact for x^2 at
    0, and the formula itself for e^x at 1 with h = 0.1 (where it differs from the exact derivative e)."""
    hint = "evaluate f at the same distance h on both sides of x, and divide the rise by the run between them"
    try:
        central = abs(slope(lambda x: x ** 3, 2.0, 1e-2) - 12)
        at_zero = abs(slope(lambda x: x ** 2, 0.0, 1e-2))
        got = slope(math.exp, 1.0, 0.1)
        formula = abs(got - (math.exp(1.1) - math.exp(0.9)) / 0.2)
    except NotImplementedError:
        return print("not done yet: fill in the exercise above")
    except Exception as error:
        return _wrong(_explain(error), hint)
    one_sided = abs(((2.0 + 1e-2) ** 3 - 2.0 ** 3) / 1e-2 - 12)
    if not (central * 100 < one_sided and at_zero < 1e-12 and formula < 1e-9):
        e, leaning = math.exp, "that is a one-sided difference, which leans towards one side of x: take points on both"
        mistakes = [(lambda: [(e(1.1) - e(1.0)) / 0.1], leaning), (lambda: [(e(1.0) - e(0.9)) / 0.1], leaning),
                    (lambda: [(e(1.1) - e(0.9)) / 0.1], "the two points where you evaluate f are 2h apart: divide by "
                                                        "that distance"),
                    (lambda: [(e(0.9) - e(1.1)) / 0.2], "the rise must be taken in the direction of increasing x")]
        if isinstance(got, numbers.Real) and abs(got - e(1.0)) < 1e-4:  # the exact slope: a step of its own
            hint = "your slope is closer to the exact derivative than this formula can be with the step h you are " \
                   "given: use that h, not one of your own"
        hint = _matching([got], mistakes) or hint
        return _wrong("your slope is not the central difference (tried on x^3 at 2, x^2 at 0 and e^x at 1)", hint)
    print(f"right: one-sided error {one_sided:.2e}, central error {central:.2e}")


# ------------------------------------------------------------------------- 01 · tracer basics


def _power_hint(rule: type, k: int, edge: torch.Tensor) -> Callable[[], str]:
    """The hint finder for the rule of x^k."""
    return lambda: rule_hint(rule.apply, lambda x: x ** k, [(8,)], edges=[(edge,)],
                             general="the power rule: the exponent comes down as a factor and the power drops by one; "
                                     "then the chain rule with the incoming gradient",
                             edge_hint="your gradient is right except at x = 0: the power rule holds there too, "
                                       "no special case is needed",
                             mistakes=[(lambda x, g: [g * x ** (k - 1)], "the power rule brings the exponent down "
                                                                         "as a factor in front"),
                                       (lambda x, g: [g * k * x ** k], "the power rule lowers the power by one")])


@_takes_rule
def cube(rule: type) -> None:
    edge = torch.tensor([0.0, -1.0, 2.0])
    check_rule(lambda x, w: rule.apply(x * w).sum(), (torch.randn(5), torch.randn(5)), hint=_power_hint(rule, 3, edge),
               edges=[(edge, torch.ones(3))], reference=lambda x, w: ((x * w) ** 3).sum())


def prediction(predict: Callable) -> None:
    """The student's predicted x.grad for (y * y.detach()).sum() with y = x * x, without printing the answer."""
    hint = "the detached copy of y is a constant c: d/dx (y c) = c dy/dx, and only one of the two factors carries a " \
           "gradient"
    mistakes = [(lambda x: 4 * x ** 3, "the detached copy of y is a constant: only the other factor carries a "
                                       "gradient, so the product rule has one term, not two"),
                (lambda x: x ** 2, "z reaches x through y = x^2: the chain rule multiplies by y's own slope"),
                (lambda x: 2 * x, "the detached factor still multiplies the gradient: it is a constant, not 1"),
                (lambda x: -2 * x ** 3, SIGN),
                (lambda x: 2 * x.abs() ** 3, "an odd power keeps the sign of x: check your answer at negative x")]
    x = tt.tracer([-1.0, 0.0, 1.0, 2.0, 3.0], requires_grad=True)
    y = x * x
    (y * y.detach()).sum().backward()
    try:
        guess = torch.as_tensor(predict(x.detach()))
    except NotImplementedError:
        return print("not done yet: fill in the exercise above")
    except Exception as error:
        return _wrong(_explain(error), hint)
    if guess.shape != x.shape:
        return _wrong(f"your prediction has shape {tuple(guess.shape)}, x has {tuple(x.shape)}", hint)
    off = [f"{v:g}" for v, ok in zip(x.tolist(), torch.isclose(_plain(guess).float(), _plain(x.grad)).tolist())
           if not ok]
    if not off:
        return print("right")
    hint = _matching([guess], [(lambda x, f=f: [f(x)], text) for f, text in mistakes], _plain(x).double()) or hint
    print(f"wrong at x = {', '.join(off)}\nhint: {hint}")


# ------------------------------------------------------------------------- 02 · writing gradient rules


def _softplus_hint(rule: type, edge: torch.Tensor) -> Callable[[], str]:
    return lambda: rule_hint(rule.apply, F.softplus, [(8,)], edges=[(edge,)],
                             general="differentiate log(1 + e^x) with the chain rule and simplify: the result is a "
                                     "function you know from logistic regression",
                             edge_hint="right for moderate inputs, wrong where softplus saturates: use a form of the "
                                       "slope that torch computes stably for large |x|",
                             mistakes=[(lambda x, g: [g * torch.exp(x)], "softplus is log(1 + e^x): the chain rule "
                                        "goes through the log as well as through e^x"),
                                       (lambda x, g: [g * torch.sigmoid(-x)], "the slope of softplus rises from 0 to 1 "
                                        "as x grows; yours falls: look at the sign of the exponent")])


@_takes_rule
def softplus(rule: type) -> None:
    edge = torch.tensor([-30.0, -2.0, 0.0, 2.0, 30.0])
    far = torch.tensor([-100.0, 100.0])  # e^x overflows float32 above x = 88.7: the slope must not
    check_rule(lambda x, w: rule.apply(x @ w), (torch.randn(4, 3), torch.randn(3, 2)), hint=_softplus_hint(rule, far),
               edges=[(edge.view(5, 1), torch.ones(1, 1))], reference=lambda x, w: F.softplus(x @ w),
               far=[(far.view(2, 1), torch.ones(1, 1))])


@_takes_rule
def leaky(rule: type) -> None:
    edge = torch.tensor([-2.0, -0.5, 0.0, 0.0, 1.5])
    hint = functools.partial(
        rule_hint, lambda x: rule.apply(x, 0.1), lambda x: F.leaky_relu(x, 0.1), [(10,)], edges=[(edge,)],
        general="each piece of the function is a straight line, so its slope is that line's slope; backward returns "
                "one gradient per forward argument",
        edge_hint="right everywhere but at x = 0 itself: at the kink torch takes the slope of the negative piece "
                  "(slope 1 belongs to x > 0 only)",
        mistakes=[(lambda x, g: [g], "the negative side is scaled by s in forward, so its slope is s, not 1"),
                  (lambda x, g: [torch.where(x > 0, 0.1 * g, g)], "the two slopes are swapped: 1 belongs to the "
                                                                  "positive side"),
                  (lambda x, g: [torch.where(x > 0, g, 0 * g)], "the negative side is not flat: forward scales it by "
                                                                "s (that is what makes it leaky)")])
    check_rule(lambda x: rule.apply(x, 0.1) * (x + 1), (torch.randn(10),), hint=hint, edges=[(edge,)],
               reference=lambda x: F.leaky_relu(x, 0.1) * (x + 1))


# ------------------------------------------------------------------------- 03 · layers and training


def _mse_mistakes() -> list:
    """What the usual slips in the gradient of mean((p - t)^2) give, at (p, t) with upstream gradient g."""
    def residual(p: torch.Tensor, t: torch.Tensor, g: torch.Tensor, divide: float) -> torch.Tensor:
        return g * 2 * (p - t) / divide

    return [(lambda p, t, g: [residual(p, t, g, 1), -residual(p, t, g, 1)],
             "the loss is a mean: each element's share of the sum is divided by how many elements there are"),
            (lambda p, t, g: [residual(p, t, g, len(p)), -residual(p, t, g, len(p))],
             "off by the batch size: the mean runs over every element, not only over the rows of the batch"),
            (lambda p, t, g: [residual(p, t, g, 2 * p.numel()), -residual(p, t, g, 2 * p.numel())],
             "the derivative of a square brings down a factor 2"),
            (lambda p, t, g: [residual(p, t, g, p.numel())] * 2,
             "t enters the residual p - t with a minus sign, so its gradient is the opposite of p's"),
            (lambda p, t, g: [residual(p, t, g, p.numel()), None],
             "the loss depends on t as much as on p: both inputs get a gradient")]


@_takes_rule
def mse(rule: type) -> None:
    x, w = torch.randn(8, 4), torch.randn(4, 3)
    hint = functools.partial(rule_hint, rule.apply, F.mse_loss, [(8, 3), (8, 3)],
                             "differentiate the mean of the squared residuals with respect to p and to t: the chain "
                             "rule through the square and through the residual", _mse_mistakes())
    check_rule(lambda x, w, t: rule.apply(x @ w, t), (x, w, torch.randn(8, 3)), hint=hint,
               edges=[(x, w, (x @ w).detach())])  # p == t: the residual is zero


@_takes_rule
def swish(rule: type) -> None:
    edge = torch.tensor([-20.0, -1.0, 0.0, 1.0, 20.0])
    product = "x sigmoid(x) is a product of two factors that both depend on x: the product rule adds two terms, and "
    hint = functools.partial(
        rule_hint, rule.apply, F.silu, [(12,)], edges=[(edge,)],
        general="the product rule on x times sigmoid(x), with the sigmoid's own slope written through the sigmoid",
        edge_hint="right for moderate inputs, wrong where the sigmoid saturates: compute the sigmoid with torch, "
                  "which stays exact there",
        mistakes=[(lambda x, g: [g * torch.sigmoid(x)], product + "you kept only the one where x is differentiated"),
                  (lambda x, g: [g * x * torch.sigmoid(x) * (1 - torch.sigmoid(x))],
                   product + "you kept only the one where the sigmoid is differentiated")])
    check_rule(lambda x, w1, w2: rule.apply(x @ w1) @ w2,
               (torch.randn(16, 64), torch.randn(64, 32) / 8, torch.randn(32, 10)), hint=hint,
               edges=[(edge.view(1, 5), torch.eye(5), torch.ones(5, 1))],
               reference=lambda x, w1, w2: F.silu(x @ w1) @ w2)


# ------------------------------------------------------------------------- 04 · gradient flow


def vanishing_layer(answer: Any, network: torch.nn.Sequential) -> None:
    """Is `answer` the index of the linear layer whose weights were scaled down?"""
    hint = "after one backward, tt.flow(broken) lists |grad| per parameter: find the first layer (from the output) " \
           "after which the gradient norms collapse"
    if answer is None:
        return print("not done yet: fill in the exercise above")
    linear = [i for i, layer in enumerate(network) if isinstance(layer, torch.nn.Linear)]
    if isinstance(answer, bool) or not isinstance(answer, int):
        return _wrong(f"answer is a {type(answer).__name__}; give the index of a layer, an int", hint)
    if answer not in linear:
        return _wrong(f"broken[{answer}] is not a linear layer (they sit at {linear[0]}, {linear[1]}, ..., "
                      f"{linear[-1]})", "only the linear layers have weights that could have been scaled down: "
                                        "count the layers of the Sequential from 0, activations included")
    smallest = min(linear, key=lambda i: network[i].weight.abs().mean().item())
    if answer == smallest:
        return print("right")
    if answer < smallest:
        return _wrong("that layer's own weights are healthy", "that layer sits before the bad one, on the input side: "
                      "its gradient is small only because it had to pass through the bad layer's tiny weights")
    _wrong("that layer's gradients are healthy", "the gradient is still healthy there, on the output side of the bad "
           "layer: the bad one is where, coming from the output, the norms collapse")


@_takes_rule
def sigmoid(rule: type, width: int) -> None:
    edge = torch.tensor([-40.0, -5.0, 0.0, 5.0, 40.0])
    check_rule(lambda a, w: rule.apply(a @ w), (torch.randn(8, width), torch.randn(width, width)),
               hint=_output_slope_hint(rule, torch.sigmoid, lambda y: y * (1 - y), "the logistic function's slope can "
                                       "be written with its output alone: save the output in forward", edge),
               edges=[(edge.view(1, 5), torch.eye(5))], reference=lambda a, w: torch.sigmoid(a @ w))


# ------------------------------------------------------------------------- 05 · porting torch models


class _BesselI0(torch.autograd.Function):
    """I0 with its derivative I1, for torch autograd: the reference the hints compare with (torch has no derivative
    of modified_bessel_i0)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return torch.special.modified_bessel_i0(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return grad * torch.special.modified_bessel_i1(x)


def bessel_i0(layer: Callable) -> None:
    """The registered rule for torch.special.modified_bessel_i0 (torch has no derivative: finite differences)."""
    i0, i1 = torch.special.modified_bessel_i0, torch.special.modified_bessel_i1
    hint = functools.partial(
        rule_hint, layer, _BesselI0.apply, [(12,)],
        "look up the derivative of the modified Bessel function I0: it is the next one of the family, I1, which "
        "torch.special provides; then the chain rule with the incoming gradient",
        [(lambda x, g: [g * i0(x)], "the derivative of I0 is another Bessel function of the family, not I0 itself"),
         (lambda x, g: [g * i1(x.abs())], "I1 is odd: it is negative where x is negative")])
    check_by_finite_differences(lambda x: layer(x * 2), (torch.randn(12),), hint=hint,
                                edges=[(torch.tensor([-2.5, -1.0, 0.0, 0.0, 1.0, 2.5]),)])


# ------------------------------------------------------------------------- 06 · higher order


@_takes_rule
def quartic(rule: type) -> None:
    edge = torch.tensor([-2.0, 0.0, 0.5, 3.0])
    check_rule(lambda x: rule.apply(x) * 2, (torch.randn(6),), hint=_power_hint(rule, 4, edge), edges=[(edge,)],
               reference=lambda x: x ** 4 * 2)


@_takes_rule
def quartic_second_derivative(rule: type) -> None:
    x = tt.tracer([-1.0, 0.0, 0.5, 2.0], requires_grad=True)
    hint = "the second derivative differentiates your backward itself: it must stay a graph, computed with torch " \
           "operations on the tensors the rule saved (nothing that turns them into numbers or detached tensors)"
    try:
        (g,) = tt.grad(rule.apply(x).sum(), x, create_graph=True)
        if not _plain(g).any():
            return _wrong("your first derivative is zero everywhere", "the backward must return the slope of x^4 "
                          "times the gradient from above: yours returns zero, so there is nothing to differentiate")
        if torch.allclose(_plain(g), -4 * _plain(x) ** 3):
            return _wrong("your first derivative has the opposite sign", "the slope of x^4 is positive where x is "
                          "positive: a minus sign too many in your backward")
        (h,) = tt.grad(g.sum(), x)
    except NotImplementedError:
        return print("not done yet: fill in the exercise above")
    except Exception as error:
        return _wrong(_explain(error), hint)
    wrong_at = [f"{v:g}" for v, ok in zip(x.tolist(), torch.isclose(_plain(h), 12 * _plain(x) ** 2).tolist())
                if not ok]
    if wrong_at and not torch.allclose(_plain(g), 4 * _plain(x) ** 3):
        hint = "the first derivative is wrong already: make the rule right (the check above) first"
    elif wrong_at:
        hint = "part of your backward is recorded and part is not: every factor that depends on x must come from " \
               "torch operations on the saved tensor, or its own slope is missing from the second derivative"
    print("second derivative: right" if not wrong_at else
          f"second derivative: wrong at x = {', '.join(wrong_at)}\nhint: {hint}")


def hessian(build: Callable, x0: torch.Tensor) -> None:
    """H of f(x) = sum x_i^4 + x_1 x_2 at x0, built by the student from Hessian-vector products."""
    hint = "row i of H is how the gradient changes along the i-th coordinate: a Hessian-vector product with the i-th " \
           "basis vector, i.e. the gradient of (gradient · e_i)"
    try:
        H = torch.as_tensor(build(x0))
    except NotImplementedError:
        return print("not done yet: fill in the exercise above")
    except Exception as error:
        return _wrong(_explain(error), hint)
    if H.shape != (3, 3):
        return _wrong(f"expected a (3, 3) tensor, got shape {tuple(H.shape)}",
                      "a Hessian has one row per coordinate of x: one Hessian-vector product per basis vector, stacked")
    cross = torch.tensor([[0.0, 1, 0], [1, 0, 0], [0, 0, 0]])
    expected = torch.diag(12 * x0 ** 2) + cross
    bad = [(i, j) for i in range(3) for j in range(3) if not torch.isclose(_plain(H)[i, j].float(), expected[i, j])]
    if bad:
        mistakes = [(lambda: [torch.diag(12 * x0 ** 2)], "the cross term x_1 x_2 couples two coordinates: it puts "
                                                         "entries off the diagonal"),
                    (lambda: [torch.zeros(3, 3)], "all zeros: the second differentiation needs the gradient as a "
                                                  "graph, so ask the first one to record itself"),
                    (lambda: [torch.diag(4 * x0 ** 3) + cross], "those are first derivatives on the diagonal: each "
                                                               "entry differentiates the gradient once more")]
        return _wrong(f"entries {', '.join(map(str, bad))} differ", _matching([H], mistakes) or hint)
    print("right")


# ------------------------------------------------------------------------- 00a · build the engine


def _value_case(Value: type, expression: Callable, points: Sequence[float]) -> Optional[str]:
    """Where the student's Value gradients of expression(*points) differ from torch autograd's (None: nowhere)."""
    values = [Value(p) for p in points]
    out = expression(*values)
    out.backward()
    tensors = [torch.tensor(p, dtype=torch.float64, requires_grad=True) for p in points]
    expression(*tensors).backward()
    if abs(out.data - expression(*[t.detach() for t in tensors]).item()) > 1e-9:
        return "its value (data) is wrong"
    bad = [f"d/d{'abcd'[i]}" for i, (v, t) in enumerate(zip(values, tensors)) if abs(v.grad - t.grad.item()) > 1e-9]
    return ", ".join(bad) + " differ" if bad else None


def _check_values(Value: type, cases: Sequence[Any], diagnose: Callable[[str, str], str], general: str) -> None:
    """Each case against torch autograd; a wrong one gets diagnose(label, problem) as its hint."""
    try:
        for label, expression, points in cases:
            problem = _value_case(Value, expression, points)
            if problem:
                where = ", ".join(f"{name} = {p:g}" for name, p in zip("abcd", points))
                return _wrong(f"{label} at {where}: {problem}", diagnose(label, problem))
    except NotImplementedError:
        return print("not done yet: fill in the exercise above")
    except Exception as error:
        return _wrong(_explain(error), general)
    print(f"right: your Value's gradients match torch autograd ({len(cases)} expressions, kinks and zeros included)")


def _value_gradient(Value: type, expression: Callable, point: float) -> Optional[float]:
    """a.grad after backward of expression(a) on the student's Value (None where it raises)."""
    try:
        a = Value(point)
        expression(a).backward()
        return float(a.grad)
    except Exception:
        return None


def value_pow_exp(Value: type) -> None:
    cases = [("a ** 3", lambda a: a ** 3, (p,)) for p in (-1.5, 0.0, 2.0)]
    cases += [("a ** -1", lambda a: a ** -1, (p,)) for p in (-0.5, 3.0)]
    cases += [("a.exp()", lambda a: a.exp(), (p,)) for p in (-2.0, 0.0, 1.0)]
    cases += [("a ** 2 * a.exp()  (a used twice)", lambda a: a ** 2 * a.exp(), (p,)) for p in (-1.0, 0.0, 0.5)]
    general = "each closure multiplies its op's local derivative by the gradient of the op's output, and adds the " \
              "product to its input's gradient"

    def diagnose(label: str, problem: str) -> str:
        p = 1.5  # each op alone, its output scaled by 2 so that a forgotten output gradient shows
        upstream = "the output's gradient (2 here) must multiply the local derivative: the chain rule"
        power = [(3 * p ** 2, upstream), (2 * p ** 2, "the power rule brings the exponent down as a factor"),
                 (6 * p ** 3, "the power rule lowers the power by one"), (-6 * p ** 2, SIGN)]
        probes = [(lambda a: a ** 3 * 2, 6 * p ** 2, power),
                  (lambda a: a.exp() * 2, 2 * math.exp(p), [(math.exp(p), upstream),
                                                            (2 * p, "the slope of e^x is e^x itself, the output's "
                                                                    "value, not the input's"),
                                                            (-2 * math.exp(p), SIGN)])]
        for expression, right, known in probes:
            got = _value_gradient(Value, expression, p)
            if got is None or abs(got - right) > 1e-9:
                return next((text for value, text in known if got is not None and abs(got - value) < 1e-9), general)
        if "twice" in label:  # each op alone is right
            return "a value used twice receives a gradient from each use: the contributions must add up (the " \
                   "multivariable chain rule), not replace one another"
        return general

    _check_values(Value, cases, diagnose, general)


def value_sub_div(Value: type) -> None:
    cases = [("a - b", lambda a, b: a - b, (2.0, 5.0)), ("a - b", lambda a, b: a - b, (1.5, 1.5)),
             ("a / b", lambda a, b: a / b, (3.0, -2.0)), ("a / b", lambda a, b: a / b, (0.0, 4.0)),
             ("(a - b) / (a * b)", lambda a, b: (a - b) / (a * b), (2.0, 2.0)),
             ("(a - b) / (a * b)", lambda a, b: (a - b) / (a * b), (-1.0, 3.0))]
    general = "subtraction is adding a multiple of b, and division is multiplying by a power of b: built from ops " \
              "that already have _backward closures, they need none of their own"

    def diagnose(label: str, problem: str) -> str:
        if "value" in problem:
            return "the value itself is wrong: check which multiple of b subtraction adds, and which power of b " \
                   "division multiplies by"
        probe = (lambda a: a / Value(2.0)) if "/" in label else (lambda a: a - Value(1.0))
        if _value_gradient(Value, probe, 2.0) == 0.0:
            return "your result is a new Value that does not remember its inputs, so backward cannot reach a and b: " \
                   "build it from operations that record them"
        return general

    _check_values(Value, cases, diagnose, general)


# ------------------------------------------------------------------------- 01a · training by hand


Step = Callable[[list, dict], None]  # one update of a list of parameters (their .grad filled), with its own state


def _trajectory(step: Step, steps: int = 5) -> list:
    """The parameters of a small MLP after each of `steps` updates by `step` (the same data and start every time)."""
    torch.manual_seed(0)
    model = tt.nn.Sequential(tt.nn.Linear(3, 4), tt.nn.Tanh(), tt.nn.Linear(4, 1))
    x, y = torch.randn(16, 3), torch.randn(16, 1)
    state: dict = {}
    after = []
    for _ in range(steps):
        model.zero_grad()
        F.mse_loss(model(x), y).backward()
        with tt.no_grad():
            step(list(model.parameters()), state)
        after.append([_plain(p).clone() for p in model.parameters()])
    return after


def _optimizer_step(make: Callable) -> Step:
    """A Step that runs an optimizer made by make(params) on the first call."""
    def step(params: list, state: dict) -> None:
        state.setdefault("optimizer", make(params)).step()
    return step


def _same_steps(a: list, b: list) -> bool:
    return all(torch.allclose(p, q, rtol=1e-5, atol=1e-7) for ps, qs in zip(a, b) for p, q in zip(ps, qs))


NOT_MOVED = "the parameters did not change: the update must change the tensors you were given, in place"


def _check_update(step: Step, reference: Step, what: str, mistakes: Sequence[Tuple[Step, str]], general: str) -> None:
    """The student's update against the reference over 5 steps; a difference is explained by the first common
    mistake (an update of the same shape) whose 5 steps it repeats."""
    try:
        ours = _trajectory(step)
    except NotImplementedError:
        return print("not done yet: fill in the exercise above")
    except Exception as error:
        return _wrong(_explain(error), general)
    expected = _trajectory(reference)
    differs = next((k + 1 for k, (p, q) in enumerate(zip(ours, expected)) if not _same_steps([p], [q])), None)
    if differs is None:
        return print(f"right: 5 steps of your update equal {what}'s")
    start = _trajectory(lambda params, state: None)
    hint = NOT_MOVED if _same_steps(ours, start) else next(
        (text for mistake, text in mistakes if _same_steps(ours, _trajectory(mistake))), general)
    _wrong(f"after step {differs} your parameters differ from {what}'s", hint)


def _momentum(decay: float, add: float, sign: float = 1.0, step_first: bool = False) -> Step:
    """A momentum update v <- decay v + add g; p <- p - sign lr v (with the old v when step_first)."""
    def step(params: list, state: dict) -> None:
        velocities = state.setdefault("v", [torch.zeros_like(_plain(p)) for p in params])
        for p, v in zip(params, velocities):
            if step_first:
                p -= sign * 0.1 * v
            v.mul_(decay).add_(add * _plain(p.grad))
            if not step_first:
                p -= sign * 0.1 * v
    return step


def momentum_step(update: Callable) -> None:
    """update(params, velocities, lr, momentum) on lists of tensors, velocities starting at zero."""
    def step(params: list, state: dict) -> None:
        velocities = state.setdefault("v", [torch.zeros_like(_plain(p)) for p in params])
        update(params, velocities, 0.1, 0.9)

    mistakes = [(_momentum(0.0, 1.0), "your update forgets the velocity between steps: it is the update's memory, "
                                      "so it must live on in the tensors you were given (a new local name is lost "
                                      "when the step ends)"),
                (_momentum(1.0, 1.0), "the old velocity fades by the momentum factor at every step before the new "
                                      "gradient joins it"),
                (_momentum(0.9, 0.1), "torch's momentum adds the whole gradient to the faded velocity: it does not "
                                      "average the two"),
                (_momentum(0.9, 1.0, sign=-1.0), "a step goes against the gradient, downhill"),
                (_momentum(0.9, 1.0, step_first=True), "the step follows the velocity after this step's gradient "
                                                       "joined it, not the previous step's")]
    _check_update(step, _optimizer_step(lambda ps: tt.optim.SGD(ps, lr=0.1, momentum=0.9)),
                  "tt.optim.SGD(lr=0.1, momentum=0.9)", mistakes,
                  "momentum keeps a velocity per parameter that gathers the gradients, fading by the momentum factor "
                  "at each step; the parameter then moves along the velocity")


def _decay(into_gradient: float, after_step: float, sign: float = 1.0) -> Step:
    """p <- p - lr (g + sign into_gradient p), then p <- p (1 - after_step)."""
    def step(params: list, state: dict) -> None:
        for p in params:
            p -= 0.1 * (_plain(p.grad) + sign * into_gradient * _plain(p))
            p *= 1 - after_step
    return step


def weight_decay_step(update: Callable) -> None:
    """update(params, lr, weight_decay) on a list of tensors."""
    mistakes = [(_decay(0.0, 0.01), "you shrink the weights after the step: torch's SGD adds the decay to the "
                                    "gradient (the gradient of an L2 penalty), before the step"),
                (_decay(0.0, 0.001), "that is decoupled weight decay (AdamW's way, shrinking the weights apart from "
                                     "the gradient): torch's SGD adds the decay to the gradient instead"),
                (_decay(0.0, 0.0), "your update is plain SGD: the decay adds a multiple of each weight to its "
                                   "gradient"),
                (_decay(0.01, 0.0, sign=-1.0), "the decay pulls every weight towards zero, so it adds to the gradient "
                                               "a multiple of the weight with the weight's own sign"),
                (_decay(0.1, 0.0), "the decay is part of the gradient, so the learning rate scales it too")]
    _check_update(lambda params, state: update(params, 0.1, 0.01),
                  _optimizer_step(lambda ps: tt.optim.SGD(ps, lr=0.1, weight_decay=0.01)),
                  "tt.optim.SGD(lr=0.1, weight_decay=0.01)", mistakes,
                  "weight decay is the gradient of a penalty on the weights' size: it joins the gradient before the "
                  "step")


def _per_example_loss(errors: torch.Tensor) -> torch.Tensor:
    """The exercise's loss: squared errors summed over each example's outputs (dim 1), averaged over examples."""
    return errors.sum(dim=1).mean()


def _training_step(reset: str = "first", loss_of: Callable = _per_example_loss) -> Callable:
    """A step of the loop with tt.optim.SGD; `reset`: where zero_grad runs ("first", "between" backward and the
    step, or "never"); `loss_of`: how the squared errors become the loss."""
    def step(model: torch.nn.Module, optimizer: Any, x: torch.Tensor, y: torch.Tensor) -> Any:
        if reset == "first":
            optimizer.zero_grad()
        loss = loss_of((model(x) - y) ** 2)
        loss.backward()
        if reset == "between":
            optimizer.zero_grad()
        optimizer.step()
        return loss
    return step


def _training_run(step: Callable, calls: int = 3) -> Tuple[list, list, bool]:
    """What `calls` calls of step(model, optimizer, x, y) return, the parameters after each, from one start, and
    whether the parameters hold a gradient after the last call."""
    generator = torch.Generator().manual_seed(0)
    x, y = torch.randn(8, 3, generator=generator), torch.randn(8, 2, generator=generator)
    model = tt.nn.Linear(3, 2)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=generator))
    optimizer = tt.optim.SGD(model.parameters(), lr=0.1)
    returned, params = [], []
    for _ in range(calls):
        returned.append(step(model, optimizer, x, y))
        params.append([_plain(p).clone() for p in model.parameters()])
    return returned, params, all(p.grad is not None for p in model.parameters())


def training_step(step: Callable) -> None:
    """Three calls of the student's step(model, optimizer, x, y) in a row against an ordinary training loop's: the
    parameters after each call (which tell a kept gradient, an erased one and a loss over the wrong axis apart) and
    the loss each call returns."""
    general = "one step forgets the old gradients, computes the loss, back-propagates it and steps, in that order"
    try:
        returned, params, kept = _training_run(step)
    except NotImplementedError:
        return print("not done yet: fill in the exercise above")
    except Exception as error:
        return _wrong(_explain(error), general)
    expected_losses, expected, _ = _training_run(_training_step())
    if not all(_all_close(got, want) for got, want in zip(params, expected)):
        mistakes = [(_training_step(reset="never"), "backward adds into each gradient: without a reset each step "
                     "follows the sum of every gradient so far; forget the old gradients before this step's backward"),
                    (_training_step(reset="between"), "the parameters never move: the optimizer's step runs after "
                     "backward but finds no gradient, because the reset ran in between; reset first"
                     if not kept else "the parameters never move: the optimizer's step ran before this step's "
                     "backward, when there was no gradient yet; back-propagate first, then step"),
                    (_training_step(loss_of=lambda e: e.sum(dim=0).mean()), "the axes are swapped: sum over each "
                     "example's outputs (dim 1), then average over the examples (dim 0)"),
                    (_training_step(loss_of=lambda e: e.mean()), "you averaged over the outputs too: each example's "
                     "squared errors are summed over its outputs, and only the examples are averaged")]
        hint = next((text for mistake, text in mistakes
                     if all(_all_close(got, want) for got, want in zip(params, _training_run(mistake)[1]))), general)
        return _wrong("after three calls the parameters differ from those of an ordinary training loop", hint)
    if not all(_close(got, want) for got, want in zip(returned, expected_losses)):
        return _wrong("the parameters are right, but the step does not return its loss",
                      "return the loss this step computed (the value before the update), a tensor or a number")
    print("right: three calls move the parameters as an ordinary training loop does, and return each step's loss")


# ------------------------------------------------------------------------- 06a · forward and reverse mode


def _functions() -> list:
    w = torch.randn(4, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    return [("sin(x) * x", lambda x: torch.sin(x) * x), ("w @ x", lambda x: w @ x),
            ("tanh(w @ x).sum()", lambda x: torch.tanh(w @ x).sum()), ("x.cumsum(0)", lambda x: x.cumsum(0))]


def _check_products(compute: Callable, reference: Callable, mistakes: Callable, general: str) -> None:
    """compute(f, x, v) against reference(f, x, v) for every function, point and tangent; a difference is explained
    by the first of mistakes(f, x, v) (what the usual slips compute there) that gives the same result."""
    points = [torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64), torch.zeros(3, dtype=torch.float64)]
    tangents = [torch.tensor([1.0, 0.5, -2.0], dtype=torch.float64), torch.zeros(3, dtype=torch.float64)]
    try:
        for label, f in _functions():
            for x in points:
                for v in tangents:
                    got = torch.as_tensor(compute(f, x, v))
                    expected = reference(f, x, v)
                    if got.shape != expected.shape or not torch.allclose(_plain(got).double(), expected, atol=1e-9):
                        where = "x = 0" if not x.any() else "x = (0.5, -1, 2)"
                        along = "v = 0" if not v.any() else "v = (1, 0.5, -2)"
                        shape = f" (shape {tuple(got.shape)})" if got.shape != expected.shape else ""
                        hint = _matching([got], mistakes(f, x, v)) if v.any() else None
                        return _wrong(f"for f(x) = {label} at {where} along {along}{shape}", hint or general)
    except NotImplementedError:
        return print("not done yet: fill in the exercise above")
    except Exception as error:
        return _wrong(_explain(error), general)
    print("right: your products equal torch.func's (4 functions, zero points and zero tangents included)")


def _jvp_mistakes(f: Callable, x: torch.Tensor, v: torch.Tensor) -> list:
    y, pullback = torch.func.vjp(f, x)
    return [(lambda: [pullback(v.expand_as(y))[0]], "that is J^T v, the vector-Jacobian product one reverse pass "
                                                    "gives; J v comes from differentiating J^T u with respect to u"),
            (lambda: [pullback(torch.ones_like(y))[0]], "that is the gradient of the sum of f's outputs (one reverse "
                                                        "pass with a vector of ones): the tangent v never entered"),
            (lambda: [torch.zeros_like(y)], "your product is zero: the first reverse pass must be recorded as a graph "
                                            "in u, or the second has nothing to differentiate")]


def jvp_by_hand(jvp: Callable) -> None:
    """jvp(f, x, v) -> J v, from two reverse passes."""
    _check_products(jvp, lambda f, x, v: torch.func.jvp(f, (x,), (v,))[1], _jvp_mistakes,
                    "J^T u, what a reverse pass computes, is linear in u: its inner product with v, differentiated "
                    "with respect to u, is J v")


def hvp_forward_over_reverse(hvp: Callable) -> None:
    """hvp(f, x, v) -> H v for a scalar f: tt.jvp of the gradient function."""
    def reference(f: Callable, x: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.func.jvp(torch.func.grad(lambda t: f(t).sum()), (x,), (v,))[1]

    def mistakes(f: Callable, x: torch.Tensor, v: torch.Tensor) -> list:
        gradient = torch.func.grad(lambda t: f(t).sum())
        return [(lambda: [gradient(x)], "that is the gradient itself: H v is how the gradient changes when x moves "
                                        "along v"),
                (lambda: [torch.zeros_like(x)], "your product is zero: the gradient must be recorded as a graph so "
                                                "that forward mode can differentiate it again"),
                (lambda: [torch.func.jvp(lambda t: f(t).sum(), (x,), (v,))[1]],
                 "that is the directional derivative of f itself (a number): H v differentiates the gradient, a "
                 "vector")]

    _check_products(lambda f, x, v: hvp(lambda t: f(t).sum(), x, v), reference, mistakes,
                    "forward mode over reverse mode: the forward-mode derivative, along v, of the function that "
                    "returns the gradient")


# ------------------------------------------------------------------------- 07 · backward as code


def _rule_block(code: str, name: str) -> Optional[str]:
    """The lines of the generated backward under the comment naming rule `name` (None: there is no such block)."""
    lines = code.split("def backward", 1)[-1].splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip() == f"# {name}"
                  or line.strip().startswith(f"# {name}:")), None)
    if start is None:
        return None
    end = next((i for i in range(start + 1, len(lines)) if lines[i].strip().startswith(("#", "return"))), len(lines))
    return "\n".join(lines[start:end])


def _generated_gradient(code: str, w: torch.Tensor) -> torch.Tensor:
    """d loss / d w at w from the generated file, run in a namespace that holds only what the file imports."""
    namespace: Dict[str, Any] = {}
    exec(code, namespace)
    _, saved = namespace["forward"](w, {})
    (gradient,) = namespace["backward"]({}, saved, torch.ones(()))
    return gradient


@_takes_rule
def softplus_in_code(rule: type) -> None:
    """The Softplus rule through tt.check (saturation and zero included), then in the code tt.compile generates: its
    block is printed, and the code, run without torchtrace at new points, must give torch autograd's gradient."""
    torch_only = "the generated code replays exactly the torch calls your backward made: compute the slope with " \
                 "torch operations on the saved tensor only"

    def loss(w: torch.Tensor) -> torch.Tensor:
        return rule.apply(w * 2).sum()

    edges = torch.tensor([-20.0, -0.5, 0.0, 0.5, 20.0])
    if not check_rule(loss, (torch.randn(5),), _softplus_hint(rule, edges), edges=[(edges,)],
                      reference=lambda w: F.softplus(w * 2).sum()):
        return
    try:
        example = tt.randn(5, requires_grad=True)
        compiled = tt.compile(loss, (example,))
        block = _rule_block(tt.trace(loss, example).to_code(), rule.__name__)
        generated = _generated_gradient(compiled.code, edges.clone())
    except Exception as error:
        return _wrong(_explain(error), "your backward read values out of the tensors (as Python numbers, lists or "
                                       "NumPy arrays): the code checks them at every call and fails when they change; "
                                       + torch_only)
    w = edges.clone().requires_grad_()
    F.softplus(w * 2).sum().backward()
    if block is None:
        return _wrong(f"the generated backward has no block headed '# {rule.__name__}'",
                      "the code names each rule's block after the rule's class: pass the class your Softplus rule is")
    if generated.shape != w.shape or not torch.allclose(generated, w.grad, rtol=1e-5, atol=1e-6):
        return _wrong("the generated backward, run at new points (saturation and zero), differs from torch autograd: "
                      "something computed from the example's values was frozen into the code",
                      "a value your backward computed outside torch was written into the code as a constant: " +
                      torch_only)
    print(f"your rule's lines in the generated backward:\n{block}\n"
          "right: run without torchtrace at new points (saturation and zero), the code gives torch autograd's gradient")


def _target_at_loss_one(y: torch.Tensor) -> torch.Tensor:
    """A target t with y - t == 1 exactly in every element, so that the mean squared error is exactly 1."""
    t = y - 1
    for _ in range(4):  # y - (y - 1) may round away from 1: step t by one float towards it
        residual = y - t
        t = torch.where(residual > 1, torch.nextafter(t, y), torch.where(residual < 1, torch.nextafter(t, y - 2), t))
    return t


def _step_difference(fn: Callable, reference: Callable, model: torch.nn.Module, x: torch.Tensor,
                     target: torch.Tensor) -> Optional[str]:
    """What differs between fn and reference at (x, target): the value or the parameters' gradients (None: nothing)."""
    results = []
    for step in (fn, reference):
        model.zero_grad()
        value = step(x, target)
        value.backward()
        results.append((_plain(value), [torch.zeros_like(_plain(p)) if p.grad is None else _plain(p.grad)
                                        for p in model.parameters()]))
    model.zero_grad()
    (ours, our_grads), (theirs, their_grads) = results
    if ours.shape == theirs.shape and theirs.any() and not ours.any():
        return "the value is zero where the original's is not"
    if ours.shape == theirs.shape and theirs.any() and torch.allclose(ours, -theirs):
        return "the value has the opposite sign of the original's"
    if ours.shape != theirs.shape or not torch.allclose(ours, theirs):
        return "the value differs from the original's"
    if not all(torch.allclose(a, b, rtol=1e-5, atol=1e-7) for a, b in zip(our_grads, their_grads)):
        return "the value is right, the gradients of the model's parameters differ from the original's"
    return None


def step_with_one_path(fn: Callable, reference: Callable, model: torch.nn.Module, x: torch.Tensor) -> None:
    """fn(x, target) must equal reference(x, target), value and parameter gradients, on both sides of the original's
    branch, exactly at it (a loss of 1) and at a zero loss; and tt.compile(fn), called on both sides of the branch,
    must record one path (a program without a branch) and give the original's values."""
    hint = "compute both candidate results as tensors and let a torch operation choose between them by the " \
           "condition; nothing that Python reads from a tensor (no if, bool or item on it)"
    hints = {"branch point": "at the branch point itself the original keeps the unscaled loss: your comparison must be "
                             "as strict as the original's",
             "value": "the values differ from the original's: both candidate results, and which side of 1 takes which, "
                      "must be the original's",
             "gradients": "the values are right but a gradient is lost: both candidate results must stay connected "
                          "to the model (nothing detached)",
             "zero": "your step returns zero: return the loss itself on one side of the branch and the scaled loss "
                     "on the other, as the original does",
             "sign": "your step returns the loss negated: minimising it would climb the original loss; keep the "
                     "original's sign on both sides of the branch"}
    try:
        y = _plain(model(x))
        targets = {"a loss of 9": y - 3, "a loss of exactly 1 (the branch point)": _target_at_loss_one(y),
                   "a loss of 0.25": y - 0.5, "a loss of 0": y.clone()}
        for label, target in targets.items():
            problem = _step_difference(fn, reference, model, x, target)
            if problem:
                kind = "branch point" if "branch point" in label else "gradients" if "gradients" in problem else \
                    "zero" if "is zero" in problem else "sign" if "opposite sign" in problem else "value"
                return _wrong(f"at {label}: {problem}", hints[kind])
        compiled = tt.compile(fn, (x, targets["a loss of 9"]))
        replayed = [_plain(compiled(x, targets[label])) for label in ("a loss of 9", "a loss of 0.25", "a loss of 9")]
        paths = len(compiled.program.paths())
    except NotImplementedError:
        return print("not done yet: fill in the exercise above")
    except Exception as error:
        return _wrong(_explain(error), hint)
    if paths != 1:
        return _wrong(f"the compiled step took {paths} paths: Python still decides which torch calls run",
                      "Python still reads the loss's value to decide which branch to take, so each side of the branch "
                      "is a different program: let torch make the choice, between two tensors")
    expected = [_plain(reference(x, targets[label])) for label in ("a loss of 9", "a loss of 0.25", "a loss of 9")]
    if not all(torch.allclose(a, b) for a, b in zip(replayed, expected)):
        return _wrong("the compiled calls differ from the original's values", hint)
    print(f"right: the original's values and gradients at {len(targets)} targets (the branch point and a zero loss "
          "included), and one recorded path for both sides of the branch")


# ------------------------------------------------------------------------- 08 · debugging gradients
# These checkers ask tt.diagnose and tt.diff (the gradient doctor) rather than compare numbers: the doctor's
# finding is the answer, and for a rule, tt.diff points at the first step where yours departs from torch's.


def first_wrong_step(yours: Callable, reference: Callable, *inputs: Any, where: Optional[str] = None) -> str:
    """Where two functions' backward passes first part (tt.diff): the rule, its line (or `where`, when the call was
    made by a checker rather than in your cell), and whether what it received was already different — what a checker
    prints under a wrong rule."""
    report = tt.diff(yours, reference, *inputs, titles=("yours", "the reference"))
    first = report.first
    if first is None:
        return "tt.diff finds no step where the two backward passes differ"
    received = "it received the right gradient, so this step is wrong" if first.incoming_error == 0 else \
        "the gradient it received was already wrong"
    return f"the first wrong step (tt.diff): {first.rule} at {where or first.line or 'your code'} — {received}"


def _backward_source(rule: type) -> str:
    """Where the student wrote `rule`'s backward: its line in the notebook cell (or file) that defines it."""
    try:
        start = inspect.getsourcelines(rule.backward)[1]
        path = inspect.getsourcefile(rule.backward) or ""
    except (OSError, TypeError):
        return f"your {rule.__name__}.backward"
    cell = "ipykernel" in path or path.startswith("<")
    return f"your {rule.__name__}.backward, " + (f"line {start} of its cell" if cell else
                                                 f"{os.path.basename(path)}:{start}")


def _doctor_says(loss: Callable, model: Optional[torch.nn.Module] = None) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tt.diagnose(loss, model=model)


def _rule_names_around(loss: Callable, first: str) -> Tuple[set, set, str]:
    """loss()'s backward graph around the first rule named `first`: the rules that took its result on (downstream),
    every other rule, and the name of the loss's own last rule."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        node = getattr(loss(), "grad_fn", None)
    seen: Dict[int, bool] = {}
    names: Dict[str, bool] = {}  # rule name -> whether it is downstream of the first non-finite value

    def rule_of(n: Any) -> str:
        return getattr(getattr(n, "rule", None), "__name__", "")

    def reaches_first(n: Any) -> bool:
        if id(n) not in seen:
            seen[id(n)] = False
            children = [child for child, _ in getattr(n, "next_functions", ()) if child is not None]
            below = [reaches_first(child) for child in children]  # every child, so that every rule is named
            seen[id(n)] = rule_of(n) == first or any(below)
            if rule_of(n):
                names[rule_of(n)] = names.get(rule_of(n), False) or (any(below) and rule_of(n) != first)
        return seen[id(n)]

    if node is None:
        return set(), set(), ""
    reaches_first(node)
    downstream = {name for name, below in names.items() if below}
    return downstream, set(names) - downstream, rule_of(node)


def found_the_nan(rule: Any, loss: Callable) -> None:
    """Is `rule` (a rule's name, such as "Exp") the op that made the first non-finite value of loss()?"""
    hint = "the answer is text: the name of a rule, as the doctor prints it in its first finding"
    if rule is None:
        return print("not done yet: fill in the exercise above")
    if not isinstance(rule, str):
        return _wrong(f"answer is a {type(rule).__name__}; give the rule's name as a string", hint)
    first = _doctor_says(loss).first_nonfinite
    if first is not None and rule == first.rule:
        return print("right")
    downstream, others, last = _rule_names_around(loss, first.rule if first is not None else "")
    if rule == last:
        hint = "that is the loss's own last step, where you saw the non-finite number: it only passed on what it " \
               "was given; the doctor follows the chain of non-finite values back to where it began"
    elif rule in downstream:
        hint = "that rule only received a value that was already infinite or NaN and passed it on: follow its " \
               "inputs back to the rule that made the first one out of finite inputs"
    elif rule in others:
        hint = "every value that rule made was finite: look for the rule whose inputs are finite and whose output " \
               "is not (an overflow, a log of 0, a division by 0)"
    else:
        hint = "no rule of that name runs in this loss: give the name exactly as the doctor prints it, the first " \
               "word after the brackets of its first finding"
    print(f"wrong: {rule} is not where the first non-finite value appears\nhint: {hint}")


def dead_layer(answer: Any, network: torch.nn.Sequential, loss: Callable) -> None:
    """Is `answer` the index in `network` of the ReLU that passes no gradient?"""
    hint = "the doctor reports the killed ReLU by module, and in a Sequential a module's name is its index: a " \
           "whole number"
    if answer is None:
        return print("not done yet: fill in the exercise above")
    if isinstance(answer, bool) or not isinstance(answer, int):
        return _wrong(f"answer is a {type(answer).__name__}; give the index of a layer, an int", hint)
    killed = [f.module for f in _doctor_says(loss).of_kind("killed")]
    if str(answer) in killed:
        return print("right")
    if not 0 <= answer < len(network):
        hint = f"the network has {len(network)} layers, numbered from 0: your index names none of them"
    elif any(str(answer + 1) == k and isinstance(network[answer + 1], torch.nn.ReLU) for k in killed):
        hint = "that linear layer is the cause, it makes every input of the next layer negative; the question " \
               "asks for the ReLU that then passes nothing"
    elif not isinstance(network[answer], torch.nn.ReLU):
        hint = f"layer {answer} is a {type(network[answer]).__name__}, not a ReLU: a dead layer is a ReLU whose " \
               "inputs are all negative, so that it passes no gradient"
    else:
        hint = f"the ReLU at {answer} is healthy, it passes about half of its gradient: the doctor reports only " \
               "the one that stops (nearly) all of it"
    print(f"wrong: network[{answer}] is not the dead layer\nhint: {hint}")


def _cut_hint(message: str) -> str:
    """What the doctor's no_path finding says cut the path, as an idea."""
    if "detach" in message:
        return "the gate's output still leaves the graph before it is used: use the tensor itself, so that its " \
               "gradient flows back to the gate"
    if "item" in message or "tolist" in message or "numpy" in message or "cast" in message:
        return "a Python number (or an integer tensor) carries no gradient: keep the gate's output a float tensor " \
               "all the way to the loss"
    if "no_grad" in message:
        return "nothing computed while recording is switched off has a gradient: compute the gate with recording on"
    return "a parameter that is used must reach the loss along recorded operations: call every module whose " \
           "parameters should learn, and keep its output a tensor"


def detached_branch(forward: Callable, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> None:
    """Does the repaired forward(x) compute the loss of model on (x, y) (cross entropy) and reach every parameter of
    model, with torch autograd's gradients?"""
    hint = "the doctor, run on your forward, names the line that cuts the path: use the tensor itself there"
    try:
        value = forward(x)
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            return _wrong(f"your forward returns a tensor of shape {tuple(value.shape)}, not the loss (one number)",
                          "those are the model's scores (logits), one row per example: the loss is the cross entropy "
                          "of those scores against the labels y")
        diagnosis = _doctor_says(lambda: forward(x), model)
    except NotImplementedError:
        return print("not done yet: fill in the exercise above")
    except Exception as error:
        return _wrong(_explain(error), hint)
    cut = diagnosis.of_kind("no_path")
    if cut:
        return _wrong(cut[0].message, _cut_hint(cut[0].message))
    with torch.no_grad():
        expected = F.cross_entropy(_plain(model(x)), y)
    if _close(value, -expected):
        return _wrong("your loss is the model's cross entropy negated",
                      "a negated loss turns every optimizer step into a step uphill: keep the cross entropy's sign")
    if _close(value, torch.zeros(())):
        return _wrong("your loss is zero", "the repair keeps the loss: the cross entropy of the model's scores against "
                                           "y, which is positive; a zero loss gives every parameter a zero gradient")
    if not _close(value, expected):
        return _wrong("your loss is not the model's cross entropy on these examples (repairing the path changes no "
                      "value)", "the repair removes only what cut the gate off: the loss must keep the same value as "
                            "the original forward, with the same layers in the same order")
    names = [name for name, _ in model.named_parameters()]
    owners = [model.get_submodule(name.rpartition(".")[0]) for name in names]
    kept = [p for _, p in model.named_parameters()]

    def with_parameters(inputs: torch.Tensor, *params: torch.Tensor) -> torch.Tensor:
        """forward with the parameters as arguments, so tt.check compares their gradients with torch autograd."""
        for owner, name, p in zip(owners, names, params):
            owner._parameters[name.rpartition(".")[2]] = p
        try:
            return forward(inputs)
        finally:
            for owner, name, p in zip(owners, names, kept):
                owner._parameters[name.rpartition(".")[2]] = p

    check_rule(with_parameters, (_plain(x), *(_plain(p).clone() for p in kept)), hint)


TINY_UPDATE = 1e-4  # a median update/weight ratio below this in every layer: the loss barely moves


def learning_rate(lr: Any, train: Callable) -> None:
    """Does `lr` train without a flag of the training doctor and lower the loss? train(lr) -> (doctor, losses)."""
    if lr is None:
        return print("not done yet: fill in the exercise above")
    if isinstance(lr, bool) or not isinstance(lr, numbers.Real):
        return _wrong(f"lr = {lr!r}: give a positive number", "the learning rate is a plain number, not text or a "
                                                               "container: the size of each step")
    if lr == 0:
        return _wrong("lr = 0: give a positive number", "a rate of zero multiplies every gradient by zero: the "
                                                         "weights never move and the loss stays where it started")
    if lr < 0:
        return _wrong(f"lr = {lr!r}: give a positive number", "a negative rate is gradient ascent: each step goes "
                      "along the gradient, uphill, so the loss grows; the rate sets only the size of a step downhill")
    if not math.isfinite(lr):
        return _wrong(f"lr = {lr!r}: give a positive number", "the learning rate is a finite number: the size of "
                                                               "each step")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        doctor, losses = train(float(lr))
    flags = [f.message.split(":")[0] + f" in layer {f.module}" for f in doctor.findings]
    if flags:
        return _wrong(f"the training doctor flags {', '.join(sorted(set(flags)))}",
                      "too large: each update moves the weights by a large share of their size; read the "
                      "update/weight ratios in the doctor's table and lower the rate until they sit near a thousandth")
    ratios = [statistics.median(r) for r in ([s.update_ratio for s in h.steps if s.update_ratio is not None]
                                             for h in doctor.history.values()) if r]
    if not losses[-1] < losses[0] or not ratios or max(ratios) < TINY_UPDATE:
        moved = f"the loss went from {losses[0]:.6f} to {losses[-1]:.6f}" if losses else "no step was taken"
        return _wrong(f"no flag, but {moved}: the learning rate is too small to train",
                      "too small: the updates are a tiny share of the weights (the doctor's update/weight column), "
                      "so the loss barely moves; raise the rate until the updates are near a thousandth of the weights")
    print("right: no flag, and the loss went down")


def bf16_step(rule: Any, float32: Callable, bfloat16: Callable, rtol: float) -> None:
    """Is `rule` the first rule whose gradient differs by more than rtol between float32 and bfloat16 autocast?"""
    hint = "the answer is text: the name of the rule that the diff of the two passes reports first"
    if rule is None:
        return print("not done yet: fill in the exercise above")
    if not isinstance(rule, str):
        return _wrong(f"answer is a {type(rule).__name__}; give the rule's name as a string", hint)
    if not rule.strip():
        return _wrong("the answer is empty", "run tt.diff on the two losses and read the first rule it reports: "
                                             "its name is the answer")
    report = tt.diff(float32, bfloat16, rtol=rtol)
    first = report.first
    if first is not None and rule == first.rule:
        return print("right")
    differing = {d.rule for d in report.divergences}
    if first is not None and rule.strip().lstrip("-+").lower() == first.rule.lower():
        hint = "that is the rule, spelled otherwise: give its name exactly as the report prints it (capitals " \
               "included, nothing added)"
    elif rule in differing:
        hint = "that rule's gradient differs too, but later in backward order, where the gradient it received " \
               "already differed: the answer is the earliest differing rule in backward order"
    elif rule in {step.rule for step in report.a.steps}:
        hint = f"that rule's gradients agree within rtol={rtol:g}: look at the rules the report lists as differing, " \
               "and take the first of them in backward order"
    else:
        hint = "no rule of that name runs in this backward pass: give the name as the report prints it, the first " \
               "word of its first divergence"
    print(f"wrong: {rule!r} is not the first step beyond rtol={rtol:g}\nhint: {hint}")


def _gelu_tanh_mistakes() -> list:
    """(dy/dx, hint) of the usual slips for y = x Φ(x), Φ = (1 + tanh u) / 2, u = c (x + k x^3)."""
    c, k = math.sqrt(2 / math.pi), 0.044715

    def parts(x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        t = torch.tanh(c * (x + k * x ** 3))
        return 0.5 * (1 + t), t, c * (1 + 3 * k * x ** 2)

    def exact(x: torch.Tensor) -> torch.Tensor:
        return 0.5 * (1 + torch.erf(x / math.sqrt(2))) + x * torch.exp(-x ** 2 / 2) / math.sqrt(2 * math.pi)

    def slip(slope: Callable[[torch.Tensor], torch.Tensor]) -> Callable[..., list]:
        return lambda x, g: [g * slope(x)]

    return [(slip(lambda x: parts(x)[0]), "the product rule: x Φ(x) has two factors that depend on x, and you "
                                          "differentiated only one of them; add x times the slope of Φ"),
            (slip(lambda x: x * 0.5 * (1 - parts(x)[1] ** 2) * parts(x)[2]), "the product rule has two terms: you "
             "kept the one with the slope of Φ and dropped Φ itself"),
            (slip(lambda x: parts(x)[0] + x * 0.5 * (1 - parts(x)[1] ** 2)), "the chain rule through tanh(u): "
             "multiply by the slope of u with respect to x as well"),
            (slip(lambda x: parts(x)[0] + x * 0.5 * (1 - parts(x)[1]) * parts(x)[2]), "the slope of tanh is one "
             "minus its square, not one minus itself"),
            (slip(lambda x: parts(x)[0] + x * 0.5 * (1 - parts(x)[1] ** 2) * c), "the chain rule through u = c (x + "
             "k x^3): its slope is c times the slope of x + k x^3, whose cubic term you left out"),
            (slip(lambda x: parts(x)[0] + x * 0.5 * (1 - parts(x)[1] ** 2) * parts(x)[2] / c), "the chain rule through "
             "u = c (x + k x^3): the constant c in front of u multiplies its slope too"),
            (slip(exact), "that is the slope of the exact GELU, with the Gaussian's integral: this rule's forward is "
                          "the tanh approximation, so differentiate that one")]


@_takes_rule
def repaired_rule(rule: type) -> None:
    """The student's GELU-with-tanh rule against torch's F.gelu(approximate='tanh'); when wrong, tt.diff's first
    wrong step."""
    x, w = torch.randn(6, 5, generator=torch.Generator().manual_seed(1)), torch.randn(5, 3) / 3
    general = "d/dx [x Φ(x)] = Φ(x) + x Φ'(x) (the product rule), and Φ'(x) is the slope of tanh at u times the " \
              "slope of u with respect to x (the chain rule, both factors of u = c (x + k x^3))"
    hint = lambda: rule_hint(rule.apply, lambda a: F.gelu(a, approximate="tanh"), [(8,)],  # noqa: E731
                             general=general, mistakes=_gelu_tanh_mistakes())
    if check_rule(lambda a: rule.apply(a @ w), (x,), hint):
        return
    try:
        reference = lambda a: F.gelu(a @ w, approximate="tanh").pow(2).sum()  # noqa: E731
        print(first_wrong_step(lambda a: rule.apply(a @ w).pow(2).sum(), reference, tt.tracer(x, requires_grad=True),
                               where=_backward_source(rule)))
    except NotImplementedError:
        pass


# ------------------------------------------------------------------------- 08 · a normalisation without eps

STANDARDISE_EPS = 1e-5
EPS_INSIDE = "add a small eps to the variance inside the root, (var + 1e-5).sqrt(), as nn.LayerNorm does"


def _rows_with_a_blank(width: int = 16) -> torch.Tensor:
    """Six rows of features; row 2 is blank (all values equal: variance 0)."""
    rows = torch.randn(6, width, generator=torch.Generator().manual_seed(2)) * 3 + 1
    rows[2] = 0.0
    return rows


def _deviation(t: torch.Tensor) -> torch.Tensor:
    return t - t.mean(-1, keepdim=True)


def _standardise_mistakes() -> list:
    """(what the usual slip computes, in plain torch, and its hint)."""
    eps = STANDARDISE_EPS
    return [
        (lambda t: _deviation(t) / (t.var(-1, keepdim=True) + eps).sqrt(),
         "torch.var and torch.std divide by n - 1 by default; a layer norm's variance is the mean of the squared "
         "deviations, over n: var(-1, unbiased=False, keepdim=True)"),
        (lambda t: (t - t.mean(-1, keepdim=True).detach()) / (_deviation(t).pow(2).mean(-1, keepdim=True).detach()
                                                              + eps).sqrt(),
         "the values are right but the mean and the variance were cut from the graph (.detach() or .data): they "
         "depend on the row too, and their gradient is part of the layer's"),
    ]


def _plain_grad(fn: Callable, rows: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    leaf = rows.clone().requires_grad_(True)
    (fn(leaf) * weight).sum().backward()
    return leaf.grad.double()


def standardised(standardise: Callable) -> None:
    """Does standardise(rows) give F.layer_norm(rows, (width,), eps=1e-5)'s values and torch autograd's gradients,
    finite at a blank row (variance 0)?"""
    rows = _rows_with_a_blank()
    weight = torch.randn(rows.shape, generator=torch.Generator().manual_seed(3))
    leaf = tt.tracer(rows.clone(), requires_grad=True)
    try:
        out = standardise(leaf)
        (out * weight).sum().backward()
    except NotImplementedError:
        return print("not done yet: fill in the exercise above")
    except Exception as error:
        return _wrong(_explain(error), "standardise takes a tensor of rows and returns one of the same shape: a "
                                       "statistic of each row keeps its dimension (keepdim=True) to broadcast")
    values, grad = _plain(out).double(), leaf.grad  # compared in float64, whatever dtype standardise computes in
    if values.shape != rows.shape:
        return _wrong(f"your result has shape {tuple(values.shape)}, the rows {tuple(rows.shape)}",
                      "standardise each row on its own: keep the shape (mean and variance with keepdim=True)")
    if not torch.isfinite(values).all():
        return _wrong("row 2 (all its values are equal: variance 0) gives NaN: (x - mean) / sqrt(0) = 0 / 0",
                      EPS_INSIDE)
    if grad is None or not torch.isfinite(_plain(grad)).all():
        return _wrong("the values are finite now, but the gradient at row 2 is not",
                      "the slope of sqrt(v) is 1 / (2 sqrt v), infinite at v = 0: an eps added after the root keeps "
                      "the forward finite but not the backward; " + EPS_INSIDE)
    grad = _plain(grad).double()
    width = rows.shape[-1]
    reference = lambda t: F.layer_norm(t, (width,), eps=STANDARDISE_EPS)  # noqa: E731
    expected = reference(rows).double()
    if not torch.allclose(values, expected, rtol=1e-4, atol=1e-5):
        hint = next((h for slip, h in _standardise_mistakes()
                     if torch.allclose(values, slip(rows).double(), atol=1e-5)), None)
        if hint is None and torch.allclose(values, expected, atol=1e-1):
            hint = "eps only guards against a variance of 0: keep it small (1e-5), or it changes every row's values"
        return _wrong(f"your values differ from F.layer_norm(rows, ({width},), eps=1e-5) by up to "
                      f"{float((values - expected).abs().max()):.2g}",
                      hint or "each row: subtract its mean, divide by the root of (the mean of the squared deviations "
                              "+ eps)")
    expected_grad = _plain_grad(reference, rows, weight)
    if not torch.allclose(grad, expected_grad, rtol=1e-4, atol=1e-5):
        hint = next((h for slip, h in _standardise_mistakes()
                     if torch.allclose(grad, _plain_grad(slip, rows, weight), rtol=1e-4, atol=1e-5)), None)
        return _wrong("your values are right, but the gradient differs from torch autograd's through F.layer_norm by "
                      f"up to {float((grad - expected_grad).abs().max()):.2g}",
                      hint or "let the gradient flow through the mean and the variance as well as through x")
    print("right: finite at the blank row, the values of F.layer_norm(eps=1e-5), and torch autograd's gradients")
