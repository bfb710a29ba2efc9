"""The exercise checkers of the teaching notebooks (`import checkers` in a notebook of this folder).

Each prints `right`, `not done yet`, or `wrong` with what went wrong: tt.check's whole message (which gradient
differs and the first diverging node, named after your rule) and a hint for the exercise. They test the points
where rules usually fail on purpose (kinks, zeros, saturation), never print the values they expect, and treat
an exception in your code (a wrong type, a wrong number of gradients) as a wrong answer, not a crash.
"""
import functools
import math
import numbers
from typing import Any, Callable, Dict, Optional, Sequence

import torch
import torch.nn.functional as F

import torchtrace as tt

Inputs = Sequence[torch.Tensor]


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
        if not torch.allclose(_plain(got).double(), b.grad.double(), rtol=rtol, atol=atol, equal_nan=True):
            where = ", ".join(f"{v:g}" for v in _plain(a).flatten()[((got - b.grad).abs() > atol).flatten()][:4])
            raise tt.GradientMismatch(f"gradient of input {i} differs from torch's convention at x = {where}")


def check_rule(fn: Callable, inputs: Inputs, hint: str, edges: Sequence[Inputs] = (),
               reference: Optional[Callable] = None) -> bool:
    """tt.check of fn at `inputs` and at every tuple of `edges`; `reference`: the same math in torch, whose gradient
    fixes the convention at kinks (tt.check alone compares your backward with your own forward). True when right."""
    try:
        report = tt.check(fn, *inputs, check_inputs=list(edges))
        for points in edges if reference is not None else ():
            _same_gradients(fn, reference, points)
    except NotImplementedError:
        print("not done yet: fill in the exercise above")
    except Exception as error:
        _wrong(_explain(error), hint)
    else:
        print(f"right: the gradients match torch autograd ({report.n_gradients} gradients, "
              f"{1 + len(edges)} sets of points including the edge cases)")
        return True
    return False


def check_by_finite_differences(fn: Callable, inputs: Inputs, hint: str, edges: Sequence[Inputs] = ()) -> None:
    """For an op torch cannot differentiate: tt.gradcheck (central differences, float64) at inputs and edges."""
    try:
        for points in [inputs, *edges]:
            tt.gradcheck(fn, *[x.double() for x in points])
    except NotImplementedError:
        print("not done yet: fill in the exercise above")
    except Exception as error:
        _wrong(_explain(error), hint)
    else:
        print(f"right: the gradients match finite differences ({1 + len(edges)} sets of points including the edges)")


# ------------------------------------------------------------------------- 00 · backprop by hand


def by_hand_numbers(a_val: float, b_val: float, dq_da: Any, dq_db: Any) -> None:
    """The student's numbers for q = a^2 b + sin(a b), against torch autograd."""
    hint = "a reaches q along two paths, through u = a^2 and through w = a b: add the products of the local " \
           "derivatives along each path (b likewise, through v and w)"
    if dq_da is None or dq_db is None:
        return print("not done yet: fill in the exercise above")
    if not all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in (dq_da, dq_db)):
        return _wrong("give both gradients as numbers (int or float)", hint)
    a, b = (torch.tensor(float(v), dtype=torch.float64, requires_grad=True) for v in (a_val, b_val))
    (a ** 2 * b + torch.sin(a * b)).backward()
    off = [name for name, got, t in (("dq/da", dq_da, a), ("dq/db", dq_db, b))
           if not abs(got - t.grad.item()) <= 1e-4 * max(1.0, abs(t.grad.item()))]  # `not <=`: NaN is wrong
    print("right" if not off else f"wrong: {' and '.join(off)} differ from the chain rule's\nhint: {hint}")


@_takes_rule
def tanh(rule: type) -> None:
    check_rule(lambda x, w, b: rule.apply(x @ w + b), (torch.randn(4, 3), torch.randn(3), torch.randn(())),
               hint="save the output y = tanh(x) in forward; the slope is 1 - y^2, times the incoming gradient",
               edges=[(torch.tensor([[-20.0], [0.0], [20.0]]), torch.ones(1), torch.zeros(()))],
               reference=lambda x, w, b: torch.tanh(x @ w + b))


