"""PyTorch's OpInfo samples for the order-statistic, scan and nan-reduction rules (sorting.py, scans.py and the
additions to reduction.py) against torch autograd in float64; a few samples per OpInfo keep this fast."""
import functools
import itertools
import warnings

import pytest
import torch
from helpers import sample_as_function

import torchtrace as tt

OPS = """sort msort topk kthvalue median nanmedian mode cumprod cummax cummin logcumsumexp nansum nanmean var_mean
var_mean.unbiased std_mean std_mean.unbiased aminmax quantile nanquantile masked.cumprod masked.median amax amin
prod""".split()
SAMPLES_PER_OP = 6


@functools.lru_cache(maxsize=None)
def _op_db() -> dict:
    from torch.testing._internal.common_methods_invocations import op_db

    return {op.name + (f".{op.variant_test_name}" if op.variant_test_name else ""): op for op in op_db}


@pytest.mark.parametrize("name", OPS)
def test_opinfo_samples_match_torch(name: str) -> None:
    op = _op_db()[name]
    samples = list(itertools.islice(op.sample_inputs("cpu", torch.float64, requires_grad=True), SAMPLES_PER_OP))
    assert samples
    for sample in samples:
        fn, tensors = sample_as_function(sample, lambda *a, **k: sample.output_process_fn_grad(op.get_op()(*a, **k)))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert tt.check(fn, *tensors).ok, sample
