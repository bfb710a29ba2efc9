"""Activation rules (F.relu6, hardtanh, leaky_relu, elu, gelu, silu, mish, softplus, selu, celu, glu, hardswish,
hardsigmoid, logsigmoid, softsign, tanhshrink, softshrink, hardshrink, threshold) and every activation module."""
import math

import pytest
import torch
import torch.nn.functional as F
from helpers import check_op, double_backward_matches, non_contiguous

import torchtrace as tt
import torchtrace.nn as nn

torch.manual_seed(0)
X = torch.randn(3, 4) * 3
KINKS = torch.tensor([-2.0, -1.0, 0.0, 1.0, 6.0, 7.0])  # where the one-sided derivatives differ



@pytest.mark.parametrize("fn", [
    F.relu6,
    lambda x: F.hardtanh(x),
    lambda x: F.hardtanh(x, -0.5, 2.0),
    lambda x: F.hardtanh(x, min_val=0.0, max_val=6.0),
    lambda x: F.leaky_relu(x),
    lambda x: F.leaky_relu(x, 0.2),
    lambda x: F.leaky_relu(x, negative_slope=-0.3),
    lambda x: F.elu(x),
    lambda x: F.elu(x, 0.5),
    lambda x: F.elu(x, alpha=2.0),
    lambda x: F.gelu(x),
    lambda x: F.gelu(x, approximate="none"),
    lambda x: F.gelu(x, approximate="tanh"),
    F.silu,
    F.mish,
    lambda x: F.softplus(x),
    lambda x: F.softplus(x, 2.0),
    lambda x: F.softplus(x, beta=0.5, threshold=1.0),
    lambda x: F.softplus(x, beta=3.0, threshold=2.0),
    lambda x: F.elu(input=x),
])
@pytest.mark.parametrize("x", [X, X.double(), non_contiguous(X), torch.tensor(0.7), torch.tensor(-1.3)])
def test_activation_functions(fn, x):
    check_op(fn, x)


@pytest.mark.parametrize("fn", [
    F.relu6, F.hardtanh, lambda x: F.hardtanh(x, -2.0, 1.0), F.leaky_relu, F.elu,
    lambda x: F.softplus(x, 1.0, 0.0), lambda x: F.softplus(x, 2.0, 2.0),
])
def test_gradient_at_kinks_follows_torch(fn):
    check_op(fn, KINKS, gradcheck=False)  # finite differences straddle the kink; torch's choice is the reference


@pytest.mark.parametrize("fn", [
    lambda x: F.elu(x) * F.elu(x),
    lambda x: F.silu(x) + F.mish(x) * x,
    lambda x: F.gelu(F.leaky_relu(x, 0.1), approximate="tanh"),
])
def test_reused_and_chained(fn):
    check_op(fn, X)


@pytest.mark.parametrize("fn, inplace_fn", [
    (F.relu6, lambda x: F.relu6(x, inplace=True)),
    (F.hardtanh, lambda x: F.hardtanh(x, -1.0, 1.0, True)),
    (F.leaky_relu, lambda x: F.leaky_relu(x, 0.01, inplace=True)),
    (F.elu, lambda x: F.elu(x, inplace=True)),
    (F.silu, lambda x: F.silu(x, inplace=True)),
    (F.mish, lambda x: F.mish(x, inplace=True)),
    (F.selu, lambda x: F.selu(x, inplace=True)),
    (F.celu, lambda x: F.celu(x, 1.0, True)),
    (F.hardswish, lambda x: F.hardswish(x, inplace=True)),
    (F.hardsigmoid, lambda x: F.hardsigmoid(x, True)),
    (lambda x: F.threshold(x, 0.1, 2.0), lambda x: F.threshold(x, 0.1, 2.0, True)),
    (lambda x: F.rrelu(x, 0.1, 0.3), lambda x: F.rrelu(x, 0.1, 0.3, False, True)),
])
def test_inplace_flag_changes_the_input_as_torch_does(fn, inplace_fn):
    leaf = tt.tracer(X, requires_grad=True)
    x = leaf * 2  # a non-leaf: torch allows in-place changes of it
    y = inplace_fn(x)
    assert y is x
    expected_leaf = X.clone().requires_grad_(True)
    expected = expected_leaf * 2
    inplace_fn(expected)
    torch.testing.assert_close(x.as_subclass(torch.Tensor), expected.detach())  # the input was changed
    (x * x).sum().backward()
    (expected * expected).sum().backward()
    torch.testing.assert_close(leaf.grad, expected_leaf.grad)


