"""The first-order backwards that call torch's fused kernels (the smooth activations, layer and batch norm, the
convolutions, cross entropy with class indices, the pointwise losses), fuzzed against torch autograd: dtypes, missing
or frozen parameters, inputs that need no gradient, layouts of the inputs and of the incoming gradient, degenerate
shapes, graphs differentiated twice, and whole training steps. Kernel paths must give torch's bits; the written-out
formulas (asymmetric 'same' padding, label smoothing, probability targets, the losses' backwards) must agree to
float rounding."""
import copy
import itertools
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torchtrace as tt
import torchtrace.optim as tto

pytestmark = pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel lengths",
                                        "ignore:size_average and reduce args will be deprecated",
                                        "ignore:Using a target size")  # (broadcast targets, on purpose)

HALF = (torch.bfloat16, torch.float16)
FLOATS = (torch.float64, torch.float32, *HALF)
ROOT = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------------------------------------------ harness
def plain(t):
    return t.as_subclass(torch.Tensor) if isinstance(t, torch.Tensor) else t


def seeded(shape, dtype=torch.float64, seed=0) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def weighted(y: torch.Tensor) -> torch.Tensor:
    """sum(y * r) for a fixed r: a dense gradient of y's shape flows back into y."""
    return (y * seeded(y.shape, y.dtype, seed=1)).sum()


def _transposed(y: torch.Tensor) -> torch.Tensor:
    return weighted(y.transpose(0, -1)) if y.dim() else weighted(y)


def _narrowed(y: torch.Tensor) -> torch.Tensor:
    return weighted(torch.cat([torch.ones_like(y[..., :1]), y], -1)) if y.dim() else weighted(y)


CONSUMERS = {  # what reads an op's output, and so which gradient layout that op's backward receives
    "dense": weighted,
    "sum (zero-stride gradient)": lambda y: y.sum(),
    "transposed gradient": _transposed,
    "narrowed gradient with a storage offset": _narrowed,
    "float64 downstream": lambda y: weighted(y.double()),
}


def _differentiate(loss: torch.Tensor, leaves: list, how: str, autograd_grad) -> list:
    """Gradients by .backward() ("backward"), or by tt.grad / torch.autograd.grad without ("grad") or with
    ("create_graph": the written-out formulas) a graph recorded."""
    if how != "backward":
        return list(autograd_grad(loss, leaves, allow_unused=True, create_graph=how == "create_graph"))
    loss.backward()
    return [leaf.grad for leaf in leaves]


def run_both(fn, inputs: list, needs=None, consume=weighted, how: str = "backward") -> tuple:
    """fn on tracers and on torch leaves, each differentiated through consume(output) (see _differentiate): (our
    output, torch's, our gradients, torch's), a gradient None where its input does not require one. Integer inputs
    (targets) are handed to both as they are."""
    floats = [isinstance(t, torch.Tensor) and t.is_floating_point() for t in inputs]
    needs = floats if needs is None else needs
    ours = [tt.tracer(t.clone(), requires_grad=n) if f else t for t, f, n in zip(inputs, floats, needs)]
    theirs = [t.clone().requires_grad_(n) if f else t for t, f, n in zip(inputs, floats, needs)]
    out, expected = fn(*ours), fn(*theirs)
    wanted = [i for i, n in enumerate(needs) if n]
    got = _differentiate(consume(out), [ours[i] for i in wanted], how, tt.grad)
    want = _differentiate(consume(expected), [theirs[i] for i in wanted], how, torch.autograd.grad)
    ours_g, theirs_g = [None] * len(inputs), [None] * len(inputs)
    for i, a, b in zip(wanted, got, want):
        ours_g[i], theirs_g[i] = a, b
    return out, expected, ours_g, theirs_g


ROUNDING = 16  # ulps of a tensor's largest value: how far the written-out formulas may round from torch's kernels


def assert_matches(ours, theirs, ulps: float = 0, **tolerance) -> None:
    """Same presence, dtype, shape and values (NaN where torch has NaN): exact, within `ulps` units in the last place
    of each tensor's largest value (sums rounded in another order), or within assert_close's rtol / atol."""
    for a, b in zip(ours, theirs):
        assert (a is None) == (b is None), "a gradient is missing on one side"
        if b is None:
            continue
        a, b = plain(a).detach(), b.detach()
        finite = b[b.isfinite()] if b.is_floating_point() else torch.zeros(0)
        scale = ulps * torch.finfo(b.dtype).eps * finite.abs().max().item() if finite.numel() else 0.0
        torch.testing.assert_close(a, b, equal_nan=True, **(tolerance or {"rtol": 0.0, "atol": scale}))


def check(fn, inputs, needs=None, consume=weighted, how="backward", exact=True) -> None:
    """fn's output and gradients on tracers are torch's: bit for bit (a kernel path), or to float rounding."""
    out, expected, ours, theirs = run_both(fn, inputs, needs, consume, how)
    assert_matches([out, *ours], [expected, *theirs], ulps=0 if exact else ROUNDING)


def requires_grad_patterns(n: int):
    """Every choice of which of n inputs require a gradient, at least one of them."""
    return [p for p in itertools.product([True, False], repeat=n) if any(p)]


# ---------------------------------------------------------------------------------------------------- activations
ACTIVATIONS = {
    "torch.tanh": torch.tanh, "Tensor.tanh": torch.Tensor.tanh, "F.tanh": F.tanh,
    "torch.sigmoid": torch.sigmoid, "special.expit": torch.special.expit,
    "gelu": F.gelu, "gelu tanh": lambda x: F.gelu(x, approximate="tanh"), "silu": F.silu,
    "nn.GELU('tanh')": nn.GELU("tanh"), "nn.SiLU(inplace=True) on a copy": lambda x: nn.SiLU(inplace=True)(x * 1),
}
ACTIVATION_INPUTS = {
    "contiguous": lambda x: x,
    "transposed": lambda x: x.mT,
    "expanded": lambda x: x[:1].expand_as(x),
    "strided slice": lambda x: x[:, ::2],
}


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("layout", ACTIVATION_INPUTS)
@pytest.mark.parametrize("name", ACTIVATIONS)
def test_activation(name, layout, dtype):
    act, arrange = ACTIVATIONS[name], ACTIVATION_INPUTS[layout]
    x = seeded((5, 6), dtype) * 3
    for consume in CONSUMERS.values():
        check(lambda t: act(arrange(t)), [x], consume=consume)
    check(lambda t: act(arrange(t)), [x], how="grad")
    # recording: torch switches SiLU to a composite formula then, so its bits are not the kernel's
    check(lambda t: act(arrange(t)), [x], how="create_graph", exact=False)


