"""Batch / layer / group / RMS norm rules and their modules, against torch autograd and finite differences."""
import copy

import pytest
import torch
import torch.nn.functional as F
from helpers import check_op, double_backward_matches, non_contiguous
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.func import functional_call

import torchtrace as tt
from torchtrace.nn.module import Parameter
from torchtrace.nn.normalization import (
    BatchNorm1d,
    BatchNorm2d,
    BatchNorm3d,
    GroupNorm,
    InstanceNorm1d,
    InstanceNorm2d,
    InstanceNorm3d,
    LayerNorm,
    RMSNorm,
)

torch.manual_seed(0)
X2, X3, X4 = torch.randn(5, 3), torch.randn(4, 3, 4), torch.randn(2, 3, 2, 3)
W, B = torch.randn(3), torch.randn(3)
RUNNING_MEAN, RUNNING_VAR = torch.randn(3), torch.rand(3) + 0.5


def stats(x):
    """Fresh running statistics in x's dtype (training mode updates them in place on every call)."""
    return RUNNING_MEAN.to(x.dtype, copy=True), RUNNING_VAR.to(x.dtype, copy=True)


def bn(training, **options):
    return lambda x, w, b: F.batch_norm(x, *stats(x), w, b, training, **options)


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("fn, inputs", [
    (bn, (X2, W, B)),  # (N, C)
    (bn, (X3, W, B)),  # (N, C, L)
    (bn, (X4, W, B)),  # (N, C, H, W)
    (lambda t: lambda x, w, b: F.batch_norm(x, *stats(x), w, b, t, 0.3, 1e-3), (X3, W, B)),
    (lambda t: lambda x, w, b: F.batch_norm(x, *stats(x), weight=w, bias=b, training=t, momentum=0.5, eps=0.1),
     (X2, W, B)),
    (lambda t: lambda x: F.batch_norm(x, *stats(x), training=t), (X3,)),  # no affine parameters
    (lambda t: lambda x, w: F.batch_norm(x, *stats(x), w, None, t), (X3, W)),
    (lambda t: lambda x, b: F.batch_norm(x, *stats(x), None, b, t), (X3, B)),
    (lambda t: lambda x, w, b: torch.batch_norm(x, w, b, *stats(x), t, 0.1, 1e-5, False), (X4, W, B)),
    (bn, (non_contiguous(X3), W, B)),
    (bn, (X4.double(), W.double(), B.double())),
    (lambda t: lambda x, w, b: F.batch_norm(x, *stats(x), w, b, t) * x, (X3, W, B)),  # input used twice
    (lambda t: lambda x, w: F.batch_norm(x, *stats(x), w, w, t), (X2, W)),  # one tensor as weight and bias
])
def test_batch_norm(fn, inputs, training):
    check_op(fn(training), *inputs, atol=1e-5)


@pytest.mark.parametrize("fn, inputs", [
    (lambda x, w, b: F.instance_norm(x, weight=w, bias=b), (X3, W, B)),
    (lambda x, w, b: F.instance_norm(x, None, None, w, b, True, 0.1, 1e-3), (X4, W, B)),
    (lambda x: F.instance_norm(x, *stats(x)), (X3,)),  # updates running stats, normalizes with the sample's
    (lambda x, w, b: F.instance_norm(x, *stats(x), w, b, use_input_stats=False), (X4, W, B)),
    (lambda x, w, b: torch.instance_norm(x, w, b, None, None, True, 0.1, 1e-5, False), (X3, W, B)),
    (lambda x, w, b: F.instance_norm(x, weight=w, bias=b), (non_contiguous(X3).double(), W.double(), B.double())),
])
def test_instance_norm(fn, inputs):
    check_op(fn, *inputs, atol=1e-5)


def test_batch_norm_without_running_stats_uses_batch_statistics():
    check_op(lambda x, w, b: F.batch_norm(x, None, None, w, b, True), X4, W, B, atol=1e-5)