@pytest.mark.parametrize("fn, inplace_fn", [(F.relu6, lambda x: F.relu6(x, inplace=True)),
                                            (F.relu, lambda x: torch.nn.ReLU(inplace=True)(x))])
def test_inplace_flag_on_a_leaf_that_requires_grad_raises(fn, inplace_fn):
    with pytest.raises(RuntimeError, match=r"\(inplace=True\): a leaf tracer that requires grad"):
        inplace_fn(tt.tracer(X, requires_grad=True))


@pytest.mark.parametrize("fn", [
    lambda x: F.elu(x, 0.7), lambda x: F.leaky_relu(x, 0.2) * x, lambda x: F.softplus(x, 2.0), F.silu,
    lambda x: F.gelu(x, approximate="tanh"),
])
def test_double_backward(fn):
    double_backward_matches(fn, X / 3)


def test_gelu_double_backward():
    double_backward_matches(F.gelu, X / 3)


@pytest.mark.parametrize("fn", [F.relu6, F.hardtanh, F.hardshrink, F.softshrink, F.hardsigmoid, F.leaky_relu,
                                lambda x: F.threshold(x, 0.2, -1.0)], ids=lambda f: getattr(f, "__name__", "threshold"))
def test_a_second_derivative_through_a_piecewise_linear_activation_is_zeros_as_torch(fn):
    """Their first-order gradient under create_graph did not require grad (a mask of x times g), so differentiating it
    again raised 'does not require grad' where torch gives zeros (its formula, hardtanh_backward(g, x), is a
    function of x whose derivative is 0). Written with the same VJP ops now; zeros also by finite differences."""
    value, weights = X.double() * 3, torch.randn(X.shape, dtype=torch.float64)
    results = []
    for make, grad in ((lambda: value.clone().requires_grad_(), torch.autograd.grad),
                       (lambda: tt.tracer(value.clone(), requires_grad=True), tt.grad)):
        x = make()
        (first,) = grad((fn(x) * weights).sum(), x, create_graph=True)
        assert first.requires_grad
        if fn is F.hardsigmoid and grad is torch.autograd.grad:  # torch: "derivative for aten::hardsigmoid_backward
            with pytest.raises(RuntimeError, match="not implemented"):  # is not implemented"
                grad((first * first).sum(), x)
            continue
        results.append(grad((first * first).sum(), x)[0].as_subclass(torch.Tensor))
    torch.testing.assert_close(results[-1], results[0])
    assert not results[-1].any()  # the first-order gradient is piecewise constant in x


def test_leaky_relu_second_derivative_sends_zeros_to_its_input_as_torch():
    """torch's leaky_relu_backward sends zeros to its input in a second derivative; meeting a NaN in the Jacobian of
    what made that input (cumprod of [0, nan]) they give NaN there, in torch and in torchtrace alike."""
    nan = float("nan")

    def second(x, grad):
        y = F.leaky_relu(torch.cumprod(torch.where(x > 1.2, nan, x), 0), 0.1)
        (first,) = grad(y, x, torch.tensor([-0.5, 0.5], dtype=torch.float64), create_graph=True)
        return grad((first * torch.tensor([1.5, -0.5], dtype=torch.float64)).sum(), x)[0]

    value = torch.tensor([0.0, 2.0], dtype=torch.float64)
    expected = second(value.clone().requires_grad_(True), torch.autograd.grad)
    got = second(tt.tracer(value, requires_grad=True), tt.grad)
    assert expected[0].isnan()
    torch.testing.assert_close(got, expected, equal_nan=True)