def _silu_in_place(x):
    h = x * 1
    F.silu(h, inplace=True)
    return h


def _silu_in_place_on_a_view(x):
    h = x * 1
    F.silu(h[:, 1:], inplace=True)
    return h


def _tanh_in_place(x):
    h = x * 1
    h.tanh_()
    return h


def _sigmoid_in_place_on_a_view(x):
    h = x * 1
    torch.sigmoid_(h[1:, ::2])
    return h


def _used_twice(x):
    return torch.tanh(x) * torch.tanh(x * 2) + F.gelu(x) + F.gelu(x) + F.silu(torch.sigmoid(x))


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("fn", [_silu_in_place, _silu_in_place_on_a_view, _tanh_in_place, _sigmoid_in_place_on_a_view,
                                _used_twice])
def test_activation_in_place_and_reused(fn, dtype):
    """The result read through the mutated tensor (or its base), and ops applied twice to one input. (An in-place op
    on a view hands its kernel the gradient in another layout than torch does: a last-bit difference at most.)"""
    check(fn, [seeded((5, 6), dtype) * 3], exact=fn is _used_twice)


# ------------------------------------------------------------------------------------------------------ layer norm
LN_SHAPES = [((4, 6), (6,)), ((2, 3, 4, 5), (4, 5)), ((2, 3, 4, 5), (3, 4, 5)), ((7,), (7,)), ((3, 1), (1,)),
             ((0, 4), (4,))]
AFFINE = {"weight and bias": (True, True), "weight only": (True, False), "bias only": (False, True),
          "no affine": (False, False)}


def with_affine(x: torch.Tensor, shape, dtype, has_w: bool, has_b: bool) -> list:
    """[x, weight if has_w, bias if has_b]: the inputs of a norm whose affine parameters may be missing."""
    return [x] + [seeded(shape, dtype, seed) for seed, has in ((2, has_w), (3, has_b)) if has]


def affine(params: tuple, has_w: bool, has_b: bool) -> tuple:
    """(weight, bias) from the parameters with_affine passed, None for a missing one."""
    params = iter(params)
    return tuple(next(params) if has else None for has in (has_w, has_b))


def _layer_norm(normalized, has_w, has_b, eps):
    return lambda x, *params: F.layer_norm(x, normalized, *affine(params, has_w, has_b), eps)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("affine", AFFINE)
@pytest.mark.parametrize("shape, normalized", LN_SHAPES, ids=str)
def test_layer_norm(shape, normalized, affine, dtype):
    has_w, has_b = AFFINE[affine]
    inputs = with_affine(seeded(shape, dtype), normalized, dtype, has_w, has_b)
    for eps, needs in itertools.product([1e-5, 0.5], requires_grad_patterns(len(inputs))):
        check(_layer_norm(normalized, has_w, has_b, eps), inputs, list(needs))


@pytest.mark.parametrize("consumer", CONSUMERS)
@pytest.mark.parametrize("layout", ["transposed", "expanded", "strided", "channels_last"])
def test_layer_norm_input_and_gradient_layouts(layout, consumer):
    x = seeded((6, 4))
    arrange = {"transposed": lambda t: t.t(), "expanded": lambda t: t[:1].expand(5, 4), "strided": lambda t: t[:, ::2],
               "channels_last": lambda t: t.reshape(1, 6, 2, 2).to(memory_format=torch.channels_last)}[layout]
    size = arrange(x).shape[-1]
    check(lambda t, w, b: F.layer_norm(arrange(t), (size,), w, b), [x, seeded(size, seed=2), seeded(size, seed=3)],
          consume=CONSUMERS[consumer])


@pytest.mark.parametrize("options", [{}, {"bias": False}, {"elementwise_affine": False}, {"eps": 0.3}], ids=str)
def test_ported_layer_norm_module(options):
    model = nn.LayerNorm((4, 5), **options).double()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_()
    compare_modules(model, [seeded((3, 4, 5))], ["train"])


# ------------------------------------------------------------------------------------------------------ batch norm
BN_SHAPES = [(4, 3), (4, 3, 5), (2, 3, 4, 5), (2, 3, 2, 3, 2), (1, 3, 4), (5, 3, 1)]
BN_MODES = ["training, running stats", "training, no running stats", "eval"]
BN_DTYPES = {"float64": (torch.float64, torch.float64), "float32": (torch.float32, torch.float32),
             "bfloat16": (torch.bfloat16, torch.bfloat16), "float16": (torch.float16, torch.float16),
             "bfloat16 input, float32 parameters": (torch.bfloat16, torch.float32),
             "float16 input, float32 parameters": (torch.float16, torch.float32)}


def _batch_norm(mode, has_w, has_b, stats, momentum):
    """F.batch_norm with the next pair of running stats from `stats` (one for our call, one for torch's)."""
    def fn(x, *params):
        running = next(stats) if mode != "training, no running stats" else (None, None)
        return F.batch_norm(x, *running, *affine(params, has_w, has_b), mode != "eval", momentum, 1e-5)
    return fn


