"""tt.check against torch autograd and tt.gradcheck against finite differences, including failures."""
import pytest
import torch

import torchtrace as tt
from torchtrace.autograd.function import RULES


class WrongSquare(tt.Function):
    """y = x^2 with a deliberately wrong backward (x instead of 2x)"""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * x


@pytest.fixture
def wrong_rule_for_square():
    saved = dict(RULES)
    tt.register(torch.square, WrongSquare)
    yield
    RULES.clear()
    RULES.update(saved)


def test_check_accepts_nested_inputs_and_outputs():
    def fn(pair, named):
        a, b = pair
        return {"prod": a * named["w"], "rest": [a - b, (b / 2,)]}

    report = tt.check(fn, (torch.rand(3), torch.rand(3)), {"w": torch.rand(3)})
    assert report.ok and report.n_outputs == 3 and report.n_gradients == 3 and report.n_nodes >= 3
    assert "match torch autograd" in repr(report)


def test_check_inputs_runs_more_input_sets():
    report = tt.check(lambda a: a * a, torch.rand(2), check_inputs=[(torch.rand(3, 2),), (torch.tensor(2.0),)])
    assert report.ok


def test_check_names_the_first_diverging_node(wrong_rule_for_square):
    expected = r"gradient of input 0.*\n.*First diverging node: WrongSquareBackward"
    with pytest.raises(tt.GradientMismatch, match=expected):
        tt.check(lambda x: torch.square(x * 3) + x, torch.rand(4) + 1)


def test_gradcheck_detects_a_wrong_rule(wrong_rule_for_square):
    with pytest.raises(tt.GradientMismatch, match="finite differences"):
        tt.gradcheck(lambda x: torch.square(x), torch.rand(3) + 1)


def test_gradcheck_passes_on_right_rules():
    assert tt.gradcheck(lambda a, b: a * b / (a + b), torch.rand(3) + 1, torch.rand(3) + 1)


def test_check_reports_output_mismatch(wrong_rule_for_square):
    class Off(tt.Function):
        """y = x + 1 (forward wrong on purpose)"""

        @staticmethod
        def forward(ctx, x):
            return x + 1

        @staticmethod
        def backward(ctx, g):
            return g

    RULES[torch.negative] = Off
    with pytest.raises(tt.GradientMismatch, match="output 0 differs"):
        tt.check(lambda x: torch.negative(x), torch.rand(3))
