"""A user's Function in forward mode: its own jvp, its backward transposed when that is differentiable, and a
clear refusal when it is not (a zero Jacobian would be silently wrong)."""
import warnings

import pytest
import torch

import torchtrace as tt


def cube(ctx, x):
    """y = x^3, keeping x for backward and for jvp."""
    ctx.save_for_backward(x)
    ctx.save_for_forward(x)
    return x ** 3


def cube_slope(ctx, dx):
    """3 x^2 times dx: the backward (dx a gradient) and the jvp (dx a tangent) of x^3 alike."""
    (x,) = ctx.saved_tensors
    return 3 * x ** 2 * dx


def detached_cube_slope(ctx, g):
    with tt.no_grad():  # correct values, but nothing recorded: not differentiable
        return cube_slope(ctx, g)


class DetachedCube(tt.Function):
    """y = x^3 with a correct backward that records nothing."""

    forward, backward = staticmethod(cube), staticmethod(detached_cube_slope)


class Cube(tt.Function):
    """y = x^3 with a differentiable backward and no jvp."""

    forward, backward = staticmethod(cube), staticmethod(cube_slope)


class CubeWithJvp(DetachedCube):
    """y = x^3 with its own jvp: ẏ = 3 x^2 ẋ (its backward is not differentiable, and not needed)."""

    jvp = staticmethod(cube_slope)


class TorchScaledPair(torch.autograd.Function):
    """(x * s, x^2) with torch's forward / setup_context / backward / jvp, s a number."""

    generate_vmap_rule = True  # torch.func.jacfwd, the reference, vmaps it

    @staticmethod
    def forward(x, s):
        return x * s, x ** 2

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, s = inputs
        ctx.s = s
        ctx.save_for_backward(x)
        ctx.save_for_forward(x)

    @staticmethod
    def backward(ctx, g1, g2):
        (x,) = ctx.saved_tensors
        return g1 * ctx.s + g2 * 2 * x, None

    @staticmethod
    def jvp(ctx, dx, ds):
        (x,) = ctx.saved_tensors
        return dx * ctx.s, 2 * x * dx


def x_and_v():
    torch.manual_seed(0)
    return torch.randn(4, dtype=torch.float64), torch.randn(4, dtype=torch.float64)


def test_a_function_whose_backward_is_not_differentiable_is_refused_in_forward_mode():
    x, v = x_and_v()
    torch.testing.assert_close(tt.jacobian(DetachedCube.apply, x), torch.diag(3 * x ** 2))  # reverse mode is right
    with pytest.raises(tt.UnsupportedOperationError, match="DetachedCube has no tangent rule, and its backward is "
                                                           "not differentiable"):
        tt.jacobian(DetachedCube.apply, x, mode="forward")
    with pytest.raises(tt.UnsupportedOperationError, match="not differentiable"):
        tt.jvp(DetachedCube.apply, (x,), (v,), method="transpose")


def test_a_function_without_jvp_is_transposed_with_a_warning():
    x, v = x_and_v()
    with pytest.warns(tt.forward.TransposedOpsWarning, match="transposed the backward of Cube"):
        _, jv, report = tt.jvp(Cube.apply, (x,), (v,), report=True)
    assert report == {"Cube": "transposed backward"}
    torch.testing.assert_close(jv, 3 * x ** 2 * v)
    with pytest.raises(NotImplementedError, match="Cube has no tangent rule, and method='dual'"):
        tt.jvp(Cube.apply, (x,), (v,), method="dual")


def test_a_function_with_jvp_uses_it_in_one_pass():
    x, v = x_and_v()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        value, jv, report = tt.jvp(lambda t: CubeWithJvp.apply(t.sin()), (x,), (v,), report=True)
    assert report == {"CubeWithJvp": "tangent rule", "Sin": "tangent rule"}
    torch.testing.assert_close(value, x.sin() ** 3)
    torch.testing.assert_close(jv, 3 * x.sin() ** 2 * x.cos() * v)
    torch.testing.assert_close(tt.jacobian(CubeWithJvp.apply, x, mode="forward"), torch.diag(3 * x ** 2))


def test_a_torch_autograd_function_with_jvp_equals_torch_func_jvp():
    x, v = x_and_v()
    f = lambda t: TorchScaledPair.apply(t, 2.5)  # noqa: E731
    ours = tt.jvp(f, (x,), (v,), report=True)
    theirs = torch.func.jvp(f, (x,), (v,))
    assert ours[2] == {"TorchScaledPair": "tangent rule"}
    for a, b in zip(ours[1], theirs[1]):
        torch.testing.assert_close(a, b)
    for a, b in zip(tt.jacobian(f, x, mode="forward"), torch.func.jacfwd(f)(x)):
        torch.testing.assert_close(a, b)