@pytest.mark.parametrize("dtypes", BN_DTYPES)
@pytest.mark.parametrize("affine", AFFINE)
@pytest.mark.parametrize("mode", BN_MODES)
@pytest.mark.parametrize("shape", BN_SHAPES, ids=str)
def test_batch_norm(shape, mode, affine, dtypes):
    """Gradients, and the running statistics training mode updates, equal torch's."""
    dtype, parameter_dtype = BN_DTYPES[dtypes]
    has_w, has_b = AFFINE[affine]
    inputs = with_affine(seeded(shape, dtype) * 2 + 1, 3, parameter_dtype, has_w, has_b)
    for needs, momentum in itertools.product(requires_grad_patterns(len(inputs)), [0.1, 0.0, 1.0]):
        pairs = [(seeded(3, parameter_dtype, 4), seeded(3, parameter_dtype, 5).abs() + 0.5) for _ in range(2)]
        check(_batch_norm(mode, has_w, has_b, iter(pairs), momentum), inputs, list(needs))
        assert_matches(*[[plain(t) for t in pair] for pair in pairs])


@pytest.mark.parametrize("consumer", CONSUMERS)
@pytest.mark.parametrize("layout", ["channels_last_3d", "expanded", "strided parameters"])
@pytest.mark.parametrize("training", [True, False], ids=["training", "eval"])
def test_batch_norm_input_and_gradient_layouts(training, layout, consumer):
    x = seeded((2, 3, 2, 3, 4))
    arrange, narrow = {"channels_last_3d": (lambda t: t.to(memory_format=torch.channels_last_3d), lambda p: p[:3]),
                       "expanded": (lambda t: t[:1].expand(4, 3, 2, 3, 4), lambda p: p[:3]),
                       "strided parameters": (lambda t: t, lambda p: p[::2])}[layout]

    def fn(t, w, b):
        return F.batch_norm(arrange(t), seeded(6, seed=4)[::2], seeded(6, seed=5).abs()[::2] + 0.5, narrow(w),
                            narrow(b), training)
    check(fn, [x, seeded(6, seed=2), seeded(6, seed=3)], consume=CONSUMERS[consumer])


def compare_modules(model: nn.Module, xs: list, modes: list, call=lambda net, x: net(x), ulps: float = 0) -> None:
    """A torch module and its ported deep copy, called on each of xs in the given train / eval mode and
    differentiated: outputs, input gradients, parameter gradients (accumulated over the calls) and buffers equal,
    call after call."""
    model.zero_grad(set_to_none=True)
    ours = tt.port(copy.deepcopy(model))
    for x, mode in zip(xs, modes):
        seen = []
        for net, leaf in ((ours, tt.tracer(x.clone(), requires_grad=True)), (model, x.clone().requires_grad_())):
            net.train(mode == "train")
            y = call(net, leaf)
            weighted(y).backward()
            seen.append([y, leaf.grad, *(p.grad for p in net.parameters()), *net.buffers()])
        assert_matches(*seen, ulps=ulps)


BN_MODULES = [(nn.BatchNorm1d, (4, 3)), (nn.BatchNorm1d, (4, 3, 5)), (nn.BatchNorm2d, (2, 3, 4, 5)),
              (nn.BatchNorm3d, (2, 3, 2, 3, 2))]
BN_OPTIONS = [{}, {"momentum": None}, {"affine": False}, {"track_running_stats": False}, {"momentum": 0.5, "eps": 0.1},
              {"affine": False, "track_running_stats": False, "momentum": None}, {"frozen": "weight"}]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("cls, shape, options, eval_batch", [
    (cls, shape, options, eval_batch) for (cls, shape), options, eval_batch in
    itertools.product(BN_MODULES, BN_OPTIONS, ["same batch", "batch of 1"])
    if not (eval_batch == "batch of 1" and len(shape) == 2 and options.get("track_running_stats") is False)
], ids=str)  # (torch refuses batch statistics of one value per channel)
def test_ported_batch_norm_module_over_steps(cls, shape, options, eval_batch, dtype):
    """Train, train, eval, train, eval: the running statistics and num_batches_tracked follow torch's."""
    options = dict(options)
    frozen = options.pop("frozen", None)
    model = cls(3, **options).to(dtype)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_()
    if frozen:
        getattr(model, frozen).requires_grad_(False)
    modes = ["train", "train", "eval", "train", "eval"]
    xs = [seeded((1,) + shape[1:] if mode == "eval" and eval_batch == "batch of 1" else shape, dtype, seed) * 3 + 2
          for seed, mode in enumerate(modes)]
    compare_modules(model, xs, modes)


# ---------------------------------------------------------------------------------------------------- convolutions
CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
CONV_TRANSPOSE = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}
X_LAYOUTS = ["contiguous", "transposed", "channels_last", "expanded batch"]


def _arranged(x: torch.Tensor, layout: str) -> torch.Tensor:
    if layout == "transposed" and x.dim() > 1:
        return x.transpose(-1, -2).contiguous().transpose(-1, -2)
    if layout == "channels_last" and x.dim() in (4, 5):
        return x.contiguous(memory_format=torch.channels_last if x.dim() == 4 else torch.channels_last_3d)
    return x


