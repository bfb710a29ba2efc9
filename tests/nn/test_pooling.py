"""Max, average and adaptive pooling rules (1, 2 and 3 spatial dims) and the pooling modules, against torch."""
import pytest
import torch
import torch.nn.functional as F
from helpers import check_op, double_backward_matches, non_contiguous
from hypothesis import given, settings
from hypothesis import strategies as st

import torchtrace as tt
from torchtrace.nn import pooling


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny tensors: torch's thread pool only adds contention (minutes on a loaded 2-core machine)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


torch.manual_seed(0)
X = torch.randn(2, 3, 7, 6)  # odd and even spatial sizes
X1 = torch.randn(2, 3, 9)
X3 = torch.randn(1, 2, 5, 4, 3)
TIES = torch.tensor([[[[1.0, 1.0, 0.0, 2.0, 2.0], [1.0, 0.0, 0.0, 2.0, 2.0], [3.0, 3.0, 3.0, 3.0, 0.0],
                       [3.0, 3.0, 1.0, 1.0, 1.0]]]])  # equal maxima inside and across windows

MAX_POOL2D_OPTIONS = [
    {"kernel_size": 2}, {"kernel_size": 3, "stride": 1}, {"kernel_size": 3, "stride": 1, "padding": 1},
    {"kernel_size": 3, "stride": 2, "ceil_mode": True}, {"kernel_size": (3, 2), "stride": (2, 1), "padding": (1, 0)},
    {"kernel_size": 2, "stride": 2, "dilation": 2}, {"kernel_size": (2, 3), "dilation": (2, 1), "ceil_mode": True},
    {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True}, {"kernel_size": 4, "stride": 3, "padding": 2},
]


@pytest.mark.parametrize("options", MAX_POOL2D_OPTIONS, ids=str)
@pytest.mark.parametrize("pool", [
    lambda x, **o: F.max_pool2d(x, **o),
    lambda x, **o: F.max_pool2d(x, return_indices=True, **o)[0],
    lambda x, **o: F.max_pool2d_with_indices(x, **o)[0],
    lambda x, **o: torch.max_pool2d(x, o["kernel_size"], o.get("stride", ()), o.get("padding", 0),
                                    o.get("dilation", 1), o.get("ceil_mode", False)),
    lambda x, **o: pooling.MaxPool2d(**o)(x),
    lambda x, **o: pooling.MaxPool2d(return_indices=True, **o)(x)[0],
], ids=["F", "F return_indices", "F with_indices", "torch", "module", "module return_indices"])
def test_max_pool2d(options, pool):
    check_op(lambda x: pool(x, **options), X)


@pytest.mark.parametrize("fn, inputs", [
    (lambda x: F.max_pool1d(x, 3), (X1,)),
    (lambda x: F.max_pool1d(x, 3, 2, 1, ceil_mode=True), (X1,)),
    (lambda x: F.max_pool1d(x, 2, dilation=3, return_indices=True)[0], (X1,)),
    (lambda x: F.max_pool1d_with_indices(x, 4, 3, 2, 1, True)[0], (X1,)),
    (lambda x: torch.max_pool1d(x, 3, 2, 1, 1, True), (X1,)),
    (lambda x: torch.max_pool1d_with_indices(x, 3, 2)[0], (X1,)),
    (lambda x: pooling.MaxPool1d(3, ceil_mode=True)(x), (X1,)),
    (lambda x: F.max_pool1d(x, 3), (X1[0],)),  # unbatched
    (lambda x: F.max_pool3d(x, 2), (X3,)),
    (lambda x: F.max_pool3d(x, (2, 3, 2), stride=1, padding=1, ceil_mode=True), (X3,)),
    (lambda x: F.max_pool3d_with_indices(x, 2, ceil_mode=True)[0], (X3,)),
    (lambda x: torch.max_pool3d(x, 3, 2, 1), (X3,)),
    (lambda x: F.max_pool2d(x, 3, 2, 1), (X[0],)),  # unbatched
    (lambda x: F.max_pool2d(x, 3, 1), (non_contiguous(X),)),
    (lambda x: F.max_pool2d(x, 2), (X.double(),)),
    (lambda x: F.max_pool2d(x, 2) + F.avg_pool2d(x, 2) * F.max_pool2d(x, 2), (X,)),  # one input used thrice
    (lambda x: F.max_pool2d(input=x, kernel_size=3, stride=2), (X,)),
])
def test_max_pool_forms(fn, inputs):
    check_op(fn, *inputs)


