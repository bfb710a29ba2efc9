"""The checkers of the lesson "Mixed precision": the solutions pass, and at least three wrong answers of each
exercise get a hint of their own (and none of them prints the answer)."""
import importlib.util
from pathlib import Path

import pytest
import torch
from precision_models import TinyHead

import torchtrace as tt

_path = Path(__file__).resolve().parents[2] / "examples" / "notebooks" / "precision_checkers.py"
_spec = importlib.util.spec_from_file_location("precision_checkers", _path)
checkers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(checkers)


def printed(capsys, check, *args) -> str:
    check(*args)
    return capsys.readouterr().out


def hints(capsys, check, wrong_answers, *args):
    """The hint each wrong answer gets (each must be called wrong)."""
    found = []
    for answer in wrong_answers:
        out = printed(capsys, check, answer, *args)
        assert out.startswith("wrong") and "\nhint: " in out, (answer, out)
        found.append(out.split("\nhint: ", 1)[1])
    return found


def assert_distinct_hints(found, answer_text=()):
    assert len(set(found)) == len(found) >= 3
    for hint in found:
        assert not any(text in hint for text in answer_text), hint


def test_largest_float16(capsys):
    assert printed(capsys, checkers.largest_float16, (2 - 2 ** -10) * 2 ** 15).startswith("right")
    assert printed(capsys, checkers.largest_float16, None).startswith("not done yet")
    found = hints(capsys, checkers.largest_float16, [65536.0, 32768.0, 3.39e38, 65535.0, 1000.0])
    assert_distinct_hints(found, ("65504",))
    assert "give a number" in printed(capsys, checkers.largest_float16, "65504")


def test_smallest_subnormal_float16(capsys):
    assert printed(capsys, checkers.smallest_subnormal_float16, 2.0 ** -24).startswith("right")
    assert printed(capsys, checkers.smallest_subnormal_float16, 6e-8).startswith("right")
    found = hints(capsys, checkers.smallest_subnormal_float16, [2.0 ** -14, 2.0 ** -10, 2.0 ** -25, 2.0 ** -133, 1e-3])
    assert_distinct_hints(found, ("2**-24", "5.96", "6e-8"))


def _deep():
    torch.manual_seed(1)
    deep = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16), torch.nn.Tanh(),
                               torch.nn.Linear(16, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    with torch.no_grad():
        deep[4].weight.mul_(1e-5)
        deep[6].weight.mul_(1e-2)
    deep = tt.port(deep)
    return (lambda x: deep(x).float().mean()), torch.randn(32, 8)


def test_first_underflow(capsys):
    loss_fn, x = _deep()
    assert printed(capsys, checkers.first_underflow, "4", loss_fn, x).startswith("right")
    assert printed(capsys, checkers.first_underflow, None, loss_fn, x).startswith("not done yet")
    # "2": receives zeros already; "6": its gradients are fine; "head": not a module; 4: not a string
    found = hints(capsys, checkers.first_underflow, ["2", "6", "head", 4], loss_fn, x)
    assert_distinct_hints(found[:3])
    assert "string" in found[3] and "receives gradients that are already zero" in found[0]
    assert printed(capsys, checkers.first_underflow, "0", loss_fn, x).split("hint: ")[1] == found[0]


STEPS, OVERFLOW, INIT, INTERVAL = 12, [3, 4, 9], 1024.0, 3
SOLUTION = [1024, 1024, 1024, 2048, 1024, 512, 512, 512, 1024, 1024, 512, 512]


def test_scale_trajectory(capsys):
    args = (STEPS, OVERFLOW, INIT, INTERVAL)
    assert printed(capsys, checkers.scale_trajectory, SOLUTION, *args).startswith("right")
    mistaken = [checkers._scales(*args, backoff=1.0), checkers._scales(*args, reset_on_skip=False),
                checkers._scales(*args, grow_every_step=True), checkers._scales(*args, after_update=True)]
    assert all(m != SOLUTION for m in mistaken)
    found = hints(capsys, checkers.scale_trajectory, mistaken, *args)
    assert_distinct_hints(found)
    assert "one scale per step" in printed(capsys, checkers.scale_trajectory, SOLUTION[:-1], *args)
    assert printed(capsys, checkers.scale_trajectory, None, *args).startswith("not done yet")


def test_the_scale_trajectory_is_torch_gradscalers():
    assert checkers._torch_scales(STEPS, OVERFLOW, INIT, INTERVAL) == SOLUTION


def test_needs_scaling(capsys):
    torch.manual_seed(0)
    model, x = tt.port(TinyHead()), torch.randn(16, 8)
    assert printed(capsys, checkers.needs_scaling, torch.float16, model, x).startswith("right")
    assert printed(capsys, checkers.needs_scaling, "float16", model, x).startswith("right")
    found = hints(capsys, checkers.needs_scaling, [torch.bfloat16, "float32", 3], model, x)
    assert_distinct_hints(found)


@pytest.mark.parametrize("name", ["09_mixed_precision.ipynb", "solutions/09_mixed_precision_solutions.ipynb"])
def test_the_lesson_calls_every_checker(name):
    text = (Path(__file__).resolve().parents[2] / "examples" / "notebooks" / name).read_text()
    assert "import precision_checkers as check" in text
    for check in ("largest_float16", "smallest_subnormal_float16", "first_underflow", "scale_trajectory",
                  "needs_scaling"):
        assert f"check.{check}(" in text
