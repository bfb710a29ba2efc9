"""tt.jvp and tt.jacobian equal torch.func.jvp / torch.autograd.functional.jacobian and finite differences."""
import pytest
import torch

import torchtrace as tt
import torchtrace.forward.api as forward_api


def numeric_jacobian(f, x, eps=1e-6):
    """Central differences in float64: column k is (f(x + eps e_k) - f(x - eps e_k)) / 2 eps."""
    columns = []
    flat = x.detach().reshape(-1)
    for k in range(flat.numel()):
        step = torch.zeros_like(flat)
        step[k] = eps
        plus, minus = f((flat + step).view(x.shape)), f((flat - step).view(x.shape))
        columns.append(((plus - minus) / (2 * eps)).reshape(-1))
    out_shape = f(x).shape
    return torch.stack(columns, -1).view(*out_shape, *x.shape)


def mlp(x, w, b):
    return torch.tanh(x @ w + b).pow(2).sum(1)


def inputs():
    torch.manual_seed(0)
    return torch.randn(5, 3, dtype=torch.float64), torch.randn(3, 4, dtype=torch.float64), \
        torch.randn(4, dtype=torch.float64)


def test_jvp_equals_torch_func_jvp_and_finite_differences():
    primals = inputs()
    tangents = tuple(torch.randn_like(p) for p in primals)
    out, jvp = tt.jvp(mlp, primals, tangents)
    out_torch, jvp_torch = torch.func.jvp(mlp, primals, tangents)
    torch.testing.assert_close(out, out_torch)
    torch.testing.assert_close(jvp, jvp_torch)
    eps = 1e-6  # directional finite difference along the tangents
    plus = mlp(*(p + eps * t for p, t in zip(primals, tangents)))
    minus = mlp(*(p - eps * t for p, t in zip(primals, tangents)))
    torch.testing.assert_close(jvp, (plus - minus) / (2 * eps), rtol=1e-6, atol=1e-7)
    assert type(out) is torch.Tensor and type(jvp) is torch.Tensor


def test_jvp_of_a_function_with_tuple_outputs_and_an_unused_input():
    def f(x, y, unused):
        return x.exp() * y, (x * y).sum(), torch.ones(2, dtype=x.dtype)

    primals = (torch.randn(3, dtype=torch.float64), torch.randn(3, dtype=torch.float64), torch.randn(2).double())
    tangents = tuple(torch.randn_like(p) for p in primals)
    ours, theirs = tt.jvp(f, primals, tangents), torch.func.jvp(f, primals, tangents)
    assert isinstance(ours[1], tuple) and len(ours[1]) == 3
    for a, b in zip(ours[0] + ours[1], theirs[0] + theirs[1]):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("mode", ["forward", "reverse"])
