"""PyTorch's OpInfo samples for the order-statistic, scan and nan-reduction rules (sorting.py, scans.py and the
additions to reduction.py) against torch autograd in float64; a few samples per OpInfo keep this fast."""
import functools
import itertools
import warnings
from typing import Any

import pytest
import torch

import torchtrace as tt
from torchtrace.check import flatten

OPS = """sort msort topk kthvalue median nanmedian mode cumprod cummax cummin logcumsumexp nansum nanmean var_mean
var_mean.unbiased std_mean std_mean.unbiased aminmax quantile nanquantile masked.cumprod masked.median amax amin
prod""".split()
SAMPLES_PER_OP = 6


@functools.lru_cache(maxsize=None)
def _op_db() -> dict:
    from torch.testing._internal.common_methods_invocations import op_db

    return {op.name + (f".{op.variant_test_name}" if op.variant_test_name else ""): op for op in op_db}


def _as_function(op: Any, sample: Any) -> tuple:
    """(fn of the differentiable tensors, those tensors): the sample's other arguments are held fixed."""
    leaves, rebuild = flatten([sample.input, list(sample.args), dict(sample.kwargs)])
    positions = [k for k, x in enumerate(leaves) if isinstance(x, torch.Tensor) and x.requires_grad]
    fixed = [x.detach() if isinstance(x, torch.Tensor) else x for x in leaves]

    def fn(*tensors: torch.Tensor) -> Any:
        values = list(fixed)
        for k, t in zip(positions, tensors):
            values[k] = t
        input, args, kwargs = rebuild(values)
        return sample.output_process_fn_grad(op.get_op()(input, *args, **kwargs))

    return fn, [fixed[k] for k in positions]


@pytest.mark.parametrize("name", OPS)
def test_opinfo_samples_match_torch(name: str) -> None:
    op = _op_db()[name]
    samples = list(itertools.islice(op.sample_inputs("cpu", torch.float64, requires_grad=True), SAMPLES_PER_OP))
    assert samples
    for sample in samples:
        fn, tensors = _as_function(op, sample)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert tt.check(fn, *tensors).ok, sample