def central_slope(slope: Callable) -> None:
    """(f(x + h) - f(x - h)) / 2h: at least 100 times closer than the one-sided slope for x^3 at 2, exact for x^2 at
    0, and the formula itself for e^x at 1 with h = 0.1 (where it differs from the exact derivative e)."""
    hint = "evaluate f on both sides of x: (f(x + h) - f(x - h)) / (2 h)"
    try:
        central = abs(slope(lambda x: x ** 3, 2.0, 1e-2) - 12)
        at_zero = abs(slope(lambda x: x ** 2, 0.0, 1e-2))
        formula = abs(slope(math.exp, 1.0, 0.1) - (math.exp(1.1) - math.exp(0.9)) / 0.2)
    except NotImplementedError:
        return print("not done yet: fill in the exercise above")
    except Exception as error:
        return _wrong(_explain(error), hint)
    one_sided = abs(((2.0 + 1e-2) ** 3 - 2.0 ** 3) / 1e-2 - 12)
    if not (central * 100 < one_sided and at_zero < 1e-12 and formula < 1e-9):
        return _wrong("your slope is not the central difference (tried on x^3 at 2, x^2 at 0 and e^x at 1)", hint)
    print(f"right: one-sided error {one_sided:.2e}, central error {central:.2e}")


# ------------------------------------------------------------------------- 01 · tracer basics


@_takes_rule
def cube(rule: type) -> None:
    check_rule(lambda x, w: rule.apply(x * w).sum(), (torch.randn(5), torch.randn(5)),
               hint="dy/dx = 3 x^2, times the incoming gradient",
               edges=[(torch.tensor([0.0, -1.0, 2.0]), torch.ones(3))],
               reference=lambda x, w: ((x * w) ** 3).sum())


def prediction(predict: Callable) -> None:
    """The student's predicted x.grad for (y * y.detach()).sum() with y = x * x, without printing the answer."""
    hint = "y.detach() is a constant c: d/dx (y c) = c dy/dx, and only one of the two factors carries a gradient"
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
    print("right" if not off else f"wrong at x = {', '.join(off)}\nhint: {hint}")


# ------------------------------------------------------------------------- 02 · writing gradient rules


@_takes_rule
def softplus(rule: type) -> None:
    check_rule(lambda x, w: rule.apply(x @ w), (torch.randn(4, 3), torch.randn(3, 2)),
               hint="the derivative of log(1 + e^x) is a function you know from logistic regression; torch has it, "
                    "computed without overflow for large |x|",
               edges=[(torch.tensor([[-30.0], [-2.0], [0.0], [2.0], [30.0]]), torch.ones(1, 1))],
               reference=lambda x, w: F.softplus(x @ w))


@_takes_rule
def leaky(rule: type) -> None:
    check_rule(lambda x: rule.apply(x, 0.1) * (x + 1), (torch.randn(10),),
               hint="at x = 0 the slope is s (torch's leaky_relu: slope 1 only for x > 0); backward returns one "
                    "gradient per forward argument, None for the number s",
               edges=[(torch.tensor([-2.0, -0.5, 0.0, 0.0, 1.5]),)],
               reference=lambda x: F.leaky_relu(x, 0.1) * (x + 1))


# ------------------------------------------------------------------------- 03 · layers and training


@_takes_rule
def mse(rule: type) -> None:
    x, w = torch.randn(8, 4), torch.randn(4, 3)
    check_rule(lambda x, w, t: rule.apply(x @ w, t), (x, w, torch.randn(8, 3)),
               hint="two inputs, two gradients; the mean divides by the number of elements, and t enters with the "
                    "opposite sign of p; grad (the upstream gradient) multiplies both",
               edges=[(x, w, (x @ w).detach())])  # p == t: the residual is zero


@_takes_rule
def swish(rule: type) -> None:
    check_rule(lambda x, w1, w2: rule.apply(x @ w1) @ w2,
               (torch.randn(16, 64), torch.randn(64, 32) / 8, torch.randn(32, 10)),
               hint="product rule on x * sigmoid(x), with sigmoid' = sigmoid (1 - sigmoid)",
               edges=[(torch.tensor([[-20.0, -1.0, 0.0, 1.0, 20.0]]), torch.eye(5), torch.ones(5, 1))],
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
                      f"{linear[-1]})", hint)
    smallest = min(linear, key=lambda i: network[i].weight.abs().mean().item())
    print("right" if answer == smallest else "wrong: that layer's gradients are healthy\nhint: " + hint)


@_takes_rule
def sigmoid(rule: type, width: int) -> None:
    check_rule(lambda a, w: rule.apply(a @ w), (torch.randn(8, width), torch.randn(width, width)),
               hint="save the output y in forward, not the input: the slope is y (1 - y)",
               edges=[(torch.tensor([[-40.0, -5.0, 0.0, 5.0, 40.0]]), torch.eye(5))],
               reference=lambda a, w: torch.sigmoid(a @ w))


