"""numpy's integers where torch takes a dim, a shift or a count (torch reads them through __index__): the gradient is
torch's, and finite differences agree (tt.gradcheck inside check_op)."""
import numpy as np
import pytest
import torch
from helpers import check_op

ONE = np.int64(1)
CASES = {
    "sum": lambda a: a.sum(dim=ONE),
    "sum of a list": lambda a: a.sum(dim=[np.int32(0), ONE]),
    "mean": lambda a: a.mean(ONE),
    "amax": lambda a: a.amax(ONE),
    "max": lambda a: a.max(ONE).values,
    "logsumexp": lambda a: a.logsumexp(ONE),
    "std": lambda a: a.std(ONE),
    "var": lambda a: a.var(ONE),
    "prod": lambda a: a.prod(ONE),
    "roll": lambda a: a.roll(ONE, 0),
    "roll over two dims": lambda a: a.roll((ONE, np.int64(2)), (0, 1)),
    "diff": lambda a: torch.diff(a, dim=ONE),
    "linalg.vector_norm": lambda a: torch.linalg.vector_norm(a, dim=ONE),
    "count_nonzero-free amin": lambda a: a.amin(dim=ONE, keepdim=True),
}


@pytest.mark.parametrize("name", CASES)
def test_a_numpy_integer_dim_gives_torchs_gradient(name):
    check_op(CASES[name], torch.randn(3, 3, dtype=torch.float64))