@pytest.mark.parametrize("fn", [
    lambda x: F.max_pool2d(x, 2),
    lambda x: F.max_pool2d(x, 3, 1, 1),  # overlapping windows pick the same element: gradients accumulate
    lambda x: F.max_pool2d(x, 2, ceil_mode=True),
    lambda x: F.adaptive_max_pool2d(x, (3, 4)),
])
def test_max_pool_ties_follow_torchs_indices(fn):
    check_op(fn, TIES, gradcheck=False)  # finite differences straddle the tie; torch's index is the reference


AVG_POOL2D_OPTIONS = [
    {"kernel_size": 2}, {"kernel_size": 3, "stride": 1}, {"kernel_size": (3, 2), "stride": (2, 1), "padding": (1, 0)},
    {"kernel_size": 3, "stride": 2, "ceil_mode": True}, {"kernel_size": 3, "stride": 2, "padding": 1},
    {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True}, {"kernel_size": 4, "stride": 3, "padding": 2},
    {"kernel_size": (2, 4), "stride": (3, 1), "padding": (1, 2), "ceil_mode": True},
    {"kernel_size": 3, "stride": 2, "padding": 1, "divisor_override": 4},
    {"kernel_size": 2, "stride": 3, "ceil_mode": True, "divisor_override": 3},
]


@pytest.mark.parametrize("options", AVG_POOL2D_OPTIONS, ids=str)
@pytest.mark.parametrize("count_include_pad", [True, False])
@pytest.mark.parametrize("pool", [F.avg_pool2d, pooling.AvgPool2d], ids=["F", "module"])
def test_avg_pool2d(options, count_include_pad, pool):
    if pool is F.avg_pool2d:
        check_op(lambda x: F.avg_pool2d(x, count_include_pad=count_include_pad, **options), X)
    else:
        check_op(lambda x: pooling.AvgPool2d(count_include_pad=count_include_pad, **options)(x), X)


@pytest.mark.parametrize("fn, inputs", [
    (lambda x: F.avg_pool2d(x, 3, 2, 1, True, False, None), (X,)),  # all positional
    (lambda x: F.avg_pool2d(x, 3, 2, 1), (X[0],)),  # unbatched
    (lambda x: F.avg_pool2d(x, 2), (non_contiguous(X).double(),)),
    (lambda x: F.avg_pool1d(x, 3), (X1,)),
    (lambda x: F.avg_pool1d(x, 4, 3, 2, True, False), (X1,)),
    (lambda x: F.avg_pool1d(x, 4, 3, 2, ceil_mode=True), (X1,)),
    (lambda x: F.avg_pool1d(x, kernel_size=3, stride=2, padding=1, count_include_pad=False), (X1[0],)),
    (lambda x: pooling.AvgPool1d(3, 2, 1, count_include_pad=False)(x), (X1,)),
    (lambda x: F.avg_pool3d(x, 2), (X3,)),
    (lambda x: F.avg_pool3d(x, (2, 3, 2), 2, 1, True, False), (X3,)),
    (lambda x: F.avg_pool3d(x, 3, 1, 1, divisor_override=5), (X3,)),
])
def test_avg_pool_forms(fn, inputs):
    check_op(fn, *inputs)