# ------------------------------------------------------------------------- 05 · porting torch models


def bessel_i0(layer: Callable) -> None:
    """The registered rule for torch.special.modified_bessel_i0 (torch has no derivative: finite differences)."""
    check_by_finite_differences(lambda x: layer(x * 2), (torch.randn(12),),
                                hint="the derivative of I0 is I1 (torch.special.modified_bessel_i1), an odd function "
                                     "of x; multiply it by the incoming gradient",
                                edges=[(torch.tensor([-2.5, -1.0, 0.0, 0.0, 1.0, 2.5]),)])


# ------------------------------------------------------------------------- 06 · higher order


@_takes_rule
def quartic(rule: type) -> None:
    check_rule(lambda x: rule.apply(x) * 2, (torch.randn(6),),
               hint="dy/dx = 4 x^3, times the incoming gradient", edges=[(torch.tensor([-2.0, 0.0, 0.5, 3.0]),)],
               reference=lambda x: x ** 4 * 2)


@_takes_rule
def quartic_second_derivative(rule: type) -> None:
    x = tt.tracer([-1.0, 0.0, 0.5, 2.0], requires_grad=True)
    hint = "compute backward with torch ops on the saved tracer (no .detach(), .item() or numpy), so that " \
           "create_graph=True records it"
    try:
        (g,) = tt.grad(rule.apply(x).sum(), x, create_graph=True)
        (h,) = tt.grad(g.sum(), x)
    except NotImplementedError:
        return print("not done yet: fill in the exercise above")
    except Exception as error:
        return _wrong(_explain(error), hint)
    wrong_at = [f"{v:g}" for v, ok in zip(x.tolist(), torch.isclose(_plain(h), 12 * _plain(x) ** 2).tolist())
                if not ok]
    print("second derivative: right" if not wrong_at else
          f"second derivative: wrong at x = {', '.join(wrong_at)}\nhint: {hint}")


def hessian(build: Callable, x0: torch.Tensor) -> None:
    """H of f(x) = sum x_i^4 + x_1 x_2 at x0, built by the student from Hessian-vector products."""
    hint = "row i of H is the Hessian-vector product with e_i: g = tt.grad(f(x), x, create_graph=True)[0], then " \
           "tt.grad(g @ e_i, x, retain_graph=True)"
    try:
        H = torch.as_tensor(build(x0))
    except NotImplementedError:
        return print("not done yet: fill in the exercise above")
    except Exception as error:
        return _wrong(_explain(error), hint)
    if H.shape != (3, 3):
        return _wrong(f"expected a (3, 3) tensor, got shape {tuple(H.shape)}", hint)
    expected = torch.diag(12 * x0 ** 2) + torch.tensor([[0.0, 1, 0], [1, 0, 0], [0, 0, 0]])
    bad = [(i, j) for i in range(3) for j in range(3) if not torch.isclose(_plain(H)[i, j].float(), expected[i, j])]
    if bad:
        return _wrong(f"entries {', '.join(map(str, bad))} differ", hint)
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


def _check_values(Value: type, cases: Sequence[Any], hint: str) -> None:
    try:
        for label, expression, points in cases:
            problem = _value_case(Value, expression, points)
            if problem:
                where = ", ".join(f"{name} = {p:g}" for name, p in zip("abcd", points))
                return _wrong(f"{label} at {where}: {problem}", hint)
    except NotImplementedError:
        return print("not done yet: fill in the exercise above")
    except Exception as error:
        return _wrong(_explain(error), hint)
    print(f"right: your Value's gradients match torch autograd ({len(cases)} expressions, kinks and zeros included)")


def value_pow_exp(Value: type) -> None:
    cases = [("a ** 3", lambda a: a ** 3, (p,)) for p in (-1.5, 0.0, 2.0)]
    cases += [("a ** -1", lambda a: a ** -1, (p,)) for p in (-0.5, 3.0)]
    cases += [("a.exp()", lambda a: a.exp(), (p,)) for p in (-2.0, 0.0, 1.0)]
    cases += [("a ** 2 * a.exp()  (a used twice)", lambda a: a ** 2 * a.exp(), (p,)) for p in (-1.0, 0.0, 0.5)]
    _check_values(Value, cases, "d(x^k)/dx = k x^(k-1) and d(e^x)/dx = e^x, each times out.grad, added (+=) into "
                                "self.grad")


