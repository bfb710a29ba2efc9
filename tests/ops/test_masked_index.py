"""torch._unsafe_masked_index / _unsafe_masked_index_put_accumulate (torchtrace/ops/masked_index.py)."""
import torch
from helpers import check_op, double_backward_matches

_gen = torch.Generator().manual_seed(0)
X = torch.randn(4, 5, generator=_gen, dtype=torch.float64)
ROWS = torch.tensor([[0], [3], [5], [-1], [2]])  # 5 and -1: out of range / negative, masked off or wrapping
COLS = torch.tensor([[1, 1, 4, 7, 0, -2]])  # 1 repeated: gradients accumulate
MASK = (torch.arange(30).reshape(5, 6) % 4 != 0) & (ROWS < 4) & (COLS < 5)
VALUES = torch.randn(5, 6, generator=_gen, dtype=torch.float64)


def test_masked_index():
    check_op(lambda x: torch._unsafe_masked_index(x, MASK, [ROWS, COLS], -2.5).sin() * VALUES, X)
    double_backward_matches(lambda x: torch._unsafe_masked_index(x, MASK, [ROWS, COLS], 0.0) ** 3, X)


def test_masked_index_put_accumulate():
    check_op(lambda x, v: torch._unsafe_masked_index_put_accumulate(x, MASK, [ROWS, COLS], v).sin(), X, VALUES)
    double_backward_matches(lambda x, v: torch._unsafe_masked_index_put_accumulate(x, MASK, [ROWS, COLS], v * v),
                            X, VALUES)
