"""The exercise checkers of lesson 10 (curvature): `import curvature_checkers` in a notebook of this folder.

Each prints `right`, `not done yet`, or `wrong` with what differs and a hint. The hint depends on the mistake:
the checker compares a wrong answer with what each common mistake would give (a missing mixed term, a first
derivative where a second belongs, the smallest eigenvalue for the largest, the Hessian where its inverse
belongs, ...) and names the idea behind the first one that explains it; never the code to write, never the
values it expects. An exception in your code is a wrong answer, not a crash.
"""
from typing import Any, Callable, List, Optional, Sequence, Tuple

import torch

import torchtrace as tt

Mistake = Tuple[Callable[[], Any], str]


def _wrong(what: str, hint: str) -> None:
    print(f"wrong: {what}\nhint: {hint}")


def _tensor(value: Any) -> Optional[torch.Tensor]:
    try:
        return torch.as_tensor(value).detach().as_subclass(torch.Tensor).double()
    except (TypeError, ValueError, RuntimeError):
        return None


def _close(got: Optional[torch.Tensor], expected: torch.Tensor) -> bool:
    return got is not None and got.shape == expected.shape and bool(torch.isfinite(got).all()) and \
        torch.allclose(got, expected.double(), rtol=1e-5, atol=1e-8)


def _first_matching(got: Optional[torch.Tensor], mistakes: Sequence[Mistake]) -> Optional[str]:
    for result, hint in mistakes:
        if _close(got, torch.as_tensor(result()).double()):
            return hint
    return None


def _answer(student: Callable, *args: Any) -> Tuple[Optional[torch.Tensor], Optional[str]]:
    """(the answer as a float64 tensor, None) or (None, 'not done' / the error's description)."""
    try:
        answer = student(*args)
    except NotImplementedError:
        return None, "not done"
    except Exception as error:  # a wrong type, a wrong shape: a wrong answer, not a crash
        return None, f"your code raised {type(error).__name__}: {str(error).strip()}"
    value = _tensor(answer)
    return (value, None) if value is not None else (None, f"your answer is a {type(answer).__name__}, not numbers")


# ------------------------------------------------------------------------- 1 · a Hessian by hand

HESSIAN_POINTS = [(1.0, 2.0), (-0.5, 3.0), (2.0, -1.5)]


def hessian_by_hand(student: Callable[[float, float], Any]) -> None:
    """H of f(a, b) = a³ + a b² at a few points, written by hand as a 2×2 tensor [[f_aa, f_ab], [f_ba, f_bb]]."""
    general = "differentiate f twice: row i is the gradient of ∂f/∂(i-th variable); the mixed entries differentiate " \
              "once by each variable"
    for a, b in HESSIAN_POINTS:
        got, error = _answer(student, a, b)
        if error == "not done":
            return print("not done yet: fill in the exercise above")
        if error:
            return _wrong(error, "return a 2×2 tensor of numbers: one row and one column per variable")
        expected = tt.hessian(lambda x: x[0] ** 3 + x[0] * x[1] ** 2, torch.tensor([a, b], dtype=torch.float64))
        if got.shape != (2, 2):
            return _wrong(f"expected a 2×2 tensor, got shape {tuple(got.shape)}",
                          "two variables give a 2×2 Hessian: one row and one column per variable")
        if not _close(got, expected):
            mistakes: List[Mistake] = [
                (lambda: [[6 * a, 0], [0, 2 * a]], "the mixed term a b² makes f_ab nonzero: the off-diagonal entries "
                                                   "are missing"),
                (lambda: [[3 * a ** 2 + b ** 2, 2 * a * b], [2 * a * b, 2 * a]],
                 "the top-left entry is a first derivative: differentiate ∂f/∂a once more with respect to a"),
                (lambda: [[3 * a, b], [b, a]], "every entry is half of what it should be: the power rule brings "
                                                "the exponent down (d/dx x² = 2x)"),
                (lambda: [[6 * a, 4 * b], [4 * b, 2 * a]], "the mixed entries count the mixed term twice: ∂²f/∂a∂b is "
                                                           "one entry, and the matrix holds it in both corners"),
                (lambda: [[2 * a, 2 * b], [2 * b, 6 * a]], "the diagonal is swapped: the top-left entry is ∂²f/∂a², "
                                                           "the bottom-right ∂²f/∂b²"),
            ]
            return _wrong(f"your Hessian at (a, b) = ({a}, {b}) differs from tt.hessian's",
                          _first_matching(got, mistakes) or general)
    print("right")


# ------------------------------------------------------------------------- 2 · the stable learning rate

def _stable_cases() -> List[torch.Tensor]:
    rotation = torch.tensor([[0.8, -0.6], [0.6, 0.8]], dtype=torch.float64)
    return [torch.diag(torch.tensor([1.0, 10.0], dtype=torch.float64)),
            rotation @ torch.diag(torch.tensor([0.5, 4.0], dtype=torch.float64)) @ rotation.T,
            torch.tensor([[3.0, 1.0, 0.0], [1.0, 2.0, 0.5], [0.0, 0.5, 1.0]], dtype=torch.float64)]