@pytest.mark.parametrize("name, args", [
    ("ReLU6", ()), ("LeakyReLU", (0.1,)), ("ELU", (0.5,)), ("GELU", ()), ("GELU", ("tanh",)), ("SiLU", ()),
    ("Mish", ()), ("Softplus", (2.0, 5.0)), ("Hardtanh", (-2.0, 2.0)),
])
def test_modules_match_torch(name, args):
    ours, theirs = getattr(nn, name)(*args), getattr(torch.nn, name)(*args)
    assert isinstance(ours, nn.Module) and isinstance(ours, type(theirs))
    assert repr(ours) == repr(theirs)
    check_op(ours, X)
    out = ours(tt.tracer(X, requires_grad=True))
    torch.testing.assert_close(out.as_subclass(torch.Tensor), theirs(X))
    assert out.grad_fn.module is ours


@pytest.mark.parametrize("name, args", [
    ("ReLU", ()),
    ("Sigmoid", ()),
    ("Tanh", ()),
    ("Softmax", (1,)),
    ("Softmax", (0,)),
    ("LogSoftmax", (-1,)),
])
def test_modules_backed_by_ops_rules(name, args):
    """These modules call F.relu, torch.sigmoid, torch.tanh, F.softmax, F.log_softmax: rules in torchtrace/ops."""
    ours, theirs = getattr(nn, name)(*args), getattr(torch.nn, name)(*args)
    assert repr(ours) == repr(theirs)
    check_op(ours, X)


def test_original_repr_of_activations():
    assert nn.ReLU().original_repr() == "ReLU()"
    assert nn.LeakyReLU(0.2).original_repr() == "LeakyReLU(negative_slope=0.2)"


def test_unknown_gelu_approximation_is_refused():
    with pytest.raises(RuntimeError, match="approximate"):
        F.gelu(tt.tracer(X, requires_grad=True), approximate="cubic")


SMOOTH = {  # activation -> (its VJP op, what that op reads: the input x or the output y, the op's options)
    "gelu": (F.gelu, torch.ops.aten.gelu_backward, "x", {}),
    "gelu_tanh": (lambda x: F.gelu(x, approximate="tanh"), torch.ops.aten.gelu_backward, "x", {"approximate": "tanh"}),
    "silu": (F.silu, torch.ops.aten.silu_backward, "x", {}),
    "tanh": (torch.tanh, torch.ops.aten.tanh_backward, "y", {}),
    "sigmoid": (torch.sigmoid, torch.ops.aten.sigmoid_backward, "y", {}),
}


@pytest.mark.parametrize("name", SMOOTH)
def test_smooth_activation_gradient_is_torchs_kernel_and_its_derivatives_are_hand_derived(name):
    """A smooth activation's gradient is torch's VJP kernel (the same bits as torch autograd, float32 and float64);
    that op's own rule (smooth_vjp) gives the second and third derivatives: torch autograd's, and finite
    differences of the op in both its inputs."""
    fn, op, reads, options = SMOOTH[name]
    for dtype in (torch.float32, torch.float64):
        x = torch.linspace(-6, 6, 41, dtype=dtype)
        ours, theirs = tt.tracer(x, requires_grad=True), x.clone().requires_grad_()
        fn(ours).sum().backward()
        fn(theirs).sum().backward()
        assert torch.equal(ours.grad, theirs.grad)

    def derivatives(grad, leaf):
        first = grad(fn(leaf).pow(2).sum(), leaf, create_graph=True)[0]
        second = grad(first.sum(), leaf, create_graph=True)[0]
        return first, second, grad(second.sum(), leaf)[0]

    x = torch.linspace(-6, 6, 41, dtype=torch.float64)
    for a, b in zip(derivatives(tt.grad, tt.tracer(x, requires_grad=True)),
                    derivatives(torch.autograd.grad, x.clone().requires_grad_())):
        torch.testing.assert_close(a.as_subclass(torch.Tensor), b, rtol=1e-10, atol=1e-12)
    h, v = torch.randn(41, dtype=torch.float64), x if reads == "x" else fn(x) * 0.99
    assert tt.gradcheck(lambda h, v: op(h, v, **options), h, v)


@pytest.mark.parametrize("name", SMOOTH)
def test_smooth_activation_hessian_vector_product_needs_no_transposed_backward(name, recwarn):
    """Forward over reverse through the activation's gradient: its VJP op has a tangent rule (no transposition)."""
    fn = SMOOTH[name][0]
    w, v = torch.randn(6, 4, dtype=torch.float64), torch.randn(6, 4, dtype=torch.float64)
    x = torch.randn(5, 6, dtype=torch.float64)

    def loss(w):
        return fn(x @ w).pow(2).sum()

    expected = torch.func.jvp(torch.func.grad(loss), (w,), (v,))[1]
    (ours,) = tt.hvp(loss, (tt.tracer(w, requires_grad=True),), (v,))
    torch.testing.assert_close(ours.as_subclass(torch.Tensor), expected, rtol=1e-10, atol=1e-12)
    assert not [w for w in recwarn if "transposed" in str(w.message)]