@pytest.mark.parametrize("fn, inputs", [
    (lambda x, w, b: F.layer_norm(x, (4,), w, b), (X3, torch.randn(4), torch.randn(4))),
    (lambda x, w, b: F.layer_norm(x, (2, 3), w, b), (X4, torch.randn(2, 3), torch.randn(2, 3))),
    (lambda x, w, b: F.layer_norm(x, [3, 2, 3], w, b, 1e-2), (X4, torch.randn(3, 2, 3), torch.randn(3, 2, 3))),
    (lambda x, w, b: F.layer_norm(x, torch.Size([3]), weight=w, bias=b, eps=0.5), (X2, W, B)),
    (lambda x: F.layer_norm(x, (4,)), (X3,)),  # elementwise_affine off
    (lambda x, w: F.layer_norm(x, (3,), w), (X2, W)),  # no bias
    (lambda x: F.layer_norm(x, (6,)), (torch.randn(6),)),  # a single vector
    (lambda x, w, b: torch.layer_norm(x, (4,), w, b, 1e-5, False), (X3, torch.randn(4), torch.randn(4))),
    (lambda x, w, b: F.layer_norm(x, (3,), w, b), (non_contiguous(X2), W, B)),
    (lambda x, w, b: F.layer_norm(x, (3,), w, b), (X2.double(), W.double(), B.double())),
    (lambda x, w, b: F.layer_norm(x, (3,), w, b) + x * x, (X2, W, B)),  # input used twice
])
def test_layer_norm(fn, inputs):
    check_op(fn, *inputs, atol=1e-5)


@pytest.mark.parametrize("fn, inputs", [
    (lambda x, w, b: F.group_norm(x, 2, w, b), (torch.randn(3, 4, 3), torch.randn(4), torch.randn(4))),
    (lambda x, w, b: F.group_norm(x, 1, w, b), (torch.randn(2, 4, 3, 2), torch.randn(4), torch.randn(4))),
    (lambda x, w, b: F.group_norm(x, 4, w, b, 1e-3), (torch.randn(2, 4, 3), torch.randn(4), torch.randn(4))),
    (lambda x, w, b: F.group_norm(x, 2, w, b), (torch.randn(2, 6), torch.randn(6), torch.randn(6))),  # (N, C)
    (lambda x, w, b: F.group_norm(x, 2, weight=w, bias=b, eps=0.1), (X4[:, :2], W[:2], B[:2])),
    (lambda x: F.group_norm(x, 2), (torch.randn(2, 4, 3),)),  # no affine parameters
    (lambda x, w, b: torch.group_norm(x, 2, w, b, 1e-5, False), (torch.randn(2, 4, 3), torch.randn(4), torch.randn(4))),
    (lambda x, w, b: F.group_norm(x, 2, w, b), (non_contiguous(torch.randn(4, 2, 3)), torch.randn(2), torch.randn(2))),
    (lambda x, w, b: F.group_norm(x, 2, w, b), (torch.randn(2, 4, 3).double(), torch.randn(4).double(),
                                                torch.randn(4).double())),
    (lambda x, w: F.group_norm(x, 2, w, w) * x, (torch.randn(2, 4, 3), torch.randn(4))),  # reused tensors
])
def test_group_norm(fn, inputs):
    check_op(fn, *inputs, atol=1e-5)


@pytest.mark.parametrize("fn, inputs", [
    (lambda x, w: F.rms_norm(x, (4,), w), (X3, torch.randn(4))),
    (lambda x, w: F.rms_norm(x, (2, 3), w, 1e-3), (X4, torch.randn(2, 3))),
    (lambda x: F.rms_norm(x, [3]), (X2,)),
    (lambda x, w: torch.rms_norm(x, (3,), w, eps=0.1), (X2, W)),
    (lambda x, w: F.rms_norm(x, (3,), weight=w), (non_contiguous(X2).double(), W.double())),
])
def test_rms_norm(fn, inputs):
    check_op(fn, *inputs, atol=1e-5)


@settings(max_examples=25, deadline=None)
@given(shape=st.lists(st.integers(2, 4), min_size=2, max_size=4), trailing=st.integers(1, 2), groups=st.integers(1, 2),
       seed=st.integers(0, 2 ** 16))
def test_random_shapes(shape, trailing, groups, seed):
    """Every norm on generated shapes, in float64: batch norm (train and eval), layer norm, group norm."""
    torch.manual_seed(seed)
    x = torch.randn(shape, dtype=torch.float64)
    c, normalized = shape[1], shape[-trailing:]
    w, b, mean, var = torch.randn(c).double(), torch.randn(c).double(), torch.randn(c).double(), torch.rand(c).double()
    tt.check(lambda x, w, b: F.batch_norm(x, mean.clone(), var.clone() + 0.5, w, b, True), x, w, b)
    tt.check(lambda x, w, b: F.batch_norm(x, mean, var + 0.5, w, b, False), x, w, b)
    tt.check(lambda x, w, b: F.layer_norm(x, normalized, w, b), x, torch.randn(normalized).double(),
             torch.randn(normalized).double())
    x = x.repeat_interleave(groups, 1)
    w, b = w.repeat_interleave(groups), b.repeat_interleave(groups)
    tt.check(lambda x, w, b: F.group_norm(x, c, w, b), x, w, b)


