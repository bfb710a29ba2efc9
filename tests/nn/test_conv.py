"""conv1d/2d/3d, conv_transpose1d/2d/3d and F.pad rules, and the convolution modules, against torch autograd."""
import itertools
import re
import warnings

import pytest
import torch
import torch.nn.functional as F
from helpers import check_op, double_backward_matches, load_example, non_contiguous
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.func import functional_call

import torchtrace as tt
from torchtrace.nn.conv import Conv1d, Conv2d, Conv3d, ConvTranspose1d, ConvTranspose2d, ConvTranspose3d


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny convolutions: torch's thread pool only adds contention (minutes on a loaded 2-core machine)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


pytestmark = pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel lengths")
torch.manual_seed(0)
ATOL = 1e-5  # float32 convolutions sum many products: torch's kernels and ours round in different orders
X = torch.randn(2, 4, 7, 6)  # odd and even spatial sizes
WEIGHTS = {  # name: (weight for 4 input channels, groups)
    "3x3": (torch.randn(6, 4, 3, 3), 1),
    "3x2 groups=2": (torch.randn(6, 2, 3, 2), 2),
    "depthwise": (torch.randn(8, 1, 3, 3), 4),
    "2x4 even": (torch.randn(3, 4, 2, 4), 1),
}
CONV2D_OPTIONS = [
    {}, {"stride": 2}, {"stride": (2, 3)}, {"padding": 1}, {"padding": (2, 0)}, {"padding": "valid"},
    {"padding": "same"}, {"padding": "same", "dilation": 2}, {"padding": "same", "dilation": (1, 3)},
    {"dilation": 2}, {"dilation": (1, 2), "padding": 2}, {"stride": 2, "padding": 1, "dilation": 2},
    {"stride": 3, "padding": (2, 1)},
]




