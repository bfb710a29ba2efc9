"""PyTorch's OpInfo samples on tracers vs torch autograd (forward, gradients, second derivatives).

Every judged op runs its first two samples in every form (pytest --full: every sample). A WRONG op (a value or
gradient that differs from torch, or a crash that is not a clear refusal) fails; an op listed in
opinfo_passing.txt must PASS; other ops may still be refused (skipped here). After adding rules, regenerate the
list: python -m tests.test_opinfo --write
"""
import pathlib
import sys
from types import SimpleNamespace

import pytest
import torch

import torchtrace as tt
from torchtrace import coverage

PASSING_FILE = pathlib.Path(__file__).with_name("opinfo_passing.txt")
OPS = {coverage.op_key(op): op for op in coverage.judged_ops()}


def passing() -> set:
    return {line.strip() for line in PASSING_FILE.read_text().splitlines() if line.strip()}


@pytest.mark.parametrize("name", sorted(OPS))
def test_opinfo(name: str, request: pytest.FixtureRequest) -> None:
    result = coverage.judge(OPS[name], None if request.config.getoption("--full") else 2)
    if result.status == coverage.WRONG:
        pytest.fail(f"{name} is WRONG: {result.detail}")
    if name in passing():
        assert result.status == coverage.PASS, f"{name} passed before and is now {result.status}: {result.detail}"
    elif result.status != coverage.PASS:
        pytest.skip(f"{result.status}: {result.detail}")


def test_the_passing_list_names_judged_ops():
    assert passing() <= set(OPS)


class Refused(tt.Function):
    """y = x (refuses, as a rule does for an argument it does not handle)."""

    @staticmethod
    def forward(ctx, x):
        raise tt.UnsupportedOperationError("cube: not supported — use x ** 3")

    @staticmethod
    def backward(ctx, grad):
        return grad


def _fake_op(rule: type) -> SimpleNamespace:
    from torch.testing._internal.opinfo.core import SampleInput

    def cube(x):
        return rule.apply(x) if isinstance(x, tt.tracer) else x ** 3

    def sample_inputs(device, dtype, requires_grad=False):
        yield SampleInput(torch.linspace(-1, 1, 5, dtype=dtype).requires_grad_(requires_grad))

    return SimpleNamespace(name="cube", variant_test_name="", op=cube, method_variant=None, operator_variant=None,
                           inplace_variant=None, inplace_operator_variant=None, supports_gradgrad=False,
                           gradcheck_wrapper=lambda op, *args, **kwargs: op(*args, **kwargs),
                           sample_inputs_func=lambda op, *args: sample_inputs(*args))


def test_a_wrong_gradient_is_judged_wrong():
    from helpers import WrongCube  # here, so `python -m tests.test_opinfo --write` needs no tests/ on its path

    result = coverage.judge(_fake_op(WrongCube))
    assert result.status == coverage.WRONG
    assert "gradient of input 0 differs from torch" in result.detail and "sample 0" in result.detail


def test_a_clear_refusal_is_judged_unsupported():
    result = coverage.judge(_fake_op(Refused))
    assert result.status == coverage.UNSUPPORTED and "UnsupportedOperationError" in result.detail


def test_the_report_counts_every_verdict():
    results = [coverage.OpResult("a", coverage.PASS), coverage.OpResult("b", coverage.WRONG, "x"),
               coverage.OpResult("c", coverage.UNSUPPORTED, "y", bare_refusal=True)]
    line = coverage.totals(results)
    assert "judged ops: 3" in line and "PASS 1" in line and "WRONG 1" in line and "unsupported 1 (1 of them" in line


if __name__ == "__main__" and "--write" in sys.argv:
    torch.set_num_threads(1)
    names = [r.name for r in coverage.run(limit=2, out=open("/dev/null", "w")) if r.status == coverage.PASS]
    PASSING_FILE.write_text("\n".join(sorted(names)) + "\n")
    print(f"{len(names)} ops written to {PASSING_FILE}")


def test_a_sample_with_a_float32_tensor_is_compared_at_float32_tolerances():
    from torch.testing._internal.opinfo.core import SampleInput

    x64 = torch.zeros(2, dtype=torch.float64)
    assert coverage.tolerances(SampleInput(x64, args=(x64,))) == (coverage.RTOL, coverage.ATOL)
    assert coverage.tolerances(SampleInput(x64, kwargs={"aweights": x64.float()})) == (1.3e-6, 1e-5)


class Scaled(tt.Function):
    """y = x w (x float64, w float32)  ->  dx = g w,  dw = g x (cast to w's dtype)"""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x * w

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return g * w, (g * x).to(w.dtype)


class ScaledRoundedNextToALargeNumber(Scaled):
    """as Scaled, dw = (g x + 1e3) - 1e3 in w's dtype: exact enough in float64, ~5e-5 off in float32"""

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return g * w, (g * x).to(w.dtype) + 1e3 - 1e3


class ScaledInHalfPrecision(Scaled):
    """as Scaled, dw computed in float16 when w is float32 (a low-precision defect float64 cannot show)"""

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return g * w, (g * x).to(torch.float16 if w.dtype == torch.float32 else w.dtype).to(w.dtype)


def _weighted_op(rule: type) -> SimpleNamespace:
    from torch.testing._internal.opinfo.core import SampleInput

    def op(x, w):
        return rule.apply(x, w) if isinstance(x, tt.tracer) else x * w

    def sample_inputs(device, dtype, requires_grad=False):
        x = torch.linspace(-3, 3, 7, dtype=torch.float64).requires_grad_(requires_grad)
        yield SampleInput(x, args=(torch.linspace(0.5, 2, 7, dtype=torch.float32).requires_grad_(requires_grad),))

    return SimpleNamespace(name="weighted", variant_test_name="", op=op, method_variant=None, operator_variant=None,
                           inplace_variant=None, inplace_operator_variant=None, supports_gradgrad=False,
                           gradcheck_wrapper=lambda op, *args, **kwargs: op(*args, **kwargs),
                           sample_inputs_func=lambda op, *args: sample_inputs(*args))


@pytest.mark.parametrize("rule, verdict", [(Scaled, coverage.PASS), (ScaledRoundedNextToALargeNumber, coverage.PASS),
                                           (ScaledInHalfPrecision, coverage.WRONG)])
def test_a_float32_difference_right_in_float64_passes_and_a_half_precision_one_is_wrong(rule, verdict):
    """Beyond float32's tolerances but within 10 times them, a sample holding a float32 tensor is judged again with
    it in float64 (rounding in another order than torch's is no defect); a float16 computation inside is one."""
    result = coverage.judge(_weighted_op(rule))
    assert result.status == verdict, result.detail