@pytest.mark.parametrize("output_size", [1, 3, 4, (3, 4), (7, 6), (9, 8), (None, 4), (5, None), (2, 5)], ids=str)
@pytest.mark.parametrize("pool", [
    lambda x, size: F.adaptive_avg_pool2d(x, size),
    lambda x, size: pooling.AdaptiveAvgPool2d(size)(x),
    lambda x, size: F.adaptive_max_pool2d(x, size),
    lambda x, size: F.adaptive_max_pool2d(x, size, return_indices=True)[0],
    lambda x, size: F.adaptive_max_pool2d_with_indices(x, size)[0],
    lambda x, size: pooling.AdaptiveMaxPool2d(size)(x),
], ids=["avg F", "avg module", "max F", "max F return_indices", "max F with_indices", "max module"])
def test_adaptive_pool2d(output_size, pool):
    check_op(lambda x: pool(x, output_size), X)


@pytest.mark.parametrize("fn, inputs", [
    (lambda x: F.adaptive_avg_pool1d(x, 4), (X1,)),
    (lambda x: F.adaptive_avg_pool1d(x, 12), (X1,)),  # more outputs than inputs: windows overlap
    (lambda x: torch.adaptive_avg_pool1d(x, 5), (X1[0],)),
    (lambda x: pooling.AdaptiveAvgPool1d(2)(x), (X1,)),
    (lambda x: F.adaptive_max_pool1d(x, 4), (X1,)),
    (lambda x: F.adaptive_max_pool1d(x, 5, return_indices=True)[0], (X1,)),
    (lambda x: pooling.AdaptiveMaxPool1d(4)(x), (X1[0],)),
    (lambda x: F.adaptive_avg_pool3d(x, (2, 3, 2)), (X3,)),
    (lambda x: pooling.AdaptiveAvgPool3d((None, 2, 1))(x), (X3,)),
    (lambda x: F.adaptive_max_pool3d(x, 2), (X3,)),
    (lambda x: pooling.AdaptiveMaxPool3d((3, 2, 2))(x), (X3,)),
    (lambda x: F.adaptive_avg_pool2d(x, (3, 4)), (X[0],)),  # unbatched
    (lambda x: F.adaptive_max_pool2d(x, 3), (X[0].double(),)),
    (lambda x: F.adaptive_avg_pool2d(x, 3), (non_contiguous(X),)),
])
def test_adaptive_pool_forms(fn, inputs):
    check_op(fn, *inputs)


@pytest.mark.parametrize("fn", [
    lambda x: F.max_pool2d(x, 3, 1, 1) ** 2,
    lambda x: F.max_pool1d(x.flatten(2), 3, 2, ceil_mode=True) ** 3,
    lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False) ** 2,
    lambda x: F.avg_pool2d(x, 2, divisor_override=3) ** 2,
    lambda x: F.adaptive_avg_pool2d(x, (3, 4)) ** 2,
    lambda x: F.adaptive_max_pool2d(x, (5, 4)) ** 2,
    lambda x: torch.tanh(F.avg_pool2d(F.max_pool2d(x, 2, 1), 2)),
])
def test_double_backward(fn):
    double_backward_matches(fn, X[:1].double())


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 4), st.integers(1, 3), st.integers(0, 2), st.integers(1, 2), st.booleans(), st.booleans(),
       st.integers(7, 10), st.integers(7, 10))