def fits(conv, x, w, groups, options):
    """Whether torch accepts these options (a dilated kernel must fit in the padded input)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            conv(x, w, groups=groups, **options)
        except RuntimeError:
            return False
    return True


@pytest.mark.parametrize("options, weight", [(options, weight) for options in CONV2D_OPTIONS for weight in WEIGHTS
                                             if fits(F.conv2d, X, *WEIGHTS[weight], options)], ids=str)
@pytest.mark.parametrize("bias", [True, False])
def test_conv2d_parameter_combinations(options, weight, bias):
    w, groups = WEIGHTS[weight]
    if bias:
        check_op(lambda x, w, b: F.conv2d(x, w, b, groups=groups, **options), X, w, torch.randn(w.shape[0]), atol=ATOL)
    else:
        check_op(lambda x, w: F.conv2d(x, w, groups=groups, **options), X, w, atol=ATOL)


W, B = WEIGHTS["3x2 groups=2"][0], torch.randn(6)


@pytest.mark.parametrize("fn, inputs", [
    (lambda x, w, b: torch.conv2d(x, w, b, 2, 1, 1, 2), (X, W, B)),  # all positional
    (lambda x, w, b: F.conv2d(input=x, weight=w, bias=b, groups=2), (X, W, B)),  # tensors as keywords
    (lambda x, w, b: F.conv2d(x, w, bias=b, padding="same", groups=2), (X, W, B)),
    (lambda x, w, b: F.conv2d(x, w, b, groups=2), (X.double(), W.double(), B.double())),
    (lambda x, w, b: F.conv2d(x, w, b, stride=2, groups=2), (non_contiguous(X), non_contiguous(W), B)),
    (lambda x, w, b: F.conv2d(x, w, b, padding="same", groups=2), (X[0], W, B)),  # unbatched input
    (lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=1, groups=2), (X[0], W, B)),
    (lambda x: F.conv2d(x, x[:, :1]), (torch.randn(3, 1, 4, 4),)),  # one tensor as input and weight
    (lambda x, w, b: F.conv2d(x, w, b, groups=2) * F.conv2d(x, w, None, groups=2), (X, W, B)),  # fan-out
    (lambda x, w: F.conv2d(F.conv2d(x, w, padding=1, groups=6), w[:, :1].expand(6, 6, 3, 2).contiguous()),
     (torch.randn(1, 6, 5, 5), torch.randn(6, 1, 3, 2))),  # a chain of two convolutions
    (lambda x, w, b: F.conv2d(x, w, b), (torch.randn(1, 4, 8, 8), torch.randn(2, 4, 8, 8), torch.randn(2))),
    (lambda x, w, b: F.conv2d(x, w, b, groups=2), (torch.randn(0, 4, 7, 6), W, B)),  # an empty batch
])
def test_conv2d_forms(fn, inputs):
    check_op(fn, *inputs, atol=ATOL)


X1 = torch.randn(2, 4, 9)


@pytest.mark.parametrize("fn, inputs", [
    (lambda x, w, b: F.conv1d(x, w, b), (X1, torch.randn(3, 4, 3), torch.randn(3))),
    (lambda x, w: F.conv1d(x, w, stride=2, padding=2, dilation=2), (X1, torch.randn(3, 4, 3))),
    (lambda x, w, b: F.conv1d(x, w, b, padding="same"), (X1, torch.randn(3, 4, 4), torch.randn(3))),  # even kernel
    (lambda x, w, b: F.conv1d(x, w, b, padding="same", dilation=3), (X1, torch.randn(3, 4, 2), torch.randn(3))),
    (lambda x, w, b: F.conv1d(x, w, b, padding="valid", groups=4), (X1, torch.randn(8, 1, 3), torch.randn(8))),
    (lambda x, w, b: torch.conv1d(x, w, b, 3, 1, 1, 2), (X1, torch.randn(4, 2, 2), torch.randn(4))),
    (lambda x, w, b: F.conv1d(x, w, b, padding=1), (X1[0], torch.randn(3, 4, 3), torch.randn(3))),  # unbatched
    (lambda x, w, b: F.conv1d(x, w, b), (X1.double(), torch.randn(3, 4, 3).double(), torch.randn(3).double())),
    (lambda x, w, b: F.conv3d(x, w, b, stride=2, padding=1), (torch.randn(1, 2, 4, 5, 3), torch.randn(4, 2, 2, 3, 2),
                                                              torch.randn(4))),
    (lambda x, w: F.conv3d(x, w, padding="same", groups=2), (torch.randn(1, 2, 3, 4, 3), torch.randn(2, 1, 2, 2, 3))),
])
def test_conv1d_and_conv3d(fn, inputs):
    check_op(fn, *inputs, atol=ATOL)


X_T = torch.randn(2, 4, 4, 3)
TRANSPOSE_WEIGHTS = {
    "3x2": (torch.randn(4, 3, 3, 2), 1),
    "3x3 groups=2": (torch.randn(4, 2, 3, 3), 2),
    "depthwise": (torch.randn(4, 1, 2, 3), 4),
}
TRANSPOSE_OPTIONS = [
    {}, {"stride": 2}, {"stride": 2, "output_padding": 1}, {"padding": 1}, {"dilation": 2},
    {"stride": (2, 3), "padding": (1, 0), "output_padding": (1, 2)},
    {"stride": 2, "dilation": 3, "output_padding": 2},  # output_padding >= stride (allowed: < dilation)
    {"stride": 3, "padding": 1, "dilation": (2, 1), "output_padding": (2, 0)},
]


@pytest.mark.parametrize("options", TRANSPOSE_OPTIONS, ids=str)
@pytest.mark.parametrize("weight", TRANSPOSE_WEIGHTS, ids=str)
@pytest.mark.parametrize("bias", [True, False])
def test_conv_transpose2d_parameter_combinations(options, weight, bias):
    w, groups = TRANSPOSE_WEIGHTS[weight]
    if bias:
        b = torch.randn(w.shape[1] * groups)
        check_op(lambda x, w, b: F.conv_transpose2d(x, w, b, groups=groups, **options), X_T, w, b, atol=ATOL)
    else:
        check_op(lambda x, w: F.conv_transpose2d(x, w, groups=groups, **options), X_T, w, atol=ATOL)


WT, BT = TRANSPOSE_WEIGHTS["3x3 groups=2"][0], torch.randn(4)


@pytest.mark.parametrize("fn, inputs", [
    (lambda x, w, b: torch.conv_transpose2d(x, w, b, 2, 1, 1, 2, 1), (X_T, WT, BT)),  # all positional
    (lambda x, w, b: F.conv_transpose2d(input=x, weight=w, bias=b, groups=2), (X_T, WT, BT)),
    (lambda x, w, b: F.conv_transpose2d(x, w, b, stride=2, groups=2), (X_T[0], WT, BT)),  # unbatched input
    (lambda x, w, b: F.conv_transpose2d(x, w, b, groups=2), (non_contiguous(X_T), non_contiguous(WT), BT)),
    (lambda x, w, b: F.conv_transpose2d(x, w, b, groups=2), (X_T.double(), WT.double(), BT.double())),
    (lambda x, w: F.conv2d(F.conv_transpose2d(x, w, stride=2), w), (X_T, torch.randn(4, 4, 3, 3))),
    (lambda x, w, b: F.conv_transpose2d(x, w, b, groups=2), (torch.randn(0, 4, 4, 3), WT, BT)),  # an empty batch
    (lambda x, w, b: F.conv_transpose1d(x, w, b, stride=3, padding=2, output_padding=1),
     (torch.randn(2, 4, 5), torch.randn(4, 3, 3), torch.randn(3))),
    (lambda x, w: F.conv_transpose1d(x, w, groups=2, dilation=2), (torch.randn(4, 5), torch.randn(4, 1, 3))),
    (lambda x, w, b: F.conv_transpose3d(x, w, b, stride=2, padding=1), (torch.randn(1, 2, 3, 2, 3),
                                                                       torch.randn(2, 3, 2, 3, 2), torch.randn(3))),
])
def test_conv_transpose_forms(fn, inputs):
    check_op(fn, *inputs, atol=ATOL)


@pytest.mark.parametrize("fn, inputs", [
    (lambda x, w, b: torch.tanh(F.conv2d(x, w, b, stride=2, padding=1, groups=2)), (X[:1], W, B)),
    (lambda x, w, b: torch.tanh(F.conv2d(x, w, b, padding="same", dilation=(1, 3), groups=2)), (X[:1], W, B)),
    (lambda x, w: torch.tanh(F.conv1d(x, w, padding="same")), (X1, torch.randn(3, 4, 4))),
    (lambda x, w, b: torch.tanh(F.conv_transpose2d(x, w, b, 2, 1, 1, 2)), (X_T[:1], WT, BT)),
    (lambda x, w: torch.tanh(F.conv_transpose2d(x, w, stride=2, dilation=3, output_padding=2)),
     (X_T[:1], torch.randn(4, 3, 3, 2))),
    (lambda x: F.pad(x, (1, 2, -1, 3), value=0.5) ** 2, (X[:1],)),
    (lambda x: F.pad(x, (1, 2, 2, 3), mode="reflect") ** 3, (X[:1],)),
    (lambda x: F.pad(x, (3, 2), mode="replicate") ** 2, (X1,)),
    (lambda x: F.pad(x, (1, 2, 2, 0), mode="circular") ** 2, (X[:1],)),
])
def test_double_backward(fn, inputs):
    double_backward_matches(fn, *[x.double() for x in inputs])


@pytest.mark.parametrize("fn, inputs", [
    (lambda x: F.pad(x, (1, 2)), (X,)),
    (lambda x: F.pad(x, (1, 2, -1, 3)), (X,)),  # a negative padding crops
    (lambda x: F.pad(x, [2, 0, 1, 1, 1, 0], value=-1.5), (X,)),
    (lambda x: F.pad(x, (1, 2, 2, 3), mode="reflect"), (X,)),
    (lambda x: F.pad(x, (3, 2), mode="reflect"), (X1,)),
    (lambda x: F.pad(x, (1, 2, 2, 3), mode="replicate"), (X,)),
    (lambda x: F.pad(x, (1, 1, 0, 2, 2, 1), mode="replicate"), (torch.randn(1, 2, 3, 4, 3),)),
    (lambda x: F.pad(x, (1, 2, 2, 3), mode="circular"), (X,)),
    (lambda x: F.pad(x, (4, 5), mode="circular"), (X1,)),
    (lambda x: F.pad(input=x, pad=(1, 1), mode="reflect") * x.sum(), (X1[0],)),  # unbatched, used twice
    (lambda x: F.pad(x, (1, 1, 1, 1)), (non_contiguous(X[0]).double(),)),
])
def test_pad(fn, inputs):
    check_op(fn, *inputs, atol=ATOL)



NEGATIVE_PADS = [(1, -2), (-2, 1), (-1, -1), (2, -1), (-3, 0), (0, -3), (3, -2), (-2, 2)]


@pytest.mark.parametrize("mode", ["constant", "reflect", "replicate", "circular"])
@pytest.mark.parametrize("pad", NEGATIVE_PADS, ids=str)
def test_pad_negative(mode, pad):
    """A negative pad crops: only the elements the forward read get a gradient (circular wraps around the cropped
    interior, so F.pad(x, (1, -2), mode="circular") never reads x's last two elements)."""
    check_op(lambda x: F.pad(x, pad, mode=mode), X1.double())
    check_op(lambda x: F.pad(x, pad + pad[::-1], mode=mode), X.double())  # two dims, mirrored pads


def test_pad_circular_negative_reads_only_the_interior():
    x = tt.tracer(torch.arange(5.0).reshape(1, 1, 5), requires_grad=True)
    F.pad(x, (1, -2), mode="circular").sum().backward()
    assert x.grad.tolist() == [[[1.0, 1.0, 2.0, 0.0, 0.0]]]  # y = (x2, x0, x1, x2)

@settings(max_examples=25, deadline=None)
@given(st.integers(1, 2), st.integers(1, 3), st.integers(1, 3), st.integers(0, 2), st.integers(1, 2),
       st.sampled_from([1, 2]), st.integers(7, 10), st.integers(7, 10), st.booleans())
def test_conv2d_random_shapes(batch, kernel, stride, padding, dilation, groups, height, width, use_bias):
    """Random shapes and options: forward and every gradient equal torch autograd's."""
    x, w = torch.randn(batch, 2 * groups, height, width), torch.randn(2 * groups, 2, kernel, kernel + 1)
    b = torch.randn(2 * groups) if use_bias else None
    tt.check(lambda x, w, b: F.conv2d(x, w, b, stride, padding, dilation, groups), x, w, b, atol=ATOL)
    tt.check(lambda x, w: F.conv_transpose2d(x, w, None, stride, 0, stride - 1, groups, dilation), x, w, atol=ATOL)


def test_refused_and_invalid_arguments():
    with pytest.raises(ValueError, match="invalid padding string 'full'"):
        F.conv2d(tt.tracer(X, requires_grad=True), W, groups=2, padding="full")
    with pytest.raises(tt.UnsupportedOperationError, match=re.escape("pad: mode='wrap' has no gradient rule")):
        F.pad(tt.tracer(X, requires_grad=True), (1, 1), mode="wrap")
    with pytest.raises(RuntimeError, match="padding='same' is not supported for strided convolutions"):
        F.conv2d(tt.tracer(X, requires_grad=True), W, groups=2, padding="same", stride=2)


def test_nodes_and_registered_callables():
    for op in (torch.conv1d, torch.conv2d, torch.conv3d, F.conv2d, torch.conv_transpose1d, torch.conv_transpose2d,
               torch.conv_transpose3d, F.conv_transpose2d, F.pad):
        assert op in tt.supported_ops()
    x = tt.tracer(X, requires_grad=True)
    assert F.conv2d(x, W, groups=2).grad_fn.name == "ConvolutionBackward"
    assert F.conv_transpose2d(x, WT, groups=2).grad_fn.name == "ConvTransposeBackward"
    assert F.pad(x, (1, 1)).grad_fn.name == "PadBackward"
    assert F.conv2d(x.detach(), W, groups=2).grad_fn is None  # nothing requires a gradient: nothing recorded


@pytest.mark.parametrize("ours, theirs, x", [
    (lambda: Conv2d(4, 6, 3), lambda: torch.nn.Conv2d(4, 6, 3), X),
    (lambda: Conv2d(4, 6, (3, 2), stride=2, padding=1, groups=2, bias=False),
     lambda: torch.nn.Conv2d(4, 6, (3, 2), stride=2, padding=1, groups=2, bias=False), X),
    (lambda: Conv1d(4, 3, 4, padding="same"), lambda: torch.nn.Conv1d(4, 3, 4, padding="same"), X1),
    (lambda: Conv3d(2, 3, 2), lambda: torch.nn.Conv3d(2, 3, 2), torch.randn(1, 2, 3, 4, 3)),
    (lambda: ConvTranspose1d(4, 2, 3, stride=2), lambda: torch.nn.ConvTranspose1d(4, 2, 3, stride=2), X1),
    (lambda: ConvTranspose2d(4, 6, 3, stride=2, groups=2),
     lambda: torch.nn.ConvTranspose2d(4, 6, 3, stride=2, groups=2), X_T),
    (lambda: ConvTranspose3d(2, 1, 2), lambda: torch.nn.ConvTranspose3d(2, 1, 2), torch.randn(1, 2, 2, 3, 2)),
])
def test_same_seed_same_layer_as_torch(ours, theirs, x):
    torch.manual_seed(7)
    layer = ours()
    torch.manual_seed(7)
    twin = theirs()
    for (name, p), (twin_name, q) in zip(layer.named_parameters(), twin.named_parameters()):
        assert name == twin_name and torch.equal(p.as_subclass(torch.Tensor), q.detach())
    torch.testing.assert_close(layer(tt.tracer(x)).as_subclass(torch.Tensor), twin(x).detach())


@pytest.mark.parametrize("make, x", [
    (lambda: Conv2d(4, 6, 3, padding=1), X),
    (lambda: Conv2d(4, 4, 3, groups=4, padding="same", bias=False), X),  # depthwise
    (lambda: Conv2d(4, 2, (2, 3), padding=(1, 2), padding_mode="reflect"), X),
    (lambda: Conv2d(4, 2, 3, padding=1, padding_mode="replicate"), X),
    (lambda: Conv2d(4, 2, 3, padding=(2, 1), padding_mode="circular", dilation=2), X),
    (lambda: Conv1d(4, 3, 2, padding="same", padding_mode="circular"), X1),
    (lambda: Conv2d(4, 6, 3, dtype=torch.float64), X.double()),
    (lambda: ConvTranspose2d(4, 2, 3, stride=2, padding=1, output_padding=1), X_T),
])
def test_module_gradients_match_torch(make, x):
    """Input and parameter gradients of the module, through torch.func.functional_call."""
    layer = make()
    params = dict(layer.named_parameters())
    check_op(lambda p, x: functional_call(layer, p, (x,)), params, x, atol=ATOL)


def test_conv_transpose_module_output_size():
    layer = ConvTranspose2d(4, 2, 3, stride=2)
    twin = torch.nn.ConvTranspose2d(4, 2, 3, stride=2)
    twin.load_state_dict(layer.state_dict())
    x = tt.tracer(X_T, requires_grad=True)
    out = layer(x, output_size=(10, 8))
    expected = twin(X_T, output_size=(10, 8))
    assert out.shape == expected.shape == (2, 2, 10, 8)
    out.pow(2).sum().backward()
    expected.pow(2).sum().backward()
    torch.testing.assert_close(layer.weight.grad, twin.weight.grad)


def test_training_step_gradients_equal_torch():
    torch.manual_seed(1)
    layer = Conv2d(4, 6, 3, stride=2, padding="valid", groups=2)
    twin = torch.nn.Conv2d(4, 6, 3, stride=2, padding="valid", groups=2)
    twin.load_state_dict(layer.state_dict())
    x = tt.tracer(X, requires_grad=True)
    out = layer(x)
    assert out.grad_fn.module is layer
    torch.relu(out).pow(2).sum().backward()
    reference = X.clone().requires_grad_(True)
    torch.relu(twin(reference)).pow(2).sum().backward()
    torch.testing.assert_close(x.grad, reference.grad)
    torch.testing.assert_close(layer.weight.grad, twin.weight.grad)
    torch.testing.assert_close(layer.bias.grad, twin.bias.grad)


def test_printing():
    layer = Conv2d(3, 8, kernel_size=8, stride=4)
    assert layer.original_repr() == "Conv2d 3 -> 8"
    assert repr(layer) == "Conv2d(3, 8, kernel_size=(8, 8), stride=(4, 4))"
    assert ConvTranspose2d(4, 2, 3).original_repr() == "ConvTranspose2d 4 -> 2"
    assert Conv1d(2, 5, 3).original_repr() == "Conv1d 2 -> 5"


def test_original_snippet_c_model():
    torch.manual_seed(3)
    model = load_example("snippet_c_conv_trace").myConv()
    assert repr(model).splitlines() == [
        "Sequence(", "    (0):Sequence(", "        (0):Conv2d 3 -> 8", "        (1):ReLU()",
        "        (2):Conv2d 8 -> 4", "        (3):ReLU()", "        (4):Conv2d 4 -> 2", "        (5):ReLU()",
        "    )", "    (1):Linear layer (98 X 1)", ")",
    ]
    x = torch.rand(3, 3, 84, 84)
    shapes = [tuple(t.shape) for t in itertools.accumulate(model.conv, lambda h, layer: layer(h), initial=x)]
    assert shapes[1::2] == [(3, 8, 20, 20), (3, 4, 9, 9), (3, 2, 7, 7)]
    twin = torch.nn.ModuleDict({
        "conv": torch.nn.Sequential(torch.nn.Conv2d(3, 8, 8, 4), torch.nn.ReLU(), torch.nn.Conv2d(8, 4, 4, 2),
                                    torch.nn.ReLU(), torch.nn.Conv2d(4, 2, 3, 1), torch.nn.ReLU()),
        "fc": torch.nn.Linear(98, 1),
    })
    twin.load_state_dict(model.state_dict())
    model(x).Sum().backward()
    twin["fc"](twin["conv"](x).flatten(1)).sum().backward()
    for (name, p), (_, q) in zip(model.named_parameters(), twin.named_parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.parametrize("x", [X.double(), X.double()[:0]], ids=["batch", "empty batch"])
@pytest.mark.parametrize("options", [
    {"padding": 1}, {"padding": 2, "dilation": 2}, {"padding": 1, "stride": 3}, {"padding": (1, 0), "dilation": (3, 2)},
    {"padding": "same", "dilation": 2}, {"padding": 1, "stride": 2, "groups": 4},
], ids=str)
def test_conv_edges(x, options):
    """Padding of half the kernel, dilation, strides that skip the last rows, an empty batch."""
    weight = torch.randn(4, 4 // options.get("groups", 1), 3, 3, dtype=torch.float64)
    check_op(lambda x, w, b: F.conv2d(x, w, b, **options), x, weight, torch.randn(4, dtype=torch.float64))


@pytest.mark.parametrize("mode", ["constant", "reflect", "replicate", "circular"])
def test_pad_cropping_everything_gives_zero_gradients_as_torch(mode):
    """F.pad(x, (0, 0, 0, -5)) of 5 rows is empty: its sum is 0 and every gradient is 0, as in torch."""
    check_op(lambda x: F.pad(x, (0, 0, 0, -5), mode=mode).sum() + (x * 0).sum(), torch.randn(1, 5, 3))
    check_op(lambda x: F.pad(x, (0, 0, 0, -5), mode=mode), torch.randn(2, 1, 5, 3))


@pytest.mark.parametrize("fn, x_shape, w_shape", [
    (F.conv2d, (1, 2, 5), (1, 2, 2)), (F.conv1d, (1, 1, 4), (1, 2)), (F.conv1d, (1, 1, 4), (2,)),
    (torch.conv3d, (1, 1, 4, 4), (1, 1, 2, 2)), (F.conv_transpose1d, (1, 1, 4), (1, 2)),
    (F.conv_transpose2d, (1, 2, 5), (2, 1, 2)), (F.conv_transpose3d, (1, 2, 5, 5), (2, 1, 2, 2))])
def test_a_weight_of_another_rank_than_the_function_is_refused_as_torch_refuses_it(fn, x_shape, w_shape):
    """The rule chose conv1d/2d/3d by the weight's rank: conv2d with a 3-D weight returned conv1d's result, a 2-D
    weight raised a bare KeyError."""
    x, w = torch.randn(x_shape, dtype=torch.float64), torch.randn(w_shape, dtype=torch.float64)
    with pytest.raises(RuntimeError) as theirs:
        fn(x, w)
    with pytest.raises(RuntimeError) as ours:
        fn(tt.tracer(x, requires_grad=True), w)
    assert str(ours.value) == str(theirs.value)


@pytest.mark.parametrize("fn, w_shape", [(F.conv1d, (2, 3, 2)), (F.conv2d, (2, 3, 2, 2)), (F.conv3d, (2, 3, 2, 2, 2)),
                                         (F.conv_transpose1d, (3, 2, 2)), (F.conv_transpose2d, (3, 2, 2, 2)),
                                         (F.conv_transpose3d, (3, 2, 2, 2, 2))])
def test_each_convolution_function_has_its_rule_named_as_torchs(fn, w_shape):
    x = torch.randn(1, 3, *[4] * (len(w_shape) - 2), dtype=torch.float64)
    w = torch.randn(w_shape, dtype=torch.float64)
    y = fn(tt.tracer(x, requires_grad=True), tt.tracer(w, requires_grad=True))
    assert y.grad_fn.name() == ("ConvolutionBackward" if "transpose" not in fn.__name__ else "ConvTransposeBackward")
    check_op(fn, x, w)


@pytest.mark.parametrize("fn, x_shape, w_shape, options", [
    (F.conv2d, (4, 6, 9, 9), (8, 3, 3, 3), {"stride": 2, "padding": 1, "groups": 2}),
    (F.conv2d, (6, 9, 9), (8, 6, 3, 3), {"padding": "same", "dilation": 2}),  # unbatched
    (F.conv1d, (3, 4, 10), (5, 4, 3), {"padding": 2, "dilation": 2}),
    (F.conv3d, (2, 2, 5, 5, 5), (3, 2, 3, 3, 3), {"stride": (1, 2, 1)}),
    (F.conv_transpose2d, (4, 6, 5, 5), (6, 4, 3, 3), {"stride": 2, "padding": 1, "output_padding": 1}),
    (F.conv_transpose1d, (4, 6, 5), (6, 2, 3), {"stride": 3, "output_padding": 2, "groups": 3}),
])
def test_first_order_is_torch_autograds_bits(fn, x_shape, w_shape, options):
    """A first-order backward runs torch's convolution_backward: input, weight and bias gradients are torch autograd's
    bit for bit (create_graph keeps the convolutions with roles swapped: test_double_backward)."""
    torch.manual_seed(0)
    x, w = torch.randn(x_shape), torch.randn(w_shape)
    b = torch.randn(w_shape[1] * options.get("groups", 1) if "transpose" in fn.__name__ else w_shape[0])
    ours = [tt.tracer(t, requires_grad=True) for t in (x, w, b)]
    theirs = [t.clone().requires_grad_() for t in (x, w, b)]
    out, expected = fn(*ours, **options), fn(*theirs, **options)
    g = torch.randn(expected.shape)
    out.backward(g)
    expected.backward(g)
    assert torch.equal(out.as_subclass(torch.Tensor), expected.detach())
    for a, c in zip(ours, theirs):
        assert torch.equal(a.grad, c.grad)