@pytest.mark.parametrize("fn, inputs", [
    (lambda x, w, b: F.layer_norm(x, (5,), w, b), (torch.randn(3, 5), torch.randn(5), torch.randn(5))),
    (lambda x, w, b: torch.tanh(F.layer_norm(x, (2, 3), w, b)), (torch.randn(2, 2, 3), torch.randn(2, 3),
                                                                   torch.randn(2, 3))),
    (lambda x, w, b: F.batch_norm(x, None, None, w, b, True), (torch.randn(4, 3, 2), W, B)),
    (lambda x, w, b: F.batch_norm(x, RUNNING_MEAN.double(), RUNNING_VAR.double(), w, b, False), (X2, W, B)),
    (lambda x, w, b: F.group_norm(x, 2, w, b), (torch.randn(2, 4, 3), torch.randn(4), torch.randn(4))),
    (lambda x, w: F.rms_norm(x, (3,), w), (X2, W)),
    (lambda x, w, b: F.instance_norm(x, weight=w, bias=b), (X3, W, B)),
])
def test_double_backward(fn, inputs):
    double_backward_matches(fn, *(x.double() for x in inputs))


def test_layer_norm_first_order_uses_forward_statistics_and_create_graph_recomputes_them():
    x, w, b = (tt.tracer(t.double(), requires_grad=True) for t in (X3, torch.randn(4), torch.randn(4)))
    g = torch.randn(X3.shape, dtype=torch.float64)
    first = tt.grad(F.layer_norm(x, (4,), w, b), [x, w, b], g)
    recorded = tt.grad(F.layer_norm(x, (4,), w, b), [x, w, b], g, create_graph=True)
    for a, c in zip(first, recorded):
        torch.testing.assert_close(a.as_subclass(torch.Tensor), c.as_subclass(torch.Tensor))
    code = tt.compile(lambda x, w, b: F.layer_norm(x, (4,), w, b).square().sum(), (x, w, b)).code
    assert "native_layer_norm" in code and "rsqrt" not in code.split("def backward")[1]


@pytest.mark.parametrize("momentum", [0.1, 0.7, None])
def test_functional_training_updates_running_stats_like_torch(momentum):
    ours_mean, ours_var = tt.tracer(RUNNING_MEAN), tt.tracer(RUNNING_VAR)  # as tt.port leaves buffers
    theirs_mean, theirs_var = stats(X3)
    x = tt.tracer(X3, requires_grad=True)
    factor = 0.25 if momentum is None else momentum  # the cumulative average's 1 / num_batches_tracked
    F.batch_norm(x, ours_mean, ours_var, training=True, momentum=factor).sum().backward()
    F.batch_norm(X3, theirs_mean, theirs_var, training=True, momentum=factor)
    torch.testing.assert_close(ours_mean.as_subclass(torch.Tensor), theirs_mean)
    torch.testing.assert_close(ours_var.as_subclass(torch.Tensor), theirs_var)  # the unbiased batch variance
    assert x.grad is not None


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("spelling", ["F.batch_norm", "torch.batch_norm"])
def test_batch_norm_first_order_is_torch_autograds_bits(training, dtype, layout, spelling):
    """The first-order backward runs torch's batch norm backward kernel on the statistics the forward's kernel kept:
    the output, the running statistics, and the input, weight and bias gradients are torch autograd's, bit for bit
    (create_graph keeps the formulas written out: test_double_backward)."""
    torch.manual_seed(0)
    x, g = torch.randn(8, 6, 5, 5).to(dtype), torch.randn(8, 6, 5, 5).to(dtype)
    if layout == "channels_last":
        x = x.to(memory_format=torch.channels_last)
    w, b, mean, var = torch.randn(6), torch.randn(6), torch.randn(6), torch.rand(6) + 0.5

    def run(x, w, b, mean, var):
        if spelling == "F.batch_norm":
            return F.batch_norm(x, mean, var, w, b, training, 0.1, 1e-5)
        return torch.batch_norm(x, w, b, mean, var, training, 0.1, 1e-5, False)

    ours = [tt.tracer(t, requires_grad=True) for t in (x, w, b)]
    theirs = [t.clone().requires_grad_() for t in (x, w, b)]
    stats = [(mean.clone(), var.clone()) for _ in range(2)]
    out, expected = run(*ours, *stats[0]), run(*theirs, *stats[1])
    out.backward(g)
    expected.backward(g)
    assert torch.equal(out.as_subclass(torch.Tensor), expected.detach())
    assert all(torch.equal(a, c) for a, c in zip(*stats))
    for a, c in zip(ours, theirs):
        assert torch.equal(a.grad, c.grad)