def _one_rate_hint(got: torch.Tensor, eigenvalues: torch.Tensor) -> Optional[str]:
    """The hint for several numbers where one learning rate belongs, when they are each direction's own threshold."""
    if _close(got.flatten(), 2 / eigenvalues) or _close(got.flatten(), (2 / eigenvalues).flip(0)):
        return "each eigen-direction has a threshold of its own; one η is used for all of them at once, so it must " \
               "keep every direction stable"
    return None


def stable_learning_rate(student: Callable[[torch.Tensor], Any]) -> None:
    """The largest η for which gradient descent on ½ θᵀ H θ converges: 2 / λ_max(H)."""
    general = "on a quadratic, each eigen-direction of H is multiplied by (1 − η λ) per step; the step converges " \
              "when every such factor has magnitude below 1"
    for H in _stable_cases():
        got, error = _answer(student, H.clone())
        if error == "not done":
            return print("not done yet: fill in the exercise above")
        if error:
            return _wrong(error, "return one number: the learning rate")
        eigenvalues = torch.linalg.eigvalsh(H)
        if got.numel() != 1:
            return _wrong(f"return one number, the learning rate; yours holds {got.numel()} (shape "
                          f"{tuple(got.shape)})", _one_rate_hint(got, eigenvalues) or general)
        got = got.reshape(())
        if not _close(got, 2 / eigenvalues[-1]):
            mistakes: List[Mistake] = [
                (lambda: 1 / eigenvalues[-1], "that η is stable but not the largest: |1 − η λ| < 1 allows η λ up to 2"),
                (lambda: 2 / eigenvalues[0], "the smallest eigenvalue gives the gentlest direction; the steepest one "
                                             "(largest λ) is the first to diverge"),
                (lambda: 2 / torch.trace(H), "the trace adds all the curvatures; stability is decided by the largest "
                                             "one alone"),
                (lambda: 2 / H.diagonal().max(), "the largest diagonal entry is the curvature along a coordinate "
                                                 "axis, not the largest eigenvalue (H need not be diagonal)"),
                (lambda: eigenvalues[-1] / 2, "the threshold is 2 divided by the sharpness, not the sharpness "
                                              "divided by 2"),
            ]
            return _wrong("your learning rate is not the stability threshold for one of the test Hessians",
                          _first_matching(got, mistakes) or general)
    print("right")


# ------------------------------------------------------------------------- 3 · Newton's step

def _newton_cases() -> List[Tuple[Callable[[torch.Tensor], torch.Tensor], torch.Tensor]]:
    A = torch.tensor([[4.0, 1.0], [1.0, 3.0]], dtype=torch.float64)
    b = torch.tensor([1.0, -2.0], dtype=torch.float64)
    return [(lambda t: 0.5 * t @ A @ t - b @ t, torch.tensor([2.0, 1.0], dtype=torch.float64)),
            (lambda t: (t ** 4).sum() + t[0] * t[1], torch.tensor([1.0, -0.5], dtype=torch.float64))]


def _shape_hint(got: torch.Tensor, expected: torch.Tensor) -> str:
    """The hint for a step of the wrong shape: whether its numbers are Newton's, only arranged otherwise."""
    if got.numel() == expected.numel() and _close(got.reshape(expected.shape), expected):
        return "your numbers are Newton's step, arranged in another shape: return a tensor shaped like theta (an " \
               "extra dimension, from a matrix product or an indexing, is left over)"
    return "return the new parameters, a tensor shaped like theta"


def newton_step(student: Callable[[Callable, torch.Tensor], Any]) -> None:
    """θ − H(θ)⁻¹ ∇f(θ) for a quadratic and a quartic."""
    general = "Newton's step minimises the quadratic model f(θ) + gᵀ d + ½ dᵀ H d: set its gradient in d to zero"
    for f, theta in _newton_cases():
        got, error = _answer(student, f, theta.clone())
        if error == "not done":
            return print("not done yet: fill in the exercise above")
        if error:
            return _wrong(error, "return the new parameters, a tensor shaped like theta")
        H = torch.func.hessian(f)(theta)
        g = torch.func.grad(f)(theta)
        expected = theta - torch.linalg.solve(H, g)
        if got.shape != expected.shape:
            return _wrong(f"your step has shape {tuple(got.shape)}; Newton's step has shape {tuple(expected.shape)}",
                          _shape_hint(got, expected))
        if not _close(got, expected):
            mistakes: List[Mistake] = [
                (lambda: theta - H @ g, "you multiplied the gradient by H; the step divides by the curvature: it "
                                        "needs H's inverse (a linear solve)"),
                (lambda: theta + torch.linalg.solve(H, g), "the step goes uphill: move against the gradient"),
                (lambda: theta - g, "that is a gradient-descent step (η = 1): the curvature is not used"),
                (lambda: theta - torch.linalg.solve(H, theta), "the step solves with the gradient, not with the "
                                                               "parameters themselves"),
            ]
            return _wrong("your step differs from Newton's", _first_matching(got, mistakes) or general)
    print("right")