def value_sub_div(Value: type) -> None:
    cases = [("a - b", lambda a, b: a - b, (2.0, 5.0)), ("a - b", lambda a, b: a - b, (1.5, 1.5)),
             ("a / b", lambda a, b: a / b, (3.0, -2.0)), ("a / b", lambda a, b: a / b, (0.0, 4.0)),
             ("(a - b) / (a * b)", lambda a, b: (a - b) / (a * b), (2.0, 2.0)),
             ("(a - b) / (a * b)", lambda a, b: (a - b) / (a * b), (-1.0, 3.0))]
    _check_values(Value, cases, "a - b = a + (-1) * b and a / b = a * b ** -1: built from ops that already have "
                                "_backward closures, they need none of their own")


# ------------------------------------------------------------------------- 01a · training by hand


def _trajectories(step: Callable, reference: Callable, steps: int = 5) -> Optional[int]:
    """The first step after which the student's update and tt.optim.SGD's disagree (None: they agree)."""
    torch.manual_seed(0)
    ours = tt.nn.Sequential(tt.nn.Linear(3, 4), tt.nn.Tanh(), tt.nn.Linear(4, 1))
    theirs = tt.nn.Sequential(tt.nn.Linear(3, 4), tt.nn.Tanh(), tt.nn.Linear(4, 1))
    theirs.load_state_dict(ours.state_dict())
    optimizer = reference(theirs.parameters())
    x, y = torch.randn(16, 3), torch.randn(16, 1)
    state: dict = {}
    for k in range(steps):
        for model in (ours, theirs):
            model.zero_grad()
            F.mse_loss(model(x), y).backward()
        with tt.no_grad():
            step(list(ours.parameters()), state)
        optimizer.step()
        if not all(torch.allclose(_plain(p), _plain(q), rtol=1e-5, atol=1e-7)
                   for p, q in zip(ours.parameters(), theirs.parameters())):
            return k + 1
    return None


def _check_update(step: Callable, reference: Callable, what: str, hint: str) -> None:
    try:
        differs = _trajectories(step, reference)
    except NotImplementedError:
        return print("not done yet: fill in the exercise above")
    except Exception as error:
        return _wrong(_explain(error), hint)
    if differs:
        return _wrong(f"after step {differs} your parameters differ from {what}'s", hint)
    print(f"right: 5 steps of your update equal {what}'s")


def momentum_step(update: Callable) -> None:
    """update(params, velocities, lr, momentum) on lists of tensors, velocities starting at zero."""
    def step(params: list, state: dict) -> None:
        velocities = state.setdefault("v", [torch.zeros_like(_plain(p)) for p in params])
        update(params, velocities, 0.1, 0.9)

    _check_update(step, lambda ps: tt.optim.SGD(ps, lr=0.1, momentum=0.9), "tt.optim.SGD(lr=0.1, momentum=0.9)",
                  "v = momentum * v + p.grad, then p -= lr * v; update both in place (v.mul_(...).add_(...)), "
                  "so the velocities persist from one step to the next")


def weight_decay_step(update: Callable) -> None:
    """update(params, lr, weight_decay) on a list of tensors."""
    _check_update(lambda params, state: update(params, 0.1, 0.01),
                  lambda ps: tt.optim.SGD(ps, lr=0.1, weight_decay=0.01), "tt.optim.SGD(lr=0.1, weight_decay=0.01)",
                  "the decay adds weight_decay * p to the gradient before the step: p -= lr * (p.grad + wd * p)")


# ------------------------------------------------------------------------- 06a · forward and reverse mode