# --- selu, celu, glu, hardswish, hardsigmoid, logsigmoid, softsign, tanhshrink, softshrink, hardshrink, threshold

NEW_ACTIVATIONS = [
    F.selu, torch.selu, F.celu, lambda x: F.celu(x, 0.5), lambda x: torch.celu(x, alpha=2.0),
    lambda x: F.glu(x), lambda x: F.glu(x, 0), lambda x: F.glu(x, dim=-2), F.hardswish, F.hardsigmoid, F.logsigmoid,
    F.softsign, F.tanhshrink, F.softshrink, lambda x: F.softshrink(x, 1.5), lambda x: F.softshrink(x, lambd=0.0),
    F.hardshrink, lambda x: F.hardshrink(x, 2.0), lambda x: x.hardshrink(0.3), lambda x: torch.hardshrink(x, 1.0),
    lambda x: F.threshold(x, 0.5, -2.0), lambda x: F.threshold(x, threshold=-1.0, value=3.0),
    lambda x: torch.threshold(x, 0.0, 1.0),
]
X4 = torch.randn(4, 6) * 3  # glu halves an even dim


@pytest.mark.parametrize("fn", NEW_ACTIVATIONS)
@pytest.mark.parametrize("x", [X4, X4.double(), non_contiguous(X4)])
def test_more_activation_functions(fn, x):
    check_op(fn, x)


@pytest.mark.parametrize("fn", [f for f in NEW_ACTIVATIONS[:5] + NEW_ACTIVATIONS[8:]])
@pytest.mark.parametrize("x", [torch.tensor(0.7), torch.tensor(-1.3)])
def test_more_activations_on_0d(fn, x):
    check_op(fn, x)


MORE_KINKS = torch.tensor([-3.0, -1.5, -1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 3.0, -4.0, 4.0])


@pytest.mark.parametrize("fn", [
    F.hardswish, F.hardsigmoid, F.softshrink, F.hardshrink, lambda x: F.softshrink(x, 1.5), F.selu, F.celu,
    lambda x: F.threshold(x, 1.0, 5.0), lambda x: F.threshold(x, 0.0, 0.0), lambda x: F.celu(x, 3.0),
])
def test_more_kinks_follow_torch(fn):
    """At x = +-3 (hardswish, hardsigmoid), +-lambd (shrinks), the threshold, and 0: torch's one-sided choice."""
    check_op(fn, MORE_KINKS, gradcheck=False)


INF_NAN = torch.tensor([math.inf, -math.inf, math.nan, 0.0, -0.0, 1.0, -1.0, 6.0, 20.0, -20.0, 30.0, 100.0, -100.0])


def _torch_and_ours(fn, x):
    """fn's value and gradient under torch autograd and torchtrace. At a NaN input torch's own kernels disagree: its
    scalar loop gives some rules' slope on the x > 0 side (ELU, SELU, CELU: 1), its vectorised loop NaN, so the answer
    depends on the CPU, the dtype and the element's position; there torch's scalar answer (a one-element call) is the
    reference."""
    theirs = x.clone().requires_grad_(True)
    (expected,) = torch.autograd.grad(fn(theirs).sum(), theirs)
    for i in torch.nonzero(x.isnan()).flatten().tolist():
        alone = x[i:i + 1].clone().requires_grad_(True)
        expected[i] = torch.autograd.grad(fn(alone).sum(), alone)[0][0]
    ours = tt.tracer(x, requires_grad=True)
    out = fn(ours)
    out.sum().backward()
    return out.as_subclass(torch.Tensor), fn(x), ours.grad, expected


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("fn", [
    F.leaky_relu, lambda x: F.leaky_relu(x, -0.5), F.elu, lambda x: F.elu(x, 0.3), F.softplus,
    lambda x: F.softplus(x, 2.0, 10.0), lambda x: F.softplus(x, -1.0, 5.0), lambda x: F.softplus(x, 0.5, 5.0), F.gelu,
    lambda x: F.gelu(x, approximate="tanh"), F.silu, F.mish, F.selu, F.celu, F.hardswish, F.hardsigmoid, F.logsigmoid,
    F.tanhshrink, lambda x: F.threshold(x, 1.0, 3.0), lambda x: F.glu(torch.stack([x, x.flip(0)]), 0),
])
def test_infinities_and_nan_follow_torch(fn, dtype):
    out, expected_out, grad, expected = _torch_and_ours(fn, INF_NAN.to(dtype))
    torch.testing.assert_close(out, expected_out, equal_nan=True)
    torch.testing.assert_close(grad, expected, equal_nan=True)


