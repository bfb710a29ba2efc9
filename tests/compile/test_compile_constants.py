"""Python numbers in tensor arithmetic become tensors made once at the top of the generated code: the values and
gradients stay those of eager torchtrace (and of torch autograd) bit for bit."""
import pytest
import torch

import torchtrace as tt
from torchtrace.compiler.constants import constant_name


def program(x, s):
    """Numbers on both sides, ints and floats, a 0-dim tensor, in-place forms, and a reflected division."""
    y = (1 - x * 0.1) * 3 + x / 7 - 2.5
    y = y.mul(1e-3).add(x).sub_(0.3).div_(1.7)
    return (y * y).sum() * 0.5 + (s * 0.1 + 1) / 3 + (2 / (x * x + 1)).sum()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_compiled_numbers_give_eagers_values_and_gradients_bit_for_bit(dtype):
    x0 = torch.randn(5, 4, dtype=dtype)
    s0 = torch.tensor(0.7, dtype=dtype)
    leaves = [tt.tracer(x0, requires_grad=True), tt.tracer(s0, requires_grad=True)]
    compiled = tt.compile(program, tuple(leaves))
    assert constant_name(0.1, dtype) in compiled.code and constant_name(1, dtype) in compiled.code
    out = compiled(*leaves)  # the second call: the generated code
    got = tt.grad(out, leaves)
    eager = program(*leaves)
    expected = tt.grad(eager, leaves)
    assert torch.equal(out.as_subclass(torch.Tensor), eager.as_subclass(torch.Tensor))
    for g, e in zip(got, expected):
        assert torch.equal(g.as_subclass(torch.Tensor), e.as_subclass(torch.Tensor))
    theirs = [x0.clone().requires_grad_(True), s0.clone().requires_grad_(True)]
    torch.testing.assert_close(out.as_subclass(torch.Tensor), program(*theirs).detach())


def test_a_float16_program_keeps_its_numbers_inline():
    """torch computes half-precision arithmetic with the number in float32: a float16 constant would round it."""
    x = tt.tracer(torch.randn(3, dtype=torch.float16), requires_grad=True)
    code = tt.compile(lambda t: (t * 0.1).sum(), (x,)).code
    assert "torch.tensor(" not in code and "0.1" in code


def test_the_constants_are_plain_code_that_needs_only_torch():
    x = tt.tracer(torch.randn(3), requires_grad=True)
    code = tt.compile(lambda t: (1 - t * 2).sum(), (x,)).code  # the fast form (to_code writes the numbers)
    namespace: dict = {}
    exec(code, namespace)
    assert torch.equal(namespace["_1"], torch.tensor(1.0)) and namespace["_2"].dtype == torch.float32


def test_constant_names():
    assert [constant_name(v, torch.float32) for v in (1, 2.0, 0.5, -3, 1e-06)] == ["_1", "_2", "_0_5", "_neg3",
                                                                                     "_1e_neg06"]
    assert constant_name(0.5, torch.float64) == "_0_5_f64"