def _functions() -> list:
    w = torch.randn(4, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    return [("sin(x) * x", lambda x: torch.sin(x) * x), ("w @ x", lambda x: w @ x),
            ("tanh(w @ x).sum()", lambda x: torch.tanh(w @ x).sum()), ("x.cumsum(0)", lambda x: x.cumsum(0))]


def _check_products(compute: Callable, reference: Callable, hint: str) -> None:
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
                        return _wrong(f"for f(x) = {label} at {where} along {along}{shape}", hint)
    except NotImplementedError:
        return print("not done yet: fill in the exercise above")
    except Exception as error:
        return _wrong(_explain(error), hint)
    print("right: your products equal torch.func's (4 functions, zero points and zero tangents included)")


def jvp_by_hand(jvp: Callable) -> None:
    """jvp(f, x, v) -> J v, from two reverse passes."""
    _check_products(jvp, lambda f, x, v: torch.func.jvp(f, (x,), (v,))[1],
                    "u = tt.zeros(shape of f(x), requires_grad=True); g = tt.grad(y, x, u, create_graph=True)[0] "
                    "is J^T u; then tt.grad(g, u, v) is J v (allow_unused=True when a part does not depend on x)")


def hvp_forward_over_reverse(hvp: Callable) -> None:
    """hvp(f, x, v) -> H v for a scalar f: tt.jvp of the gradient function."""
    def reference(f: Callable, x: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.func.jvp(torch.func.grad(lambda t: f(t).sum()), (x,), (v,))[1]

    _check_products(lambda f, x, v: hvp(lambda t: f(t).sum(), x, v), reference,
                    "H v is the forward-mode derivative of the gradient along v: tt.jvp(grad_f, (x,), (v,)) where "
                    "grad_f(t) = tt.grad(f(t), t, create_graph=True)[0]")


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
    hint = "save x in forward and return grad * torch.sigmoid(x), with torch ops only (no .item(), numpy or Python " \
           "numbers from the data): the code replays exactly the torch calls your backward made"

    def loss(w: torch.Tensor) -> torch.Tensor:
        return rule.apply(w * 2).sum()

    edges = torch.tensor([-20.0, -0.5, 0.0, 0.5, 20.0])
    if not check_rule(loss, (torch.randn(5),), hint, edges=[(edges,)], reference=lambda w: F.softplus(w * 2).sum()):
        return
    try:
        example = tt.randn(5, requires_grad=True)
        compiled = tt.compile(loss, (example,))
        block = _rule_block(tt.trace(loss, example).to_code(), rule.__name__)
        generated = _generated_gradient(compiled.code, edges.clone())
    except Exception as error:
        return _wrong(_explain(error), hint)
    w = edges.clone().requires_grad_()
    F.softplus(w * 2).sum().backward()
    if block is None:
        return _wrong(f"the generated backward has no block headed '# {rule.__name__}'", hint)
    if generated.shape != w.shape or not torch.allclose(generated, w.grad, rtol=1e-5, atol=1e-6):
        return _wrong("the generated backward, run at new points (saturation and zero), differs from torch autograd: "
                      "something computed from the example's values was frozen into the code", hint)
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
    if ours.shape != theirs.shape or not torch.allclose(ours, theirs):
        return "the value differs from the original's"
    if not all(torch.allclose(a, b, rtol=1e-5, atol=1e-7) for a, b in zip(our_grads, their_grads)):
        return "the value is right, the gradients of the model's parameters differ from the original's"
    return None


def step_with_one_path(fn: Callable, reference: Callable, model: torch.nn.Module, x: torch.Tensor) -> None:
    """fn(x, target) must equal reference(x, target), value and parameter gradients, on both sides of the original's
    branch, exactly at it (a loss of 1) and at a zero loss; and tt.compile(fn), called on both sides of the branch,
    must record one path (a program without a branch) and give the original's values."""
    hint = "compute both results as tensors and let torch.where(loss > 1, ...) pick one (strictly greater, as the " \
           "original); no .item(), bool(), if or comparison that Python reads"
    try:
        y = _plain(model(x))
        targets = {"a loss of 9": y - 3, "a loss of exactly 1 (the branch point)": _target_at_loss_one(y),
                   "a loss of 0.25": y - 0.5, "a loss of 0": y.clone()}
        for label, target in targets.items():
            problem = _step_difference(fn, reference, model, x, target)
            if problem:
                return _wrong(f"at {label}: {problem}", hint)
        compiled = tt.compile(fn, (x, targets["a loss of 9"]))
        replayed = [_plain(compiled(x, targets[label])) for label in ("a loss of 9", "a loss of 0.25", "a loss of 9")]
        paths = len(compiled.program.paths())
    except NotImplementedError:
        return print("not done yet: fill in the exercise above")
    except Exception as error:
        return _wrong(_explain(error), hint)
    if paths != 1:
        return _wrong(f"the compiled step took {paths} paths: Python still decides which torch calls run", hint)
    expected = [_plain(reference(x, targets[label])) for label in ("a loss of 9", "a loss of 0.25", "a loss of 9")]
    if not all(torch.allclose(a, b) for a, b in zip(replayed, expected)):
        return _wrong("the compiled calls differ from the original's values", hint)
    print(f"right: the original's values and gradients at {len(targets)} targets (the branch point and a zero loss "
          "included), and one recorded path for both sides of the branch")