def test_jacobian_of_one_tensor_equals_torch_and_finite_differences(mode):
    x = torch.randn(4, 3, dtype=torch.float64)

    def f(t):
        return torch.sigmoid(t).cumsum(0)[1:] * t[:3]

    ours = tt.jacobian(f, x, mode=mode)
    torch.testing.assert_close(ours, torch.autograd.functional.jacobian(f, x))
    torch.testing.assert_close(ours, numeric_jacobian(f, x), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("mode", ["forward", "reverse"])
def test_jacobian_nesting_follows_torch_for_tuple_inputs_and_outputs(mode):
    primals = inputs()

    def two_outputs(x, w, b):
        return mlp(x, w, b), (w * 2).sum(0) + b

    ours = tt.jacobian(two_outputs, primals, mode=mode)
    theirs = torch.autograd.functional.jacobian(two_outputs, primals)
    assert len(ours) == 2 and all(len(row) == 3 for row in ours)
    for row_ours, row_theirs in zip(ours, theirs):
        for a, b in zip(row_ours, row_theirs):
            torch.testing.assert_close(a, b)
    single = tt.jacobian(lambda x: (x.sin(), x.sum()), primals[2], mode=mode)
    torch.testing.assert_close(single[0], torch.diag(primals[2].cos()))
    torch.testing.assert_close(single[1], torch.ones(4, dtype=torch.float64))


def test_jacobian_of_tuple_inputs_matches_finite_differences_blockwise():
    x, w, b = inputs()
    blocks = tt.jacobian(mlp, (x, w, b), mode="forward")
    torch.testing.assert_close(blocks[1], numeric_jacobian(lambda t: mlp(x, t, b), w), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(blocks[2], numeric_jacobian(lambda t: mlp(x, w, t), b), rtol=1e-6, atol=1e-7)


def count_passes(monkeypatch):
    """Record each reverse pass (its create_graph flag) and each forward pass of f on dual numbers."""
    calls = []
    real_grad, real_pass = forward_api.grad, forward_api.dual_pass

    def counted_grad(*args, **kwargs):
        calls.append(("reverse", kwargs.get("create_graph", False)))
        return real_grad(*args, **kwargs)

    def counted_pass(*args, **kwargs):
        calls.append(("forward", False))
        return real_pass(*args, **kwargs)

    monkeypatch.setattr(forward_api, "grad", counted_grad)
    monkeypatch.setattr(forward_api, "dual_pass", counted_pass)
    return calls


def test_reverse_mode_takes_one_pass_per_output_element_forward_mode_one_per_input_element(monkeypatch):
    wide, x = (lambda t: (t ** 2).sum(0)), torch.randn(10, 2, dtype=torch.float64)  # R^20 -> R^2
    calls = count_passes(monkeypatch)
    tt.jacobian(wide, x, mode="reverse")
    assert calls == [("reverse", False)] * 2
    calls.clear()
    tt.jacobian(wide, x, mode="forward")
    assert calls == [("forward", False)] * 20  # one pass of f on dual numbers per column, no reverse pass


def test_outputs_that_do_not_depend_on_the_inputs_give_zero_blocks():
    x = torch.randn(3, dtype=torch.float64)
    for mode in ("forward", "reverse"):
        jacobian = tt.jacobian(lambda t: torch.ones(2, dtype=t.dtype), x, mode=mode)
        assert torch.equal(jacobian, torch.zeros(2, 3, dtype=torch.float64))


def test_bad_input_is_refused_with_a_message_that_says_what_to_pass():
    x = torch.randn(3)
    with pytest.raises(TypeError, match="tuples of tensors"):
        tt.jvp(torch.sin, x, x)
    with pytest.raises(ValueError, match="one tangent per primal"):
        tt.jvp(torch.add, (x, x), (x,))
    with pytest.raises(ValueError, match="a tangent has its primal's shape"):
        tt.jvp(torch.sin, (x,), (torch.ones(4),))
    with pytest.raises(TypeError, match="only floating-point inputs"):
        tt.jvp(torch.sin, (torch.arange(3),), (torch.ones(3),))
    with pytest.raises(TypeError, match=r"primals\[0\] is a list"):
        tt.jacobian(torch.sin, ([1.0, 2.0],))
    with pytest.raises(TypeError, match="must return tensors"):
        tt.jacobian(lambda t: t.sum().item(), x)
    with pytest.raises(ValueError, match="'forward' or 'reverse'"):
        tt.jacobian(torch.sin, x, mode="backward")


def test_jvp_without_a_tensor_primal_is_refused_as_torch_func():
    """It returned (f(), 0)."""
    with pytest.raises(RuntimeError, match="at least one Tensor"):
        torch.func.jvp(lambda: torch.tensor([1.0]), (), ())
    with pytest.raises(RuntimeError, match="at least one tensor"):
        tt.jvp(lambda: tt.tracer([1.0]), (), ())


def test_jvp_refuses_a_complex_tangent_on_a_real_primal_and_says_how_to_get_torchs_complex_result():
    """The tangent was cast to the primal's real dtype: its imaginary part dropped, a real J v returned where
    torch.func.jvp returns the complex one. Refused now; the two real calls it names give torch's result."""
    x = torch.rand(3, dtype=torch.float64)
    v = torch.randn(3, dtype=torch.complex128)
    with pytest.raises(ValueError, match=r"tangents\[0\] is complex .* primals\[0\] is real"):
        tt.jvp(torch.sin, (x,), (v,))
    square = lambda a: a * a  # noqa: E731  (torch.func keeps the imaginary part through mul, drops it through sin)
    real, imaginary = (tt.jvp(square, (x,), (part,))[1] for part in (v.real, v.imag))
    assert torch.allclose(torch.complex(real, imaginary), torch.func.jvp(square, (x,), (v,))[1])


def test_jvp_refuses_an_integer_tangent_as_torch_func():
    """It was cast to the primal's dtype (ones for torch.ones(3, dtype=long)); torch.func.jvp refuses it."""
    with pytest.raises(ValueError, match=r"tangents\[0\]: expected a floating-point tangent.*torch.int64"):
        tt.jvp(torch.sin, (torch.rand(3),), (torch.ones(3, dtype=torch.long),))
    with pytest.raises(ValueError, match="Expected tangent to be floating point"):
        torch.func.jvp(torch.sin, (torch.rand(3),), (torch.ones(3, dtype=torch.long),))


@pytest.mark.parametrize("method", ["auto", "transpose"])
@pytest.mark.parametrize("make, shape", [(lambda: torch.nn.GroupNorm(2, 4), (2, 4, 3)),
                                         (lambda: torch.nn.BatchNorm1d(4).eval(), (3, 4)),
                                         (lambda: torch.nn.InstanceNorm1d(4, affine=True), (2, 4, 5))],
                         ids=["group_norm", "batch_norm_eval", "instance_norm"])
def test_jvp_through_a_plain_torch_norm_layer_whose_parameters_require_grad(method, make, shape):
    """method="transpose" records a backward with create_graph, where the rule's saved torch parameter met a tracer
    after an op of torch autograd's (it raised)."""
    torch.manual_seed(0)
    module, x = make().double(), torch.randn(*shape, dtype=torch.float64)
    v = torch.randn_like(x)
    ours = tt.jvp(module, (x,), (v,), method=method)[1]
    torch.testing.assert_close(ours.detach().as_subclass(torch.Tensor), torch.func.jvp(module, (x,), (v,))[1])
    numeric = (module(x + 1e-6 * v) - module(x - 1e-6 * v)) / 2e-6
    torch.testing.assert_close(ours.detach().as_subclass(torch.Tensor), numeric.detach(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("method", ["auto", "transpose"])
def test_jvp_of_a_function_that_changes_its_input_in_place(method):
    """transpose ran f on the leaves themselves: an in-place change of one was refused; f gets copies, as auto's."""
    def f(a):
        a.mul_(2)
        a.diagonal().add_(1)
        return a.sin()
    x, v = torch.randn(3, 3, dtype=torch.float64), torch.randn(3, 3, dtype=torch.float64)
    ours = tt.jvp(f, (x.clone(),), (v,), method=method)[1]
    torch.testing.assert_close(ours, torch.func.jvp(f, (x.clone(),), (v.clone(),))[1])  # (it changes v in place)
    numeric = (f(x + 1e-6 * v) - f(x - 1e-6 * v)) / 2e-6
    torch.testing.assert_close(ours, numeric, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name, f", [("sort", lambda x: x.sort(-1)), ("max_dim", lambda x: x.max(1)),
                                     ("qr", lambda x: torch.linalg.qr(x)),
                                     ("slogdet", lambda x: torch.linalg.slogdet(x[:, :3]))])
def test_jvp_of_a_function_returning_torchs_return_types(name, f):
    """torch.return_types results (sort, max(dim), qr, slogdet) crashed rebuilding them: they take one sequence, not
    one argument per field as a named tuple does."""
    torch.manual_seed(0)
    x, v = torch.randn(3, 4, dtype=torch.float64), torch.randn(3, 4, dtype=torch.float64)
    out, ours = tt.jvp(f, (x,), (v,))
    expected_out, theirs = torch.func.jvp(f, (x,), (v,))
    assert type(out) is type(expected_out) and type(ours) is type(theirs)
    for a, b, value in zip(ours, theirs, expected_out):
        if value.is_floating_point():
            torch.testing.assert_close(a, b)