def test_running_stats_that_require_grad_are_refused():
    x, mean = tt.tracer(X2, requires_grad=True), tt.tracer(RUNNING_MEAN, requires_grad=True)
    with pytest.raises(RuntimeError, match="batch_norm is not differentiable with respect to running_mean"):
        F.batch_norm(x, mean, RUNNING_VAR.clone(), training=False)


def test_training_with_one_value_per_channel_raises_torchs_error():
    with pytest.raises(ValueError, match="Expected more than 1 value per channel when training"):
        F.batch_norm(tt.tracer(torch.randn(1, 3), requires_grad=True), None, None, training=True)


def plain(t):
    return t.as_subclass(torch.Tensor) if isinstance(t, tt.tracer) else t.detach()


def train_side_by_side(layer, twin, make_input, steps=4):
    """Several forward/backward steps on both layers: outputs, input and parameter gradients must agree."""
    for _ in range(steps):
        x = make_input()
        ours, theirs = tt.tracer(x, requires_grad=True), x.clone().requires_grad_(True)
        out, expected = layer(ours), twin(theirs)
        torch.testing.assert_close(plain(out), plain(expected), rtol=1e-5, atol=1e-5)
        weights = torch.randn(out.shape)
        (out * weights).sum().backward()
        (expected * weights).sum().backward()
        torch.testing.assert_close(ours.grad, theirs.grad, rtol=1e-5, atol=1e-5)
        for (name, p), q in zip(layer.named_parameters(), twin.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-5, msg=name)


@pytest.mark.parametrize("ours, theirs, shape", [
    (lambda: BatchNorm1d(3), lambda: torch.nn.BatchNorm1d(3), (6, 3)),
    (lambda: BatchNorm1d(3, momentum=0.3), lambda: torch.nn.BatchNorm1d(3, momentum=0.3), (4, 3, 5)),
    (lambda: BatchNorm2d(3), lambda: torch.nn.BatchNorm2d(3), (3, 3, 4, 4)),
    (lambda: BatchNorm2d(3, momentum=None), lambda: torch.nn.BatchNorm2d(3, momentum=None), (2, 3, 3, 4)),
    (lambda: BatchNorm2d(3, affine=False), lambda: torch.nn.BatchNorm2d(3, affine=False), (2, 3, 2, 2)),
    (lambda: BatchNorm2d(3, eps=1e-2, track_running_stats=False),
     lambda: torch.nn.BatchNorm2d(3, eps=1e-2, track_running_stats=False), (2, 3, 2, 2)),
    (lambda: BatchNorm3d(2), lambda: torch.nn.BatchNorm3d(2), (2, 2, 2, 3, 2)),
    (lambda: InstanceNorm1d(3, affine=True, track_running_stats=True),
     lambda: torch.nn.InstanceNorm1d(3, affine=True, track_running_stats=True), (2, 3, 4)),
])
def test_running_stats_modules_train_like_torch(ours, theirs, shape):
    """Same start, several training steps, then eval: running statistics and every gradient stay equal."""
    torch.manual_seed(3)
    layer, twin = ours(), theirs()
    if layer.affine:
        with torch.no_grad():
            twin.weight.uniform_(0.5, 1.5)
            twin.bias.normal_()
    layer.load_state_dict(twin.state_dict())
    assert list(layer.state_dict()) == list(twin.state_dict())
    train_side_by_side(layer, twin, lambda: torch.randn(shape) * 2 + 1)
    for name, buffer in twin.named_buffers():
        torch.testing.assert_close(plain(layer.get_buffer(name)), buffer, msg=name)
    layer.eval()
    twin.eval()
    train_side_by_side(layer, twin, lambda: torch.randn(shape), steps=2)
    for name, buffer in twin.named_buffers():  # eval mode leaves them alone
        torch.testing.assert_close(plain(layer.get_buffer(name)), buffer, msg=name)


