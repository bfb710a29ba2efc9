"""Lesson 10's checkers: the solution passes, each common mistake gets its own hint, an unfinished exercise is
'not done yet', an exception is a wrong answer, and no checker prints the values it expects."""
import importlib.util
from pathlib import Path

import pytest
import torch

import torchtrace as tt

_path = Path(__file__).resolve().parents[2] / "examples" / "notebooks" / "curvature_checkers.py"
_spec = importlib.util.spec_from_file_location("curvature_checkers", _path)
checkers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(checkers)


def verdict(capsys, check, answer) -> str:
    check(answer)
    return capsys.readouterr().out


def assert_wrong(capsys, check, answer, hint_part):
    printed = verdict(capsys, check, answer)
    assert printed.startswith("wrong"), printed
    assert "\nhint: " in printed and hint_part in printed, printed
    assert "tensor(" not in printed and "Traceback" not in printed, printed


def not_done(*args):
    raise NotImplementedError


# 1 · the Hessian of f(a, b) = a³ + a b²

def hessian_solution(a, b):
    return torch.tensor([[6 * a, 2 * b], [2 * b, 2 * a]])


@pytest.mark.parametrize("answer, hint_part", [
    (lambda a, b: torch.tensor([[6 * a, 0.0], [0.0, 2 * a]]), "off-diagonal entries are missing"),
    (lambda a, b: torch.tensor([[3 * a ** 2 + b ** 2, 2 * a * b], [2 * a * b, 2 * a]]), "first derivative"),
    (lambda a, b: torch.tensor([[3 * a, b], [b, a]]), "half of what it should be"),
    (lambda a, b: torch.tensor([[6 * a, 4 * b], [4 * b, 2 * a]]), "count the mixed term twice"),
    (lambda a, b: torch.tensor([[2 * a, 2 * b], [2 * b, 6 * a]]), "diagonal is swapped"),
    (lambda a, b: torch.tensor([[6 * a, 2 * b], [2 * b, 2 * a + 1]]), "differentiate f twice"),
    (lambda a, b: torch.tensor([6 * a, 2 * a]), "2×2"),
    (lambda a, b: "six a", "return a 2×2 tensor of numbers"),
])
def test_hessian_by_hand_mistakes(capsys, answer, hint_part):
    assert_wrong(capsys, checkers.hessian_by_hand, answer, hint_part)


def test_hessian_by_hand_right_and_not_done(capsys):
    assert verdict(capsys, checkers.hessian_by_hand, hessian_solution) == "right\n"
    assert verdict(capsys, checkers.hessian_by_hand, not_done).startswith("not done yet")


# 2 · the largest stable learning rate

@pytest.mark.parametrize("answer, hint_part", [
    (lambda H: 1 / torch.linalg.eigvalsh(H)[-1], "not the largest"),
    (lambda H: 2 / torch.linalg.eigvalsh(H)[0], "smallest eigenvalue"),
    (lambda H: 2 / torch.trace(H), "trace"),
    (lambda H: 2 / H.diagonal().max(), "diagonal entry"),
    (lambda H: torch.linalg.eigvalsh(H)[-1] / 2, "sharpness divided by 2"),
    (lambda H: 0.05, "magnitude below 1"),
    (lambda H: H.sum(dim=0), "magnitude below 1"),
])
def test_stable_learning_rate_mistakes(capsys, answer, hint_part):
    assert_wrong(capsys, checkers.stable_learning_rate, answer, hint_part)


def test_stable_learning_rate_right_and_not_done(capsys):
    assert verdict(capsys, checkers.stable_learning_rate, lambda H: 2 / torch.linalg.eigvalsh(H)[-1]) == "right\n"
    assert verdict(capsys, checkers.stable_learning_rate, lambda H: float(2 / torch.linalg.eigvalsh(H).max())) == \
        "right\n"
    assert verdict(capsys, checkers.stable_learning_rate, not_done).startswith("not done yet")


# 3 · Newton's step

def gradient(f, theta):
    x = tt.tracer(theta, requires_grad=True)
    return tt.grad(f(x), x)[0].as_subclass(torch.Tensor)


def newton_solution(f, theta):
    return theta - torch.linalg.solve(tt.hessian(f, theta), gradient(f, theta))


@pytest.mark.parametrize("answer, hint_part", [
    (lambda f, t: t - tt.hessian(f, t) @ gradient(f, t), "inverse"),
    (lambda f, t: t + torch.linalg.solve(tt.hessian(f, t), gradient(f, t)), "uphill"),
    (lambda f, t: t - gradient(f, t), "gradient-descent step"),
    (lambda f, t: t - torch.linalg.solve(tt.hessian(f, t), t), "not with the parameters"),
    (lambda f, t: t - 0.1 * gradient(f, t), "quadratic model"),
    (lambda f, t: tt.hessian(f), "raised TypeError"),
])
def test_newton_step_mistakes(capsys, answer, hint_part):
    assert_wrong(capsys, checkers.newton_step, answer, hint_part)


def test_newton_step_right_and_not_done(capsys):
    assert verdict(capsys, checkers.newton_step, newton_solution) == "right\n"
    assert verdict(capsys, checkers.newton_step, not_done).startswith("not done yet")
