"""tt.check against torch autograd and tt.gradcheck against finite differences, including failures."""
import pytest
import torch
from helpers import TorchSquare, WrongSquare

import torchtrace as tt
from torchtrace.autograd.function import RULES


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


class TorchFunctionWithWrongBackward(TorchSquare):
    """y = x^2 whose author wrote dy/dx = x (wrong: 2x)"""

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * x


def test_check_compares_a_ported_model_with_torch_on_plain_copies_of_its_parameters(wrong_rule_for_square):
    torch.manual_seed(0)
    model = tt.port(torch.nn.Linear(3, 2))
    report = tt.check(lambda x: model(x).tanh(), torch.randn(4, 3))
    assert report.n_captured == 2 and "2 gradients of tensors it uses" in repr(report)
    assert model.weight.grad is None  # the check leaves the model's gradients as they were
    with pytest.raises(tt.GradientMismatch, match=r"gradient of (input 0|tensor 0).*\n.*WrongSquareBackward"):
        tt.check(lambda x: torch.square(model(x)), torch.randn(4, 3))


def test_check_compares_tracers_a_function_closes_over(wrong_rule_for_square):
    w = tt.tracer(torch.rand(3) + 1, requires_grad=True)
    assert tt.check(lambda x: x * w.exp(), torch.rand(3)).n_captured == 1
    with pytest.raises(tt.GradientMismatch, match=r"gradient of tensor 0 that fn uses .*\n.*WrongSquareBackward"):
        tt.check(lambda x: x + torch.square(w), torch.rand(3))  # the input's gradient is right; w's is wrong


def test_check_uses_finite_differences_for_a_torch_autograd_function():
    with pytest.raises(tt.GradientMismatch, match=r"differs from finite differences.*torch autograd Function "
                                                  r"TorchFunctionWithWrongBackward"):
        tt.check(lambda x: TorchFunctionWithWrongBackward.apply(x * 3), torch.rand(4) + 1)


def test_check_says_when_finite_differences_were_the_reference():
    report = tt.check(lambda x: TorchSquare.apply(x).sin(), torch.rand(4, dtype=torch.float64))
    assert report.reference.startswith("finite differences (it calls the torch autograd Function")
    assert "match finite differences" in repr(report)


def test_check_uses_finite_differences_where_torch_cannot_differentiate():
    # torch has no derivative of torch.special.zeta in its first argument; torchtrace's rule would need one too,
    # so here the reference run raises inside torch and the check falls back to finite differences
    class ZetaScaledCube(tt.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return torch.special.zeta(x * 0 + 3.0, x.detach() * 0 + 1.0) * x ** 3

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * 3 * x ** 2 * torch.special.zeta(torch.full_like(x, 3.0), torch.ones_like(x))

    report = tt.check(lambda x: ZetaScaledCube.apply(x), torch.rand(3, dtype=torch.float64) + 1)
    assert report.reference.startswith("finite differences (torch autograd cannot differentiate it")


@pytest.mark.parametrize("call, message", [
    (lambda x: tt.check(lambda t: 3.0, x), "tt.check: the function returned no tensor"),
    (lambda x: tt.check(lambda t: None, x), "tt.check: the function returned no tensor"),
    (lambda x: tt.gradcheck(lambda t: 1.0, x), "tt.gradcheck: the function returned no tensor"),
    (lambda x: tt.gradcheck(lambda t: t * 2, torch.tensor([1, 2])), "at least one floating-point tensor input"),
    (lambda x: tt.gradcheck(lambda t: t * 2, x, eps=0), "eps"),
    (lambda x: tt.check(lambda t: t * 2, torch.tensor([1, 2])), "tt.check compared no gradient"),
    (lambda x: tt.check(lambda: torch.ones(2)), "tt.check compared no gradient"),
])
def test_a_check_of_nothing_is_refused_rather_than_reported_as_passed(call, message):
    """Each of these reported a pass (ok over 0 graph nodes, or True) without comparing anything; eps=0 divided by
    zero. torch's gradcheck refuses inputs that need no gradient the same way."""
    with pytest.raises(ValueError, match=message):
        call(torch.tensor([1.0, 2.0], dtype=torch.float64))


@pytest.mark.parametrize("call", [lambda f, x: tt.check(f, x, check_inputs=x),
                                  lambda f, x: tt.compile(f, x, check_inputs=x),
                                  lambda f, x: tt.check(f, x, check_inputs=[x])],
                         ids=["check given a tensor", "compile given a tensor", "check given a tensor entry"])
def test_check_inputs_given_a_tensor_is_named(call):
    """A tensor was iterated row by row as if each row were a call's arguments (or failed on its truth value)."""
    with pytest.raises(TypeError, match=r"check_inputs.*\(check_inputs=\[\(x2,\), \(x3,\)\]\)"):
        call(lambda t: t * 2, torch.rand(3, 2, dtype=torch.float64))


def _square_with_error(square, at, size):
    """x * x (helpers' forward) whose backward is off by `size` * g at element `at` (of d out_at / d x_at)."""
    class Square(square):
        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            grad = 2 * x * g
            grad[at] = grad[at] + size * g[at]
            return grad
    return Square


@pytest.mark.parametrize("at, size", [(4, 3e-4), (0, 3e-4), (7, 1e-6), (2, 0.0)])
def test_gradcheck_decides_as_torchs_on_every_jacobian_entry(at, size):
    """tt.gradcheck compares the whole Jacobian, as torch's: it compared one projection on a fixed random cotangent,
    which let an error at an output with a small weight pass (and failed some that torch's tolerances accept)."""
    x = torch.linspace(-1, 1, 20, dtype=torch.float64)
    x[at] = 0.0
    theirs = torch.autograd.gradcheck(_square_with_error(TorchSquare, at, size).apply,
                                      (x.clone().requires_grad_(),), raise_exception=False)
    try:
        ours = tt.gradcheck(_square_with_error(WrongSquare, at, size).apply, x)
    except tt.GradientMismatch as error:
        ours = False
        assert f"input 0 differs from finite differences (output 0): max |diff| = {size:.3g}" in str(error)
    assert ours == theirs == (size < 1e-5)