@pytest.mark.parametrize("ours, theirs, shape", [
    (lambda: LayerNorm(5), lambda: torch.nn.LayerNorm(5), (3, 5)),
    (lambda: LayerNorm([2, 3], eps=1e-3), lambda: torch.nn.LayerNorm([2, 3], eps=1e-3), (4, 2, 3)),
    (lambda: LayerNorm(4, elementwise_affine=False), lambda: torch.nn.LayerNorm(4, elementwise_affine=False), (2, 4)),
    (lambda: LayerNorm(4, bias=False), lambda: torch.nn.LayerNorm(4, bias=False), (2, 3, 4)),
    (lambda: GroupNorm(2, 4), lambda: torch.nn.GroupNorm(2, 4), (3, 4, 5)),
    (lambda: GroupNorm(3, 6, affine=False), lambda: torch.nn.GroupNorm(3, 6, affine=False), (2, 6, 2, 2)),
    (lambda: RMSNorm(4), lambda: torch.nn.RMSNorm(4), (3, 4)),
    (lambda: InstanceNorm1d(3, affine=True), lambda: torch.nn.InstanceNorm1d(3, affine=True), (2, 3, 5)),
    (lambda: InstanceNorm2d(3, affine=True), lambda: torch.nn.InstanceNorm2d(3, affine=True), (3, 2, 3)),  # unbatched
    (lambda: InstanceNorm3d(2), lambda: torch.nn.InstanceNorm3d(2), (2, 2, 2, 2, 3)),
])
def test_per_sample_norm_modules_match_torch(ours, theirs, shape):
    torch.manual_seed(4)
    layer, twin = ours(), theirs()
    with torch.no_grad():
        for p in twin.parameters():
            p.normal_()
    layer.load_state_dict(twin.state_dict())
    train_side_by_side(layer, twin, lambda: torch.randn(shape), steps=2)


@pytest.mark.parametrize("make, x", [
    (lambda: BatchNorm2d(3), X4),
    (lambda: LayerNorm([2, 3]), X4),
    (lambda: GroupNorm(3, 3), X4),
    (lambda: torch.nn.BatchNorm1d(3), X3),  # torch's own module, run with tracer parameters (as tt.port does)
    (lambda: torch.nn.GroupNorm(1, 3), X3),
])
def test_module_gradients_match_torch(make, x):
    layer = make().double()  # float64 buffers too, for the finite differences
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_()
    params = {name: p.detach().clone() for name, p in layer.named_parameters()}
    check_op(lambda p, x: functional_call(layer, p, (x,)), params, x.double())


@pytest.mark.parametrize("ours, theirs", [
    (lambda: BatchNorm1d(4), lambda: torch.nn.BatchNorm1d(4)),
    (lambda: BatchNorm2d(4, momentum=None), lambda: torch.nn.BatchNorm2d(4, momentum=None)),
    (lambda: LayerNorm((2, 4)), lambda: torch.nn.LayerNorm((2, 4))),
    (lambda: GroupNorm(2, 4), lambda: torch.nn.GroupNorm(2, 4)),
    (lambda: RMSNorm(4), lambda: torch.nn.RMSNorm(4)),
    (lambda: InstanceNorm2d(4, affine=True, track_running_stats=True),
     lambda: torch.nn.InstanceNorm2d(4, affine=True, track_running_stats=True)),
])
def test_same_parameters_buffers_and_printing_as_torch(ours, theirs):
    layer, twin = ours(), theirs()
    assert repr(layer) == repr(twin)
    assert list(layer.state_dict()) == list(twin.state_dict())
    for (name, value), expected in zip(layer.state_dict().items(), twin.state_dict().values()):
        assert type(value) is torch.Tensor and torch.equal(value, expected), name
    assert all(isinstance(p, tt.tracer) and p.requires_grad for p in layer.parameters())


@pytest.mark.parametrize("make, shape", [
    (lambda: torch.nn.BatchNorm2d(3), (4, 3, 2, 2)),
    (lambda: torch.nn.BatchNorm1d(3, momentum=None), (5, 3)),
    (lambda: torch.nn.LayerNorm(4), (3, 4)),
])
def test_torch_module_with_tracer_parameters_and_buffers_trains_like_torch(make, shape):
    """What tt.port does: torch's own module code, every parameter and buffer turned into a tracer."""
    torch.manual_seed(5)
    twin = make()
    layer = make()
    layer.load_state_dict(twin.state_dict())
    for name, p in layer.named_parameters():
        layer._parameters[name] = Parameter(p.detach())
    for name, buffer in layer.named_buffers():
        layer._buffers[name] = tt.as_tracer(buffer)
    train_side_by_side(layer, twin, lambda: torch.randn(shape) + 1)
    for name, buffer in twin.named_buffers():
        torch.testing.assert_close(plain(layer.get_buffer(name)), buffer, msg=name)


