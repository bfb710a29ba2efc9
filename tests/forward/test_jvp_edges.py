"""tt.jvp at its edges: the transpose of reverse mode where a factor of a rule's formula is singular but masked (pow's
b a^(b-1) at a = 0, b = 0: the tangent is torch.func's and finite differences', not NaN), and outputs nested in
dicts and lists, which come back in the same nesting as torch.func.jvp's."""
import pytest
import torch

import torchtrace as tt

D = torch.float64


@pytest.mark.parametrize("method", ["auto", "dual", "transpose"])
def test_pow_at_zero_base_and_zero_exponent(method):
    a, b = torch.tensor([0.0, 0.0, 2.0], dtype=D), torch.tensor([0.0, 2.0, 0.0], dtype=D)
    ta, tb = torch.tensor([1.0, 1.0, 1.0], dtype=D), torch.tensor([0.0, 0.0, 1.0], dtype=D)
    expected = torch.func.jvp(torch.pow, (a, b), (ta, tb))[1]
    eps = 1e-7
    finite = (torch.pow(a + eps * ta, b + eps * tb) - torch.pow(a, b)) / eps  # (one-sided: a = 0 is an edge)
    got = tt.jvp(torch.pow, (a, b), (ta, tb), method=method)[1]
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(got, finite, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("method", ["auto", "transpose"])
def test_outputs_nested_in_dicts_and_lists_come_back_nested_as_torch_funcs(method):
    x, v = torch.tensor([0.1, 0.2], dtype=D), torch.tensor([1.0, -1.0], dtype=D)

    def f(a):
        return {"s": a.sin(), "pair": [a.cos(), (a * a,)]}

    expected_value, expected_tangent = torch.func.jvp(f, (x,), (v,))
    value, tangent = tt.jvp(f, (x,), (v,), method=method)
    assert type(tangent) is dict and type(tangent["pair"]) is list and type(tangent["pair"][1]) is tuple
    for got, want in ((value, expected_value), (tangent, expected_tangent)):
        torch.testing.assert_close(got, want)
