"""aten spellings and dist / nextafter (torchtrace/ops/aten_forms.py) against torch autograd and finite differences."""
import pytest
import torch
from helpers import check_op, double_backward_matches, float_tolerances, non_contiguous

import torchtrace as tt

aten = torch.ops.aten
_gen = torch.Generator().manual_seed(0)
X = torch.randn(3, 5, generator=_gen, dtype=torch.float64)
Y = torch.randn(3, 5, generator=_gen, dtype=torch.float64)


@pytest.mark.parametrize("pad", [(1, 2), (2, 0, 1, 1), (-1, 2), (0, -2, 1, -1), (0, 0)])
@pytest.mark.parametrize("value", [0.0, -1.5])
def test_constant_pad_nd(pad, value):
    check_op(lambda t: torch.constant_pad_nd(t, pad, value).exp(), X)
    check_op(lambda t: torch.constant_pad_nd(t, pad) * 2, non_contiguous(X))


@pytest.mark.parametrize("args", [(0,), (1, 1, 4), (1, None, None, 2), (0, -2, 100), (1, -100, -1, 3), (1, 4, 2)])
def test_slice(args):
    check_op(lambda t: aten.slice.Tensor(t, *args).sin(), X)


def test_slice_input_used_twice_and_second_derivative():
    check_op(lambda t: aten.slice.Tensor(t, 1, 0, 3) * aten.slice.Tensor(t, 1, 2, 5), X)
    double_backward_matches(lambda t: aten.slice.Tensor(t, 1, 1, None, 2) ** 3, X)


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_safe_softmax(dim):
    check_op(lambda t: aten._safe_softmax.default(t, dim) * Y, X)
    double_backward_matches(lambda t: aten._safe_softmax.default(t, dim) * Y, X)


def test_safe_softmax_fully_masked_row_gives_zero_gradient():
    masked = X.clone()
    masked[1] = -float("inf")
    x = tt.tracer(masked.clone(), requires_grad=True)
    torch_x = masked.clone().requires_grad_()
    (aten._safe_softmax.default(torch_x, 1) * Y).sum().backward()
    (aten._safe_softmax.default(x, 1) * Y).sum().backward()
    torch.testing.assert_close(x.grad, torch_x.grad)
    assert torch.equal(x.grad[1], torch.zeros(5, dtype=torch.float64))


@pytest.mark.parametrize("dim", [0, 1])
def test_softmax_backward_data(dim):
    y = torch.softmax(Y, dim)
    check_op(lambda h, out: aten._softmax_backward_data(h, out, dim, torch.float64) ** 2, X, y)
    double_backward_matches(lambda h, out: aten._softmax_backward_data(h, out, dim, torch.float64), X, y)


@pytest.mark.parametrize("op, options", [
    (aten.threshold_backward, (0.0,)), (aten.threshold_backward, (0.5,)), (aten.leaky_relu_backward, (0.1, False)),
    (aten.hardtanh_backward, (-0.5, 0.7)), (aten.hardshrink_backward, (0.4,)), (aten.softshrink_backward, (0.4,)),
    (aten.hardsigmoid_backward, ()),
], ids=lambda v: getattr(v, "__name__", str(v)))
def test_masked_vjp_ops(op, options):
    y = Y * 4 if op is aten.hardsigmoid_backward else Y
    check_op(lambda h, x: op(h, x, *options) ** 2, X, y)
    if op is not aten.hardsigmoid_backward:  # (torch: "derivative for aten::hardsigmoid_backward is not implemented")
        double_backward_matches(lambda h, x: op(h, x, *options), X, y)


@pytest.mark.parametrize("scale", [1.0, 2.5])
def test_native_dropout_backward(scale):
    mask = torch.rand(3, 5, generator=_gen) > 0.4
    check_op(lambda h: aten.native_dropout_backward(h, mask, scale) ** 2, X)
    double_backward_matches(lambda h: aten.native_dropout_backward(h, mask, scale) ** 2, X)


@pytest.mark.parametrize("ceil_mode", [False, True])
def test_max_pool2d_with_indices_backward(ceil_mode):
    x = torch.randn(2, 3, 5, 6, generator=_gen, dtype=torch.float64)
    pooled, indices = torch.nn.functional.max_pool2d_with_indices(x, 3, 2, 1, ceil_mode=ceil_mode)
    h = torch.randn(pooled.shape, generator=_gen, dtype=torch.float64)

    def vjp(grad_output, input):
        return aten.max_pool2d_with_indices_backward(grad_output, input, [3, 3], [2, 2], [1, 1], [1, 1], ceil_mode,
                                                     indices) ** 2

    check_op(vjp, h, x)
    double_backward_matches(vjp, h, x)


def test_relu_backward_masks_infinite_and_nan_gradients_as_torch():
    x = X.clone()
    x[0, :3] = torch.tensor([0.0, -1.0, float("nan")])
    g = torch.full_like(x, float("inf"))
    g[1, 0] = float("nan")
    ours = tt.tracer(x, requires_grad=True)
    torch.relu(ours).backward(g)
    theirs = x.clone().requires_grad_(True)
    torch.relu(theirs).backward(g)
    torch.testing.assert_close(ours.grad, theirs.grad, equal_nan=True)


@pytest.mark.parametrize("p", [2, 1, 3, 0.5, float("inf")])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_dist(p, dtype):
    a, b = X.to(dtype), Y.to(dtype)
    check_op(lambda s, t: torch.dist(s, t, p), a, b, **float_tolerances(dtype))
    check_op(lambda s, t: s.dist(t, p=p), a, b[0], **float_tolerances(dtype))  # broadcasting
    check_op(lambda s: torch.dist(s, s.flip(0), p), a, **float_tolerances(dtype))  # the input used twice


def test_dist_p0_counts_nonzeros_so_it_sends_no_gradient():
    """p = 0 counts the nonzero differences: flat (finite differences: 0). torch sends no gradient (None; with both
    inputs needing one its backward fails on the undefined gradient); torchtrace sends none either."""
    assert tt.gradcheck(lambda s, t: torch.dist(s, t, 0), X, Y)
    theirs = X.clone().requires_grad_(True)
    (torch.dist(theirs, Y, 0) + theirs.sum()).backward()
    ours = [tt.tracer(t.clone(), requires_grad=True) for t in (X, Y)]
    (torch.dist(*ours, 0) + ours[0].sum()).backward()
    torch.testing.assert_close(ours[0].grad.as_subclass(torch.Tensor), theirs.grad)
    assert ours[1].grad is None
    alone = tt.tracer(X.clone(), requires_grad=True)
    torch.dist(alone, Y, 0).backward()
    assert alone.grad is None


def test_dist_double_backward():
    double_backward_matches(lambda s, t: torch.dist(s, t), X, Y)
    double_backward_matches(lambda s, t: torch.dist(s, t, 3), X, Y)


def test_dist_at_zero_distance_as_torch():
    x = tt.tracer(X.clone(), requires_grad=True)
    torch_x = X.clone().requires_grad_()
    torch.dist(torch_x, X).backward()
    torch.dist(x, X).backward()
    assert torch.equal(x.grad, torch_x.grad)


def test_nextafter():
    check_op(lambda s, t: torch.nextafter(s, t) * s, X, Y, gradcheck=False)  # a one-ulp step: no finite difference
    ours = [tt.tracer(t.clone(), requires_grad=True) for t in (X, Y)]
    torch.nextafter(*ours).sum().backward()
    assert torch.equal(ours[0].grad, torch.ones_like(X)) and torch.equal(ours[1].grad, torch.zeros_like(Y))
