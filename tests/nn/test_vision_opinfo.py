"""PyTorch's OpInfo samples for the vision ops (interpolate, grid_sample, shuffles, unfold, unpooling, fractional
pooling, embedding_bag, local_response_norm, pad, sdpa): outputs and gradients on tracers equal torch autograd's."""
import itertools
from typing import Any, Callable

import pytest
import torch

import torchtrace as tt

pytestmark = pytest.mark.filterwarnings("ignore")
common = pytest.importorskip("torch.testing._internal.common_methods_invocations")

NAMES = [f"nn.functional.interpolate.{mode}" for mode in
         ("nearest", "nearest-exact", "linear", "bilinear", "bicubic", "trilinear", "area")] + [
    "nn.functional.upsample_bilinear", "nn.functional.upsample_nearest", "nn.functional.pixel_shuffle",
    "nn.functional.pixel_unshuffle", "nn.functional.channel_shuffle", "nn.functional.unfold",
    "nn.functional.local_response_norm", "nn.functional.max_unpool1d", "nn.functional.max_unpool2d",
    "nn.functional.max_unpool3d", "nn.functional.fractional_max_pool2d", "nn.functional.fractional_max_pool3d",
    "nn.functional.embedding_bag", "nn.functional.grid_sample", "nn.functional.scaled_dot_product_attention",
    "nn.functional.pad.constant", "nn.functional.pad.reflect", "nn.functional.pad.replicate",
    "nn.functional.pad.replicate_negative", "nn.functional.pad.circular",
]
SAMPLES_PER_OP = 12  # enough to meet every argument form the OpInfo lists first; keeps the file fast
OPS = {op.name + (f".{op.variant_test_name}" if op.variant_test_name else ""): op for op in common.op_db}


def _map(x: Any, f: Callable) -> Any:
    if isinstance(x, torch.Tensor):
        return f(x)
    if isinstance(x, (list, tuple)):
        return type(x)(_map(e, f) for e in x)
    if isinstance(x, dict):
        return {k: _map(v, f) for k, v in x.items()}
    return x


def _tensors(x: Any) -> list:
    found = []
    _map(x, lambda t: found.append(t) or t)
    return found


@pytest.mark.parametrize("name", NAMES)
def test_opinfo_samples_match_torch(name):
    op = OPS[name]
    checked = 0
    for sample in itertools.islice(op.sample_inputs("cpu", torch.float64, requires_grad=True), SAMPLES_PER_OP):
        if sample.kwargs.get("dropout_p", 0) > 0:
            continue  # sdpa's dropout mask is drawn differently (see test_attention)
        args, kwargs = (sample.input, *sample.args), sample.kwargs
        torch.manual_seed(0)  # fractional max pool draws its windows
        expected = op.op(*args, **kwargs)
        outs = [o for o in _tensors(expected) if o.requires_grad]
        wanted = [t for t in _tensors((args, kwargs)) if t.requires_grad]
        grads = [torch.randn_like(o) for o in outs]
        expected_grads = torch.autograd.grad(outs, wanted, grads, allow_unused=True)
        leaves = {}

        def as_tracer(t: torch.Tensor) -> torch.Tensor:
            if not t.is_floating_point():
                return t
            leaves[id(t)] = tt.tracer(t.detach(), requires_grad=t.requires_grad)
            return leaves[id(t)]

        ours_args, ours_kwargs = _map(args, as_tracer), _map(kwargs, as_tracer)
        torch.manual_seed(0)
        result = [o for o in _tensors(op.op(*ours_args, **ours_kwargs)) if o.requires_grad]
        got = tt.grad(result, [leaves[id(t)] for t in wanted], grads, allow_unused=True)
        for a, b in zip(result, outs):
            torch.testing.assert_close(a.as_subclass(torch.Tensor), b.detach(), equal_nan=True)
        for a, b in zip(got, expected_grads):
            if a is None or b is None:
                assert (a is None or not a.any()) and (b is None or not b.any())
            else:
                torch.testing.assert_close(a.as_subclass(torch.Tensor), b, equal_nan=True)
        checked += 1
    assert checked