def test_eval_backward_uses_the_running_stats_of_its_forward():
    """A training step between forward and backward updates the running stats in place; the gradient must
    still be that of the eval forward (torch 2.13 would use the updated statistics here)."""
    layer, twin = BatchNorm1d(3).eval(), torch.nn.BatchNorm1d(3).eval()
    x, expected_x = tt.tracer(X2, requires_grad=True), X2.clone().requires_grad_(True)
    out = layer(x)
    (twin(expected_x) ** 2).sum().backward()  # torch, with the statistics of that forward
    layer.train()(tt.tracer(X2 + 3))
    (out ** 2).sum().backward()
    torch.testing.assert_close(x.grad, expected_x.grad)


def test_torch_module_on_a_tracer_reaches_the_batch_norm_rule():
    """nn.BatchNorm2d's forward calls F.batch_norm, which hands the tracer to the F.batch_norm rule."""
    out = torch.nn.BatchNorm2d(3, affine=False)(tt.tracer(X4, requires_grad=True))
    assert out.grad_fn.name == "BatchNormFunctionBackward"


def test_train_and_eval_modes_differ_like_torch():
    layer = BatchNorm1d(3)
    x = tt.tracer(X2 * 3 + 2)
    train_out = layer(x)
    layer.eval()
    assert not layer.training
    eval_out = layer(x)
    assert not torch.allclose(plain(train_out), plain(eval_out))
    assert int(layer.num_batches_tracked) == 1  # only the training call counted


def test_node_is_labelled_with_the_layer():
    layer = LayerNorm(5)
    out = layer(tt.randn(2, 5, requires_grad=True))
    assert out.grad_fn.name == "LayerNormFunctionBackward" and out.grad_fn.module is layer


def test_group_norm_of_an_empty_batch_matches_torch():
    x, w, b = (torch.randn(*s, dtype=torch.float64) for s in ((0, 2), (2,), (2,)))
    assert tt.check(lambda x, w, b: F.group_norm(x, 1, w, b), x, w, b).ok


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("training", [True, False])
def test_batch_norm_of_a_low_precision_input_computes_in_float32_as_torch(dtype, training):
    """Under autocast batch norm runs in its input's dtype with float32 parameters; torch's kernel computes in float32,
    so dw and db (sums over the batch) are float32-accurate, not rounded term by term to 8 or 11 bits."""
    torch.manual_seed(0)
    x0, weights = torch.randn(16, 4, 6, 6) * 3 + 1, torch.randn(1, 4, 6, 6)
    theirs = torch.nn.BatchNorm2d(4)
    theirs.running_mean.uniform_(-1, 1)
    theirs.running_var.uniform_(0.5, 2)
    theirs.train(training)
    ours = tt.port(copy.deepcopy(theirs))
    grads = []
    for model in (theirs, ours):
        x = x0.to(dtype).requires_grad_() if model is theirs else tt.tracer(x0.to(dtype), requires_grad=True)
        with torch.autocast("cpu", dtype=dtype):
            y = model(x)
        (y.float() * weights).sum().backward()
        grads.append([t.as_subclass(torch.Tensor) for t in (model.weight.grad, model.bias.grad, x.grad)])
    for mine, reference in zip(*reversed(grads)):
        assert mine.dtype == reference.dtype
    torch.testing.assert_close(grads[1][0], grads[0][0], rtol=2e-5, atol=1e-5)  # dw: float32
    torch.testing.assert_close(grads[1][1], grads[0][1], rtol=2e-5, atol=1e-5)  # db: float32
    torch.testing.assert_close(grads[1][2].float(), grads[0][2].float(), rtol=1e-2, atol=1e-2)  # dx: one low ulp
    exact = torch.nn.BatchNorm2d(4).double()  # float64 from the same rounded input: torchtrace is as close as torch
    exact.load_state_dict(theirs.state_dict())
    exact.train(training)
    x = x0.to(dtype).double().requires_grad_()
    (exact(x) * weights.double()).sum().backward()
    for mine, reference, truth in zip(grads[1][:2], grads[0][:2], (exact.weight.grad, exact.bias.grad)):
        error = ((mine.double() - truth).abs().max() / truth.abs().max()).item()
        torch_error = ((reference.double() - truth).abs().max() / truth.abs().max()).item()
        assert error <= 1.5 * torch_error + 1e-6
