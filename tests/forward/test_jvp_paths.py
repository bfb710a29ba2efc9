"""tt.jvp on the paths that are easy to get wrong: in-place ops, views of changed bases, broadcasting, 0-d
tensors, non-contiguous inputs, an input used twice, outputs that are inputs or views of them; against
torch.func.jvp and finite differences (float64)."""
import warnings

import pytest
import torch

import torchtrace as tt
from torchtrace.errors import UnsupportedOperationError

D = torch.float64


def in_place(x):
    y = x * 2
    y.add_(1)
    y.mul_(x)
    return y


def set_item(x):
    y = x.clone()
    y[0] = y[0] * 3
    y[1, 1:] = 0.5
    return y


def view_written_in_place(x):
    y = x.clone()
    v = y[1]
    v.mul_(2)
    return y, v


def view_of_a_changed_base(x):
    y = x.clone()
    v = y[:, 1]
    y.mul_(3)
    return v * 1


CASES = {
    "in-place ops": (in_place, lambda: (torch.randn(3, 4, dtype=D),)),
    "setitem": (set_item, lambda: (torch.randn(3, 4, dtype=D),)),
    "a view written in place, returned": (view_written_in_place, lambda: (torch.randn(3, 4, dtype=D),)),
    "a view of a base changed in place": (view_of_a_changed_base, lambda: (torch.randn(3, 4, dtype=D),)),
    "broadcasting": (lambda x, b, c: x * b + c / b.exp(), lambda: (torch.randn(3, 4, dtype=D), torch.randn(4, dtype=D),
                                                                    torch.randn(3, 1, dtype=D))),
    "0-d": (lambda s, x: (s * x).sum() * s, lambda: (torch.tensor(1.5, dtype=D), torch.randn(3, dtype=D))),
    "non-contiguous": (lambda x: x.t().sin() @ x, lambda: (torch.randn(4, 3, dtype=D).t(),)),
    "an input used twice": (lambda x: x * x + x, lambda: (torch.randn(5, dtype=D),)),
    "identity and a view of the input": (lambda x: (x, x[1:], x.T), lambda: (torch.randn(3, 2, dtype=D),)),
    "outputs without a path": (lambda x: (x.sum(), torch.ones(2, dtype=D)), lambda: (torch.randn(3, dtype=D),)),
    "number operands": (lambda x: torch.where(x > 0, x, 0.5) + (2 - x) / 3 + 2 ** x - x.masked_fill(x < 0, 1.0),
                        lambda: (torch.randn(6, dtype=D),)),
    "products with zeros": (lambda x: x.masked_fill(x > 1, 0).prod(1) + x.masked_fill(x > 1, 0).cumprod(1).sum(1),
                            lambda: (torch.randn(3, 4, dtype=D),)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_jvp_equals_torch_and_finite_differences(case):
    f, make = CASES[case]
    torch.manual_seed(0)
    primals = make()
    tangents = tuple(torch.randn_like(p) for p in primals)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tt.forward.TransposedOpsWarning)  # cumprod through zeros is transposed
        values, ours = tt.jvp(f, primals, tangents)
    theirs = torch.func.jvp(f, primals, tangents)[1]
    eps = 1e-6
    plus = f(*(p + eps * t for p, t in zip(primals, tangents)))
    minus = f(*(p - eps * t for p, t in zip(primals, tangents)))

    def as_tuple(v):
        return v if isinstance(v, tuple) else (v,)

    for a, b, p, m in zip(as_tuple(ours), as_tuple(theirs), as_tuple(plus), as_tuple(minus)):
        torch.testing.assert_close(a, b)
        torch.testing.assert_close(a, (p - m) / (2 * eps), rtol=1e-5, atol=1e-6)


def test_jacobian_of_a_view_written_in_place_in_both_modes():
    x = torch.randn(3, 4, dtype=D)
    f = lambda t: view_written_in_place(t)[1]  # noqa: E731
    torch.testing.assert_close(tt.jacobian(f, x, mode="forward"), torch.func.jacfwd(f)(x))
    torch.testing.assert_close(tt.jacobian(f, x, mode="reverse"), torch.func.jacrev(f)(x))


@pytest.mark.parametrize("form", [lambda t: torch.nn.functional.dropout(t * 1, 0.5, True, inplace=True),
                                  lambda t: torch.dropout_(t * 1, 0.5, True)])
def test_in_place_dropout_has_its_own_tangent(form):
    """ẏ = m / (1 - p) ẋ with torch's mask (after the same seed), by the rule's tangent: nothing transposed."""
    x, v = torch.randn(3, 4, dtype=D), torch.randn(3, 4, dtype=D)
    torch.manual_seed(0)
    expected = torch.func.jvp(form, (x,), (v,))
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", tt.forward.TransposedOpsWarning)
        out, tangent = tt.jvp(form, (x,), (v,))
    assert torch.equal(out.as_subclass(torch.Tensor), expected[0])
    assert torch.equal(torch.as_tensor(tangent), expected[1])


@pytest.mark.parametrize("outside", [torch.no_grad, tt.no_grad])
def test_forward_mode_and_jacobians_ignore_the_grad_mode_they_are_called_in(outside):
    """Evaluation code runs under no_grad: torch.func.jvp / jacfwd ignore grad mode and torch's functional jacobian
    turns it on; tt.jvp and tt.jacobian gave zeros there."""
    x = torch.tensor([1.0, 2.0], dtype=torch.float64)
    v = torch.tensor([1.0, -3.0], dtype=torch.float64)
    f = lambda x: x * x.sin()  # noqa: E731
    expected_jvp = torch.func.jvp(f, (x,), (v,))[1]
    expected_jacobian = torch.func.jacfwd(f)(x)
    with outside():
        torch.testing.assert_close(tt.jvp(f, (x,), (v,))[1], expected_jvp)
        for mode in ("forward", "reverse"):
            torch.testing.assert_close(tt.jacobian(f, x, mode=mode), expected_jacobian)
    torch.testing.assert_close(expected_jvp, expected_jacobian @ v)


def test_an_op_of_f_run_under_no_grad_on_a_value_with_a_tangent_is_refused_by_name():
    """torch's forward mode goes on through torch.no_grad() (tangent 3 here); torchtrace's follows what it records,
    which stops there: it refuses instead of giving the tangent 0 (values not carrying a tangent are fine)."""
    x, v = torch.tensor([1.0, 2.0], dtype=torch.float64), torch.ones(2, dtype=torch.float64)

    def scaled_without_grad(x):
        with torch.no_grad():
            return x * 3

    def constant_made_without_grad(x):
        with torch.no_grad():
            c = torch.ones(2, dtype=torch.float64) * 3
        return x * c

    torch.testing.assert_close(torch.func.jvp(scaled_without_grad, (x,), (v,))[1], 3 * v)
    with pytest.raises(UnsupportedOperationError, match="f runs mul with grad mode off"):
        tt.jvp(scaled_without_grad, (x,), (v,))
    with pytest.raises(UnsupportedOperationError, match="grad mode off"):
        tt.jacobian(scaled_without_grad, x, mode="forward")
    torch.testing.assert_close(tt.jvp(constant_made_without_grad, (x,), (v,))[1],
                               torch.func.jvp(constant_made_without_grad, (x,), (v,))[1])


def test_f_may_write_into_its_inputs_in_place_as_under_torch_func():
    """torch.func.jvp / jacfwd let f change its inputs in place (x.mul_(2), x[0:1].sin_()); torchtrace refused (its
    inputs were leaves that require grad). The values and tangents equal torch's, and the caller's tensor is kept."""
    x, v = torch.tensor([1.0, 2.0], dtype=torch.float64), torch.tensor([1.0, -2.0], dtype=torch.float64)
    for f in (lambda x: x.mul_(2), lambda x: x[0:1].sin_(), lambda x: x.exp_().sum()):
        ours, theirs = tt.jvp(f, (x.clone(),), (v.clone(),)), torch.func.jvp(f, (x.clone(),), (v.clone(),))
        for a, b in zip(ours, theirs):
            torch.testing.assert_close(a, b)
        torch.testing.assert_close(tt.jacobian(f, x, mode="forward"), torch.func.jacfwd(f)(x.clone()))
    assert x.tolist() == [1.0, 2.0]
