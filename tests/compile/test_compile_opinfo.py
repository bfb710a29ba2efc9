"""PyTorch's OpInfo samples of a spread of ops, compiled: the gradient of a replayed call is eager torchtrace's."""
import pytest
import torch
from torch.testing._internal.common_methods_invocations import op_db

import torchtrace as tt

NAMES = ["abs", "addcmul", "atan2", "amax", "clamp", "cumsum", "diagonal", "expand", "gather", "index_select",
         "lerp", "logsumexp", "masked_fill", "matmul", "max", "mean", "nn.functional.conv2d", "nn.functional.gelu",
         "nn.functional.layer_norm", "nn.functional.logsigmoid", "nn.functional.softplus", "norm", "pow", "prod",
         "flip", "split", "std", "roll", "where", "nn.functional.cross_entropy"]
OPS = {op.name: op for op in op_db if op.name in NAMES and not op.variant_test_name}
CASES = [(name, i) for name in NAMES if name in OPS
         for i in range(min(2, len(list(OPS[name].sample_inputs("cpu", torch.float64, requires_grad=True)))))]


def _weighted(out):
    outs = out if isinstance(out, (tuple, list)) else [out]
    return sum((o * 1.1).sum() for o in outs if isinstance(o, torch.Tensor) and o.is_floating_point()
               and o.requires_grad)


@pytest.mark.parametrize("name,index", CASES)
def test_opinfo_samples_compile_to_eager_gradients(name, index):
    op = OPS[name]
    sample = list(op.sample_inputs("cpu", torch.float64, requires_grad=True))[index]
    x = tt.as_tracer(sample.input.detach(), requires_grad=True)
    args = [tt.as_tracer(a.detach()) if isinstance(a, torch.Tensor) else a for a in sample.args]

    def f(v, *rest):
        return _weighted(op.op(v, *rest, **sample.kwargs))

    expected = tt.grad(f(x, *args), [x], allow_unused=True)[0]
    compiled = tt.compile(f, (x, *args))
    compiled(x, *args)  # the first call records the program; the next one replays it
    result = compiled(x, *args)
    assert result._tt_node.name == "CompiledCallBackward"  # grad_fn is its statement's node
    got = tt.grad(result, [x], allow_unused=True)[0]
    torch.testing.assert_close(got, expected, equal_nan=True)