def test_pools_random_shapes(kernel, stride, padding, dilation, ceil_mode, count_include_pad, height, width):
    """Random shapes and options: forward and input gradient equal torch autograd's."""
    padding = min(padding, kernel // 2)  # torch's limit
    x = torch.randn(1, 2, height, width)
    tt.check(lambda x: F.max_pool2d(x, kernel, stride, padding, dilation, ceil_mode), x)
    tt.check(lambda x: F.avg_pool2d(x, kernel, stride, padding, ceil_mode, count_include_pad), x)
    tt.check(lambda x: F.adaptive_avg_pool2d(x, (kernel + stride, height - padding)), x)


def test_indices_are_returned_and_not_differentiable():
    x = tt.tracer(X, requires_grad=True)
    out, indices = F.max_pool2d(x, 3, 2, return_indices=True)
    expected_out, expected_indices = torch.nn.MaxPool2d(3, 2, return_indices=True)(X)
    assert torch.equal(indices.as_subclass(torch.Tensor), expected_indices)
    assert torch.equal(out.as_subclass(torch.Tensor), expected_out)
    assert indices.dtype == torch.int64 and not indices.requires_grad and indices.grad_fn is None
    out, indices = pooling.AdaptiveMaxPool2d(4, return_indices=True)(x)
    assert torch.equal(indices.as_subclass(torch.Tensor), F.adaptive_max_pool2d(X, 4, return_indices=True)[1])
    out.sum().backward()
    assert x.grad.shape == X.shape


@pytest.mark.parametrize("layer, name", [
    (pooling.MaxPool2d(2), "MaxPool2dBackward"),
    (pooling.MaxPool2d(2, return_indices=True), "MaxPool2dWithIndicesBackward"),
    (pooling.AvgPool2d(2), "AvgPool2dBackward"),
    (pooling.AdaptiveAvgPool2d(3), "AdaptiveAvgPool2dBackward"),
    (pooling.AdaptiveMaxPool2d(3), "AdaptiveMaxPool2dBackward"),
    (pooling.AdaptiveMaxPool2d(3, return_indices=True), "AdaptiveMaxPool2dWithIndicesBackward"),
])
def test_modules_record_their_rule_and_label(layer, name):
    result = layer(tt.tracer(X, requires_grad=True))
    out = result[0] if isinstance(result, tuple) else result
    assert out.grad_fn.name == name
    if not isinstance(result, tuple):  # tt.nn.Module labels single-tensor results only
        assert out.grad_fn.module is layer
    assert layer.original_repr() == repr(layer)  # pooling layers print as torch prints them


def test_registered_callables():
    for op in (F.max_pool1d, F.max_pool2d, F.max_pool3d, F.max_pool1d_with_indices, F.max_pool2d_with_indices,
               torch.max_pool1d, torch.max_pool2d, torch.max_pool1d_with_indices, F.avg_pool1d, F.avg_pool2d,
               F.avg_pool3d, F.adaptive_avg_pool1d, F.adaptive_avg_pool2d, F.adaptive_avg_pool3d,
               F.adaptive_max_pool1d, F.adaptive_max_pool2d, F.adaptive_max_pool2d_with_indices):
        assert op in tt.supported_ops()


def test_training_step_gradients_equal_torch():
    """A conv-free pipeline of pooling modules: input gradients equal torch's."""
    ours = [pooling.MaxPool2d(2, 1), pooling.AvgPool2d(2, ceil_mode=True), pooling.AdaptiveAvgPool2d((2, 3))]
    theirs = [torch.nn.MaxPool2d(2, 1), torch.nn.AvgPool2d(2, ceil_mode=True), torch.nn.AdaptiveAvgPool2d((2, 3))]
    x, reference = tt.tracer(X, requires_grad=True), X.clone().requires_grad_(True)
    h, r = x, reference
    for layer, twin in zip(ours, theirs):
        h, r = layer(h), twin(r)
    torch.testing.assert_close(h.as_subclass(torch.Tensor), r.detach())
    h.pow(2).sum().backward()
    r.pow(2).sum().backward()
    torch.testing.assert_close(x.grad, reference.grad)


INF_X = X.double().clone()
INF_X[0, 0, :3, :3] = -float("inf")  # a window of -inf only: torch still picks an index, the gradient goes there
INF_X[1, 1] = -float("inf")
NAN_X = X.double().clone()
NAN_X[0, 0, 1, 1] = float("nan")  # NaN wins the max: its window's gradient goes to it


def _edge_grads_equal(fn, x: torch.Tensor) -> None:
    """Output and input gradient equal torch autograd's, NaN and inf compared as values (no gradcheck there)."""
    theirs = x.clone().requires_grad_(True)
    expected = fn(theirs)
    g = torch.randn_like(expected)
    expected.backward(g)
    ours = tt.tracer(x, requires_grad=True)
    out = fn(ours)
    out.backward(g)
    torch.testing.assert_close(out.as_subclass(torch.Tensor), expected.detach(), equal_nan=True)
    torch.testing.assert_close(ours.grad, theirs.grad, equal_nan=True)


EDGE_POOLS = [  # windows hanging off the edge (ceil_mode), padding = half the kernel, dilation
    lambda x: F.max_pool2d(x, 3, 2, 1, 1, True), lambda x: F.max_pool2d(x, 4, 3, 2, 2, True),
    lambda x: F.max_pool2d(x, 2, 3, 1, 1, True), lambda x: F.max_pool1d(x.flatten(2), 4, 3, 2, 3, True),
    lambda x: F.avg_pool2d(x, 3, 2, 1, True, False), lambda x: F.avg_pool2d(x, 4, 3, 2, True, True),
    lambda x: F.avg_pool2d(x, 2, 3, 1, True, True, 3), lambda x: F.adaptive_max_pool2d(x, (5, 4)),
]


@pytest.mark.parametrize("fn", EDGE_POOLS)
@pytest.mark.parametrize("x", [X.double(), INF_X, NAN_X, TIES.double(), X.double()[:0]],
                         ids=["generic", "-inf", "nan", "ties", "empty batch"])
def test_pool_edges_match_torch(fn, x):
    _edge_grads_equal(fn, x)


SAMPLES2 = torch.rand(2, 3, 2, dtype=torch.float64)
SAMPLES3 = torch.rand(1, 2, 3, dtype=torch.float64)
X3F = torch.randn(1, 2, 6, 5, 5, dtype=torch.float64)


@pytest.mark.parametrize("fn, inputs", [
    (lambda x: F.fractional_max_pool2d(x, 2, output_size=3, _random_samples=SAMPLES2), (X.double(),)),
    (lambda x: F.fractional_max_pool2d(x, (2, 3), output_ratio=(0.5, 0.5), _random_samples=SAMPLES2), (X.double(),)),
    (lambda x: F.fractional_max_pool2d(x, 3, (4, 3), return_indices=True, _random_samples=SAMPLES2)[0],
     (X.double(),)),
    (lambda x: F.fractional_max_pool2d_with_indices(x, 2, 5, _random_samples=SAMPLES2)[0], (X.double(),)),
    (lambda x: F.fractional_max_pool2d(x, 2, 3, _random_samples=SAMPLES2[:1]), (X.double()[0],)),  # unbatched
    (lambda x: F.fractional_max_pool3d(x, 2, output_size=(3, 2, 2), _random_samples=SAMPLES3), (X3F,)),
    (lambda x: F.fractional_max_pool3d_with_indices(x, 2, output_ratio=(0.6, 0.6, 0.6), _random_samples=SAMPLES3)[0],
     (X3F,)),
    (lambda x: pooling.FractionalMaxPool2d(2, 3, _random_samples=SAMPLES2)(x), (X.double(),)),
    (lambda x: pooling.FractionalMaxPool3d(2, 2, _random_samples=SAMPLES3)(x), (X3F,)),
])
def test_fractional_max_pool(fn, inputs):
    check_op(fn, *inputs)


def test_fractional_max_pool_draws_torchs_windows():
    """Without _random_samples the windows come from torch's RNG, once: the same seed gives torch's result."""
    torch.manual_seed(3)
    expected = F.fractional_max_pool2d(X, 2, output_size=3)
    torch.manual_seed(3)
    x = tt.tracer(X, requires_grad=True)
    y = F.fractional_max_pool2d(x, 2, output_size=3)
    assert torch.equal(y.as_subclass(torch.Tensor), expected)
    y.sum().backward()
    assert x.grad.sum() == y.numel() and repr(pooling.FractionalMaxPool2d(2, 3)) == repr(
        torch.nn.FractionalMaxPool2d(2, 3))


def test_fractional_max_pool_double_backward():
    double_backward_matches(lambda x: F.fractional_max_pool2d(x, 2, 3, _random_samples=SAMPLES2) ** 3, X.double())


@pytest.mark.parametrize("args", [(2,), (2, 2), (3, 2, 1), (2, 1, 0, 2), (3, 3, 1, 1, True)])
def test_max_pool2d_through_the_channels_last_kernel_gives_torchs_values_indices_and_layout(args):
    x = torch.randn(2, 4, 7, 9, dtype=torch.float64)
    x[0, 0, 0, :3] = float("nan")  # NaN wins its window (torch: the last NaN's index)
    x[1, 1, 2:4, 2:4] = float("-inf")  # an all -inf window: the first position
    x[1, 2] = 0.0  # ties everywhere: the first maximum
    y, indices = F.max_pool2d_with_indices(tt.tracer(x, requires_grad=True), *args, return_indices=True)
    expected, expected_indices = F.max_pool2d_with_indices(x, *args, return_indices=True)
    torch.testing.assert_close(y.as_subclass(torch.Tensor), expected, equal_nan=True, rtol=0, atol=0)
    assert torch.equal(indices.as_subclass(torch.Tensor), expected_indices)
    assert y.is_contiguous() and indices.is_contiguous()  # the layout torch returns for an NCHW input
    finite = torch.randn(2, 4, 7, 9, dtype=torch.float64)
    check_op(lambda t: F.max_pool2d(t, *args), finite)
    double_backward_matches(lambda t: F.max_pool2d(t, *args) ** 2, finite)


@pytest.mark.parametrize("fn, shape", [(F.max_pool1d, (1, 1, 6)), (F.avg_pool1d, (1, 1, 6)),
                                       (F.max_pool2d, (1, 1, 6, 6)), (F.avg_pool2d, (1, 1, 6, 6)),
                                       (F.max_pool3d, (1, 1, 4, 4, 4)), (F.avg_pool3d, (1, 1, 4, 4, 4))])
def test_a_zero_stride_is_refused_as_torch_refuses_it_and_an_empty_one_is_the_kernel(fn, shape):
    """stride=0 was read as "not given" (the kernel's size) and pooled without an error."""
    x = torch.randn(shape, dtype=torch.float64)
    with pytest.raises(RuntimeError, match="stride"):
        fn(x, 2, stride=0)
    with pytest.raises(RuntimeError, match="stride.*zero"):  # (max_pool1d: torch's 2-d kernel's words)
        fn(tt.tracer(x, requires_grad=True), 2, stride=0)
    check_op(lambda t: fn(t, 2, stride=[]), x)


def test_max_pool1d_refuses_bad_arguments_in_torchs_words():
    """Through max_pool1d_with_indices, torch's 2-d kernel spoke ("Expected 3D or 4D", "dilationH") of a 1-d pool."""
    from torch.testing._internal.common_methods_invocations import op_db

    op = next(o for o in op_db if o.name == "nn.functional.max_pool1d")
    cases = list(op.error_inputs("cpu"))
    assert cases
    for case in cases:
        sample = case.sample_input
        messages = []
        for make in (lambda t: t.detach().requires_grad_(), lambda t: tt.tracer(t.detach(), requires_grad=True)):
            with pytest.raises(case.error_type) as raised:
                op(make(sample.input) if sample.input.is_floating_point() else sample.input, *sample.args,
                   **sample.kwargs)
            messages.append(str(raised.value))
        assert messages[0] == messages[1]