def random_convolution(rng: random.Random) -> tuple:
    """(description, fn, inputs, needs, exact) of a random convolution or transposed convolution: 1 to 3 spatial dims,
    groups, stride, dilation, padding (numbers, 'same', 'valid'), output_padding, bias or not, batch of 0 to 3 or
    none, float64 or float32, the input laid out in several ways; exact unless 'same' pads asymmetrically (the
    written-out formula). None where torch refuses the combination."""
    n = rng.choice([1, 2, 3])
    transposed, groups = rng.random() < 0.4, rng.choice([1, 1, 2, 3])
    cin, cout = groups * rng.choice([1, 2]), groups * rng.choice([1, 2])
    kernel, stride, dilation = ([rng.choice(values) for _ in range(n)] for values in ([1, 2, 3], [1, 2, 3], [1, 2]))
    batch, dtype = rng.choice([0, 1, 2, 3, None]), rng.choice([torch.float64, torch.float32])
    if transposed:
        options = dict(stride=stride, padding=[rng.choice([0, 1, 2]) for _ in range(n)], groups=groups,
                       output_padding=[rng.randrange(max(s, d)) for s, d in zip(stride, dilation)], dilation=dilation)
        op, weight_shape = CONV_TRANSPOSE[n], (cin, cout // groups, *kernel)
    else:
        padding = rng.choice([0, 1, 2, [rng.choice([0, 1, 2]) for _ in range(n)], "same", "valid"])
        stride = [1] * n if padding == "same" else stride
        options = dict(stride=stride, padding=padding, dilation=dilation, groups=groups)
        op, weight_shape = CONV[n], (cout, cin // groups, *kernel)
    x = seeded(((batch,) if batch is not None else ()) + (cin,) + tuple(rng.choice([3, 5, 6, 7]) for _ in range(n)),
               dtype, rng.randrange(1000))
    w, bias = seeded(weight_shape, dtype, rng.randrange(1000)), rng.choice(["grad", "frozen", "none"])
    try:
        op(x, w, **options)
    except RuntimeError:
        return None
    layout = rng.choice(X_LAYOUTS)
    inputs = [x[:1] if layout == "expanded batch" and batch else x, w]
    inputs += [seeded(weight_shape[1] * groups if transposed else cout, dtype, 7)] if bias != "none" else []
    needs = [rng.random() < 0.85, rng.random() < 0.85] + ([bias == "grad"] if bias != "none" else [])
    needs[0] = needs[0] or not any(needs[1:])

    def fn(t, *params):
        t = t.expand(batch, *t.shape[1:]) if layout == "expanded batch" and batch else _arranged(t, layout)
        return op(t, *params, **options)
    exact = options.get("padding") != "same" or all(d * (k - 1) % 2 == 0 for d, k in zip(dilation, kernel))
    return f"{op.__name__} x{tuple(x.shape)} w{weight_shape} {options} bias={bias} {layout} {dtype}", fn, inputs, \
        needs, exact


@pytest.mark.parametrize("seed", range(24))
def test_random_convolutions(seed):
    rng = random.Random(seed)
    cases = [case for case in (random_convolution(rng) for _ in range(16)) if case is not None]
    for description, fn, inputs, needs, exact in cases:
        consumer = rng.choice(list(CONSUMERS.values()))
        try:
            check(fn, inputs, needs, consume=consumer, how=rng.choice(["backward", "grad"]), exact=exact)
        except AssertionError as error:
            raise AssertionError(description) from error


W33 = seeded((6, 4, 3, 3), seed=11)
CONV_EDGES = {  # name: (fn, inputs, needs)
    "conv1d unbatched": (lambda x, w: F.conv1d(x, w, stride=2), [seeded((4, 9)), seeded((3, 4, 3))], None),
    "conv2d on a 3-D tensor": (lambda x, w, b: F.conv2d(x, w, b, padding=1), [seeded((4, 5, 5)), W33, seeded(6)],
                               None),
    "conv3d unbatched, even 'same'": (lambda x, w: F.conv3d(x, w, padding="same"),
                                      [seeded((2, 4, 5, 4)), seeded((3, 2, 2, 3, 2))], None),
    "conv_transpose2d unbatched": (lambda x, w: F.conv_transpose2d(x, w, stride=2, output_padding=1),
                                   [seeded((6, 4, 3)), W33], None),
    "empty batch": (lambda x, w, b: F.conv2d(x, w, b), [seeded((0, 4, 5, 5)), W33, seeded(6)], None),
    "empty batch, transposed": (lambda x, w: F.conv_transpose2d(x, w, stride=2), [seeded((0, 6, 3, 3)), W33], None),
    "no input channels": (lambda x, w, b: F.conv1d(x, w, b), [seeded((2, 0, 5)), seeded((3, 0, 3)), seeded(3)], None),
    "tied weights: conv then its transpose": (
        lambda x, w: F.conv_transpose2d(F.conv2d(x, w, padding=1), w, padding=1), [seeded((2, 4, 5, 5)), W33], None),
    "channels_last weight": (lambda x, w: F.conv2d(x, w.contiguous(memory_format=torch.channels_last)),
                             [seeded((2, 4, 5, 5)), W33], None),
    "transposed weight view": (lambda x, w: F.conv2d(x, w.transpose(0, 1)), [seeded((2, 6, 5, 5)), W33], None),
    "expanded weight and bias": (lambda x, w, b: F.conv2d(x, w[:1].expand(6, 4, 3, 3), b[:1].expand(6)),
                                 [seeded((2, 4, 5, 5)), W33, seeded(6)], None),
    "strided bias": (lambda x, w, b: F.conv2d(x, w, b[::2]), [seeded((2, 4, 5, 5)), W33, seeded(12)], None),
    "bias only requires grad": (lambda x, w, b: F.conv2d(x, w, bias=b, groups=2),
                                [seeded((2, 4, 5, 5)), seeded((6, 2, 3, 3)), seeded(6)], [False, False, True]),
    "weight only requires grad": (lambda x, w, b: F.conv_transpose2d(input=x, weight=w, bias=b, dilation=(1, 2)),
                                  [seeded((2, 6, 5, 5)), W33, seeded(4)], [False, True, False]),
    "input only requires grad": (lambda x, w, b: torch.conv3d(x, w, b, 2, 1, 1, 2),
                                 [seeded((1, 4, 5, 5, 5)), seeded((2, 2, 3, 3, 3)), seeded(2)], [True, False, False]),
    "same input twice": (lambda x, w: F.conv1d(x, w) + F.conv1d(x * 2, w, padding="same")[..., 1:-1],
                         [seeded((2, 4, 7)), seeded((3, 4, 3))], None),
}


@pytest.mark.parametrize("how", ["backward", "grad"])
@pytest.mark.parametrize("name", CONV_EDGES)
def test_convolution_edge_cases(name, how):
    fn, inputs, needs = CONV_EDGES[name]
    for consume in CONSUMERS.values():
        check(fn, inputs, needs, consume=consume, how=how, exact="'same'" not in name)


@pytest.mark.parametrize("unbatched", [False, True], ids=["batched", "unbatched"])
@pytest.mark.parametrize("padding", [0, 1, (1, 2), "same", "valid"], ids=str)
@pytest.mark.parametrize("padding_mode", ["zeros", "reflect", "replicate", "circular"])
def test_ported_conv2d_padding_modes(padding_mode, padding, unbatched):
    for kernel, dilation, stride, groups, bias in [(3, 1, 1, 1, True), (2, 1, 1, 2, False), (3, 2, 1, 2, True),
                                                   (4, 1, 2, 1, True)]:
        if padding == "same" and stride > 1:
            continue
        model = nn.Conv2d(4, 6, kernel, stride, padding, dilation, groups, bias, padding_mode).double()
        x = seeded((4, 7, 6) if unbatched else (2, 4, 7, 6))
        exact = padding_mode == "zeros" and (padding != "same" or dilation * (kernel - 1) % 2 == 0)
        compare_modules(model, [x], ["train"], ulps=0 if exact else ROUNDING)  # (F.pad's backward sums in its order)


@pytest.mark.parametrize("cls, shape", [(nn.Conv1d, (2, 4, 9)), (nn.Conv1d, (4, 9)), (nn.Conv3d, (2, 4, 5, 6, 4)),
                                        (nn.Conv3d, (4, 5, 6, 4))], ids=str)
@pytest.mark.parametrize("padding_mode", ["zeros", "reflect", "circular"])
def test_ported_conv1d_conv3d_padding_modes(cls, shape, padding_mode):
    compare_modules(cls(4, 2, 3, padding=1, padding_mode=padding_mode, bias=False).double(), [seeded(shape)], ["train"],
                    ulps=0 if padding_mode == "zeros" else ROUNDING)


TRANSPOSED_MODULES = [(nn.ConvTranspose1d, (2, 4, 5)), (nn.ConvTranspose2d, (2, 4, 5, 4)),
                      (nn.ConvTranspose3d, (2, 4, 3, 4, 3)), (nn.ConvTranspose2d, (4, 5, 4))]


@pytest.mark.parametrize("frozen", [None, "weight", "bias"])
@pytest.mark.parametrize("stride, output_padding, groups, dilation, padding",
                         [(2, 1, 1, 1, 0), (3, 2, 2, 1, 1), (2, 1, 4, 2, 2), (1, 0, 2, 3, 1)], ids=str)
@pytest.mark.parametrize("cls, shape", TRANSPOSED_MODULES, ids=str)
def test_ported_conv_transpose(cls, shape, stride, output_padding, groups, dilation, padding, frozen):
    model = cls(4, 4, 3, stride, padding, output_padding, groups, True, dilation).double()
    if frozen:
        getattr(model, frozen).requires_grad_(False)
    compare_modules(model, [seeded(shape)], ["train"])


@pytest.mark.parametrize("cls, shape", TRANSPOSED_MODULES, ids=str)
def test_ported_conv_transpose_with_output_size(cls, shape):
    """forward(x, output_size=...) picks the output_padding: every size the stride allows."""
    model = cls(4, 4, 3, stride=3, padding=1, groups=2).double()
    base = model(seeded(shape)).shape[2 - model.weight.dim():]
    for extra in range(3):
        size = [s + extra for s in base]
        compare_modules(model, [seeded(shape)], ["train"], call=lambda net, x: net(x, output_size=size))


# -------------------------------------------------------------------------------------------------- cross entropy
C = 5
CE_SHAPES = [(C,), (4, C), (1, C), (0, C), (3, C, 2), (2, C, 2, 3)]
CE_TARGETS = ["indices", "indices, some ignored", "indices, all ignored", "probabilities"]
CE_WEIGHTS = {"no weight": None, "class weights": seeded(C).abs() + 0.1,
              "zero weights": torch.tensor([0.0, 1, 0, 2, 0])}


def _ce_target(shape, kind, ignore_index, dtype):
    class_dim = 0 if len(shape) == 1 else 1
    if kind == "probabilities":
        return torch.softmax(seeded(shape, dtype, 8), class_dim)
    target_shape = shape[:class_dim] + shape[class_dim + 1:]
    target = torch.randint(0, C, target_shape, generator=torch.Generator().manual_seed(9))
    if kind == "indices, all ignored":
        return torch.full(target_shape, ignore_index)
    if kind == "indices, some ignored":
        return torch.where(torch.arange(target.numel()).reshape(target_shape) % 2 == 0, ignore_index, target)
    return target


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("label_smoothing", [0.0, 0.2])
@pytest.mark.parametrize("weight", CE_WEIGHTS)
@pytest.mark.parametrize("target_kind", CE_TARGETS)
@pytest.mark.parametrize("shape", CE_SHAPES, ids=str)
def test_cross_entropy(shape, target_kind, weight, label_smoothing, dtype):
    """Class indices, no smoothing, input dim <= 2 run torch's kernels (its bits); the rest the formula."""
    exact = target_kind != "probabilities" and not label_smoothing and len(shape) <= 2
    w = None if CE_WEIGHTS[weight] is None else CE_WEIGHTS[weight].to(dtype)
    for reduction, ignore_index in itertools.product(["none", "sum", "mean"], [-100, 2, 7]):
        if target_kind == "probabilities" and ignore_index != -100:
            continue
        target = _ce_target(shape, target_kind, ignore_index, dtype)
        fn = lambda x, t: F.cross_entropy(x, t, w, ignore_index=ignore_index, reduction=reduction,  # noqa: E731
                                          label_smoothing=label_smoothing)
        needs_target = [[True, False]] + ([[True, True], [False, True]] if target_kind == "probabilities" else [])
        for needs in needs_target:
            check(fn, [seeded(shape, dtype) * 2, target], needs, exact=exact)


CE_EDGES = {
    "uint8 targets": lambda x: F.cross_entropy(x, torch.tensor([1, 4, 0, 2, 3, 1], dtype=torch.uint8)),
    "ignore_index past the classes, present": lambda x: F.cross_entropy(
        x, torch.tensor([7, 1, 7, 3, 0, 7]), CE_WEIGHTS["class weights"], ignore_index=7, reduction="none"),
    "negative ignore_index": lambda x: F.cross_entropy(x, torch.tensor([-1, 1, -1, 3, 0, 2]), ignore_index=-1),
    "transposed input": lambda x: F.cross_entropy(x.t(), torch.tensor([1, 4, 0, 2, 3])),
    "expanded input": lambda x: F.cross_entropy(x[:1].expand(6, C), torch.tensor([1, 4, 0, 2, 3, 1])),
    "strided target": lambda x: F.cross_entropy(x, torch.arange(12)[::2] % C),
    "used twice": lambda x: F.cross_entropy(x, torch.arange(6) % C) + F.cross_entropy(
        x * 2, torch.arange(6).flip(0) % C, reduction="sum"),
    "legacy size_average=False": lambda x: F.cross_entropy(x, torch.arange(6) % C, size_average=False),
    "legacy reduce=False": lambda x: F.cross_entropy(x, torch.arange(6) % C, reduce=False),
    "all weights zero, mean (NaN)": lambda x: F.cross_entropy(x, torch.arange(6) % C, torch.zeros(C).double()),
    "nn.CrossEntropyLoss": lambda x: nn.CrossEntropyLoss(CE_WEIGHTS["class weights"], ignore_index=1,
                                                         reduction="none")(x, torch.arange(6) % C),
}


@pytest.mark.parametrize("consumer", CONSUMERS)
@pytest.mark.parametrize("name", CE_EDGES)
def test_cross_entropy_edge_cases(name, consumer):
    for how in ("backward", "grad", "create_graph"):
        check(CE_EDGES[name], [seeded((6, C))], consume=CONSUMERS[consumer], how=how, exact=how != "create_graph")


# ---------------------------------------------------------------------------------------------- pointwise losses
POINTWISE = {
    "mse": lambda x, t, r: F.mse_loss(x, t, reduction=r),
    "l1": lambda x, t, r: F.l1_loss(x, t, reduction=r),
    "smooth_l1": lambda x, t, r: F.smooth_l1_loss(x, t, reduction=r),
    "smooth_l1 beta=0": lambda x, t, r: F.smooth_l1_loss(x, t, reduction=r, beta=0.0),
    "smooth_l1 beta=2": lambda x, t, r: F.smooth_l1_loss(x, t, None, None, r, 2.0),
    "huber": lambda x, t, r: F.huber_loss(x, t, reduction=r),
    "huber delta=0.5": lambda x, t, r: F.huber_loss(x, t, r, 0.5),
    "nn.HuberLoss(delta=3)": lambda x, t, r: nn.HuberLoss(reduction=r, delta=3.0)(x, t),
    "nn.MSELoss": lambda x, t, r: nn.MSELoss(reduction=r)(x, t),
}
SHAPE_PAIRS = [((4, 5), (4, 5)), ((4, 5), (5,)), ((4, 1), (1, 5)), ((4, 5), (4, 1)), ((), ()), ((3,), ()),
               ((0, 3), (0, 3)), ((2, 3, 4), (2, 3, 4))]


def _loss_inputs(x_shape, t_shape, dtype):
    """x and t, with exact ties (d = 0) and differences on the smooth_l1 / huber switch points where shapes allow."""
    x, t = seeded(x_shape, dtype) * 2, seeded(t_shape, dtype, 2) * 2
    if x_shape == t_shape == (4, 5):
        t[0, :2] = x[0, :2]
        t[1, :3] = x[1, :3] + torch.tensor([0.5, 1.0, 2.0], dtype=dtype)
    return x, t


@pytest.mark.parametrize("x_shape, t_shape", SHAPE_PAIRS, ids=str)
@pytest.mark.parametrize("name", POINTWISE)
def test_pointwise_loss(name, x_shape, t_shape):
    """Same-shaped input and target run torch's loss kernel forward; the backward is the formula (float rounding).
    Broadcast targets, a target requiring grad, or only the target requiring grad."""
    loss = POINTWISE[name]
    for dtype, reduction, needs in itertools.product(FLOATS, ["none", "mean", "sum"],
                                                     [[True, False], [True, True], [False, True]]):
        check(lambda x, t: loss(x, t, reduction), list(_loss_inputs(x_shape, t_shape, dtype)), needs, exact=False)


LOSS_LAYOUTS = {
    "transposed input and target": lambda x, t: (x.t(), t.t()),
    "non-contiguous copies": lambda x, t: (x.t().contiguous().t(), t.t().contiguous().t()),
    "expanded target": lambda x, t: (x, t[:1].expand(4, 5)),
    "target is the input": lambda x, t: (x, x * 1),
}


@pytest.mark.parametrize("consumer", CONSUMERS)
@pytest.mark.parametrize("layout", LOSS_LAYOUTS)
@pytest.mark.parametrize("name", POINTWISE)
def test_pointwise_loss_layouts(name, layout, consumer):
    loss, arrange = POINTWISE[name], LOSS_LAYOUTS[layout]
    for reduction, how in itertools.product(["none", "mean", "sum"], ["backward", "grad"]):
        check(lambda x, t: loss(*arrange(x, t), reduction), list(_loss_inputs((4, 5), (4, 5), torch.float64)),
              consume=CONSUMERS[consumer], how=how, exact=False)


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("loss", [F.mse_loss, F.l1_loss, F.huber_loss])
def test_pointwise_loss_with_weight(loss, reduction):
    weight = seeded((4, 5), seed=3).abs()
    check(lambda x, t: loss(x, t, reduction=reduction, weight=weight),
          list(_loss_inputs((4, 5), (4, 5), torch.float64)), exact=False)


# ----------------------------------------------------------------------------------- graphs differentiated again
GRAPH_OPS = {  # float64 ops of (x, w, b)
    "batch_norm training": lambda x, w, b: F.batch_norm(x, torch.zeros(3, dtype=x.dtype), torch.ones(3, dtype=x.dtype),
                                                        w, b, True),
    "batch_norm eval": lambda x, w, b: F.batch_norm(x, torch.full((3,), 0.2, dtype=x.dtype),
                                                    torch.full((3,), 2.0, dtype=x.dtype), w, b, False),
    "layer_norm": lambda x, w, b: F.layer_norm(x, (5,), w[:1].expand(5) * 1, None) + b.sum(),
    "conv1d": lambda x, w, b: F.conv1d(x, w.reshape(3, 1, 1).expand(3, 3, 2), b),
    "conv_transpose1d": lambda x, w, b: F.conv_transpose1d(x, w.reshape(3, 1, 1).expand(3, 3, 2), b, stride=2),
    "cross_entropy": lambda x, w, b: F.cross_entropy(x * w.reshape(1, 3, 1), torch.tensor([[0, 1, 2, 0, 1]] * 4)) +
    b.sum(),
    "cross_entropy 2-D": lambda x, w, b: F.cross_entropy(x.mean(2) * w, torch.tensor([0, 1, 2, 0])) + b.sum(),
    "mse_loss": lambda x, w, b: F.mse_loss(x, w.reshape(1, 3, 1).expand(4, 3, 5)) + b.sum(),
    "huber_loss": lambda x, w, b: F.huber_loss(x, w.reshape(1, 3, 1).expand(4, 3, 5), delta=0.3) + b.sum(),
    "gelu": lambda x, w, b: F.gelu(x * w.reshape(1, 3, 1) + b.reshape(1, 3, 1)),
    "silu": lambda x, w, b: F.silu(x * w.reshape(1, 3, 1) + b.reshape(1, 3, 1)),
    "tanh and sigmoid": lambda x, w, b: torch.tanh(x * w.reshape(1, 3, 1)) * torch.sigmoid(x + b.reshape(1, 3, 1)),
}


def _square_sum(y):
    return (y * y).sum()


def _twice_retained(fn, leaves, grad):
    loss = _square_sum(fn(*leaves))
    loss.backward(retain_graph=True)
    loss.backward()
    return [t.grad for t in leaves]


def _op_used_twice(fn, leaves, grad):
    _square_sum(fn(*leaves) * 2 + fn(leaves[0] * 0.5, *leaves[1:])).backward()
    return [t.grad for t in leaves]


def _then_second_order(fn, leaves, grad, first_order_first):
    loss = _square_sum(fn(*leaves))
    if first_order_first:
        first = grad(loss, leaves, retain_graph=True)
        graphed = grad(loss, leaves, create_graph=True)
    else:
        graphed = grad(loss, leaves, create_graph=True)
        first = grad(loss, leaves, retain_graph=True)
    second = grad(sum(_square_sum(g) for g in graphed), leaves, materialize_grads=True)
    return [*first, *graphed, *second]


PATTERNS = {
    "backward twice, retain_graph": _twice_retained,
    "op used twice in one graph": _op_used_twice,
    "first order, then create_graph": lambda fn, leaves, grad: _then_second_order(fn, leaves, grad, True),
    "create_graph, then first order": lambda fn, leaves, grad: _then_second_order(fn, leaves, grad, False),
}


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("name", GRAPH_OPS)
def test_graph_differentiated_again(name, pattern):
    inputs = [seeded((4, 3, 5)), seeded(3, seed=2), seeded(3, seed=3)]
    ours = PATTERNS[pattern](GRAPH_OPS[name], [tt.tracer(t.clone(), requires_grad=True) for t in inputs], tt.grad)
    theirs = PATTERNS[pattern](GRAPH_OPS[name], [t.clone().requires_grad_() for t in inputs], torch.autograd.grad)
    assert_matches(ours, theirs, rtol=1e-10, atol=1e-12)


# ------------------------------------------------------------------------------------------------ training steps
class Net(nn.Module):
    """Every kernel path in one model: reflect-padded and grouped convolutions, batch norms (one cumulative), a
    transposed convolution, GELU / SiLU (in place) / tanh / sigmoid, a bias-free layer norm."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1, padding_mode="reflect")
        self.bn1 = nn.BatchNorm2d(8, momentum=None)
        self.c2 = nn.Conv2d(8, 8, 3, stride=2, groups=2, bias=False)
        self.bn2 = nn.BatchNorm2d(8)
        self.up = nn.ConvTranspose2d(8, 4, 3, stride=2, output_padding=1)
        self.ln = nn.LayerNorm((4,), bias=False)
        self.head = nn.Linear(4, 5)

    def forward(self, x):
        h = F.gelu(self.bn1(self.c1(x)))
        h = F.silu(self.bn2(self.c2(h)), inplace=True)
        h = torch.tanh(self.up(h))
        h = self.ln(h.mean((2, 3)))
        return self.head(torch.sigmoid(h) * h)


def _leaves(model):
    return [plain(p).detach() for p in model.parameters()]


def _training_loss(model, x, target):
    logits = model(x)
    return F.cross_entropy(logits, target) + 0.1 * F.huber_loss(logits, torch.zeros_like(logits), delta=0.5)


@pytest.mark.parametrize("optimizer, options", [("SGD", dict(lr=0.1, momentum=0.9)), ("Adam", dict(lr=0.01))])
def test_training_steps_follow_torch(optimizer, options):
    """port(model) + torchtrace.optim against the torch model + torch.optim, float64: parameters, running statistics
    and the eval-mode output after a few steps."""
    torch.manual_seed(0)
    model = Net().double()
    ours = tt.port(copy.deepcopy(model))
    steppers = [(model, getattr(torch.optim, optimizer)(model.parameters(), **options)),
                (ours, getattr(tto, optimizer)(ours.parameters(), **options))]
    generator = torch.Generator().manual_seed(1)
    for _ in range(4):
        x = torch.randn(4, 3, 8, 8, generator=generator, dtype=torch.float64)
        target = torch.randint(0, 5, (4,), generator=generator)
        for net, opt in steppers:
            opt.zero_grad()
            _training_loss(net, x, target).backward()
            opt.step()
    assert_matches(_leaves(ours) + [plain(b) for b in ours.buffers()], [p.detach() for p in model.parameters()] +
                   list(model.buffers()), rtol=1e-9, atol=1e-9)
    model.eval()
    ours.eval()
    x = seeded((2, 3, 8, 8))
    assert_matches([plain(ours(x)).detach()], [model(x).detach()], rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("dtype, memory_format", [(torch.float64, torch.contiguous_format),
                                                  (torch.float32, torch.channels_last),
                                                  (torch.bfloat16, torch.contiguous_format),
                                                  (torch.float64, torch.channels_last)], ids=str)
def test_training_step_gradients_are_torchs_bits(dtype, memory_format):
    torch.manual_seed(0)
    model = Net().to(dtype).to(memory_format=memory_format)
    ours = tt.port(copy.deepcopy(model))
    x = seeded((4, 3, 8, 8), dtype).to(memory_format=memory_format)
    target = torch.arange(4) % 5
    for net in (model, ours):
        F.cross_entropy(net(x), target).backward()
    assert_matches([p.grad for p in ours.parameters()], [p.grad for p in model.parameters()])


# ---------------------------------------------------------------------------------------------------- edge sizes
EMPTY_TRAINING = {
    "F.batch_norm, empty batch": (lambda x, w, b: F.batch_norm(x, torch.zeros(3), torch.ones(3), w, b, True),
                                  (0, 3, 5)),
    "F.batch_norm without running stats, empty batch": (lambda x, w, b: F.batch_norm(x, None, None, w, b, True),
                                                        (0, 3, 5)),
    "F.batch_norm, empty length": (lambda x, w, b: F.batch_norm(x, None, None, w, b, True), (4, 3, 0)),
    "torch.batch_norm, empty batch": (
        lambda x, w, b: torch.batch_norm(x, w, b, torch.zeros(3), torch.ones(3), True, 0.1, 1e-5, False), (0, 3, 5)),
}


@pytest.mark.parametrize("name", EMPTY_TRAINING)
def test_batch_norm_training_on_an_empty_input(name):
    """torch's kernel refuses an empty input that torch.batch_norm accepts: an empty output, an empty input gradient
    and zero weight / bias gradients, as torch's."""
    fn, shape = EMPTY_TRAINING[name]
    check(fn, [seeded(shape, torch.float32), seeded(3, torch.float32, 2), seeded(3, torch.float32, 3)])


def test_ported_batch_norm_module_training_on_an_empty_batch():
    compare_modules(nn.BatchNorm2d(3).double(), [seeded((0, 3, 4, 4))], ["train"])


EMPTY_EVAL = {
    "F.batch_norm": lambda x, w, b: F.batch_norm(x, torch.zeros(3), torch.ones(3), w, b, False),
    "torch.batch_norm": lambda x, w, b: torch.batch_norm(x, w, b, torch.zeros(3), torch.ones(3), False, 0.1, 1e-5,
                                                         False),
}


def empty_eval(name: str, shape: tuple, how: str) -> None:
    """Batch norm in eval mode on an empty batch, functional (differentiated `how`) or a ported module, against
    torch."""
    if name == "nn.BatchNorm1d":
        compare_modules(nn.BatchNorm1d(3), [seeded(shape, torch.float32)], ["eval"])
    else:
        check(EMPTY_EVAL[name], [seeded(shape, torch.float32), seeded(3, torch.float32, 2),
                                 seeded(3, torch.float32, 3)], how=how)


def in_a_child_process(call: str) -> None:
    """Run `call` (code on this module, imported as m) in a fresh interpreter: a crash of the process (a signal)
    fails the test instead of killing the test run."""
    script = f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); " \
             f"import {Path(__file__).stem} as m; {call}; print('passed')"
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0 and "passed" in result.stdout, (result.returncode, result.stderr[-3000:])


EMPTY_EVAL_CASES = [("F.batch_norm", (0, 3, 5)), ("F.batch_norm", (0, 3)), ("torch.batch_norm", (0, 3, 5)),
                    ("nn.BatchNorm1d", (0, 3))]


@pytest.mark.parametrize("name, shape", EMPTY_EVAL_CASES, ids=str)
def test_batch_norm_eval_on_an_empty_batch_first_order(name, shape):
    """torch's backward kernel divides by the batch's size (SIGFPE on an empty batch, run in a child process): the
    first order takes the written-out formulas there, an empty input gradient and zero weight / bias gradients."""
    in_a_child_process(f"m.empty_eval({name!r}, {shape!r}, 'backward')")


def test_batch_norm_eval_on_an_empty_batch_with_create_graph():
    """The written-out formula handles the empty batch the kernel dies on."""
    empty_eval("F.batch_norm", (0, 3, 5), "create_graph")


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, *HALF], ids=str)
@pytest.mark.parametrize("shape", [(1, 3), (1, 3, 1, 1)], ids=str)
def test_torch_batch_norm_one_value_per_channel(shape, dtype):
    """torch.batch_norm (unlike F.batch_norm) accepts one value per channel in training: y = b whatever x, which
    torch's gradient agrees with (finite differences in float64), and ours is torch's."""
    inputs = [seeded(shape, dtype), seeded(3, dtype, 2), seeded(3, dtype, 3)]
    if dtype == torch.float64:
        assert torch.autograd.gradcheck(_batch_norm_batch_stats, [t.clone().requires_grad_() for t in inputs])
    check(_batch_norm_batch_stats, inputs)


def _batch_norm_batch_stats(x, w, b):
    return torch.batch_norm(x, w, b, None, None, True, 0.1, 1e-5, False)