def test_softsign_at_infinity_is_the_limit_not_torchs_nan():
    """torch differentiates its composite x / (1 + |x|) to inf/inf = NaN at +-inf; the derivative's limit is 0."""
    _, _, grad, expected = _torch_and_ours(F.softsign, torch.tensor([math.inf, -math.inf, 2.0]))
    assert expected[:2].isnan().all()
    torch.testing.assert_close(grad, torch.tensor([0.0, 0.0, 1 / 9]))


@pytest.mark.parametrize("fn", [
    F.selu, lambda x: F.celu(x, 0.7), F.glu, F.hardswish, F.logsigmoid, F.softsign, F.tanhshrink,
    lambda x: F.softshrink(x, 0.3) * x, lambda x: F.threshold(x, 0.1, 2.0) * x,
])
def test_more_double_backward(fn):
    double_backward_matches(fn, X4 / 3)


@pytest.mark.parametrize("name, args", [
    ("SELU", ()), ("CELU", (0.5,)), ("GLU", (0,)), ("Hardswish", ()), ("Hardsigmoid", ()), ("LogSigmoid", ()),
    ("Softsign", ()), ("Softshrink", (0.7,)), ("Hardshrink", (0.2,)), ("Tanhshrink", ()), ("Threshold", (0.1, 20.0)),
])
def test_more_modules_match_torch(name, args):
    ours, theirs = getattr(nn, name)(*args), getattr(torch.nn, name)(*args)
    assert isinstance(ours, nn.Module) and isinstance(ours, type(theirs))
    assert repr(ours) == repr(theirs)
    check_op(ours, X4)
    out = ours(tt.tracer(X4, requires_grad=True))
    torch.testing.assert_close(out.as_subclass(torch.Tensor), theirs(X4))
    assert out.grad_fn.module is ours


@pytest.mark.parametrize("spell", [
    lambda h: F.elu(h, 0.7, inplace=True), lambda h: F.elu_(h), lambda h: torch.selu_(h),
    lambda h: F.selu(h, inplace=True), lambda h: F.celu(h, 0.6, inplace=True), lambda h: torch.celu_(h, 0.6),
], ids=["elu_inplace", "elu_", "selu_", "selu_inplace", "celu_inplace", "celu_"])
def test_an_inplace_elu_reads_its_result_so_a_hook_sees_second_order_gradients_as_torch(spell):
    """A hook on x.elu_()'s result in a second derivative: torch's elu_backward reads the result (is_result=True),
    so second-order gradients flow through the hooked result; the out-of-place form reads its input."""

    def second_derivative(make):
        x = make(torch.tensor([-1.5, -0.3, 0.0, 0.7, 2.0], dtype=torch.float64))
        y = spell(x * 1.3)
        y.register_hook(lambda g: g * 0.5)
        grad = tt.grad if isinstance(x, tt.tracer) else torch.autograd.grad
        (g,) = grad(y.std() + (y * y).sum(), x, create_graph=True)
        (g2,) = grad(g.sum(), x)
        return g.detach().as_subclass(torch.Tensor), g2

    ours = second_derivative(lambda t: tt.tracer(t, requires_grad=True))
    theirs = second_derivative(lambda t: t.clone().requires_grad_(True))
    torch.testing.assert_close(ours[0], theirs[0])
    torch.testing.assert_close(ours[1], theirs[1])
    check_op(lambda x: spell(x * 1.0), torch.tensor([-1.5, -0.3, 0.7, 2.0], dtype=torch.float64))
