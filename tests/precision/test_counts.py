"""Underflow, overflow and subnormal shares against a float32 run equal a direct count on the tensors; loss
scaling brings an underflowed layer's gradients back."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from precision_models import GPT, TinyHead, gpt_loss

import torchtrace as tt
from torchtrace.precision.counts import count, relative_error

# magnitudes across float16's range: flushed (< 3e-8), subnormal (< 6.1e-5), normal, overflowing (> 65504)
VALUES = [1e-9, -2e-8, 1e-7, -5e-6, 3e-5, 1e-3, -0.5, 2.0, 6e4, -7e4, 1e5, 0.0]


def _identity_prelu(x):
    """prelu with slope 1 is x itself; prelu is on autocast's lower-precision list, so under autocast x is cast to
    the low dtype (element by element: no inf * 0 of a product with an identity matrix)."""
    return F.prelu(x, torch.ones(1))


def test_count_matches_numpy_float16_element_by_element():
    reference = torch.tensor(VALUES, dtype=torch.float32)
    low = reference.to(torch.float16)
    with np.errstate(over="ignore"):  # 7e4 and 1e5 overflow float16 on purpose
        as_numpy = np.array(VALUES, dtype=np.float32).astype(np.float16)
    underflow = sum(1 for v, h in zip(VALUES, as_numpy) if v != 0 and h == 0)
    overflow = sum(1 for h in as_numpy if np.isinf(h))
    subnormal = sum(1 for h in as_numpy if h != 0 and abs(h) < np.finfo(np.float16).tiny)
    counts = count(low, reference)
    assert (counts.elements, counts.underflow, counts.overflow, counts.subnormal) == (12, 2, 2, 3)
    assert (counts.underflow, counts.overflow, counts.subnormal) == (underflow, overflow, subnormal)


@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16), ids=str)
def test_report_shares_forward_and_backward_equal_a_direct_count(dtype):
    x = tt.tracer(torch.tensor([VALUES[:-1]]), requires_grad=True)  # one row, 11 values
    weights = torch.tensor(VALUES[:-1]).flip(0)  # the gradient of (y * w).sum() with respect to y is w

    def fn(x):
        return (_identity_prelu(x) * weights).sum()

    r = tt.precision(fn, x, dtype=dtype)
    prelu = next(row for row in r.rows if row.phase == "forward" and row.rule == "Prelu")
    low_x, low_w = torch.tensor([VALUES[:-1]]).to(dtype), weights.to(dtype)
    assert prelu.dtype == dtype
    assert prelu.counts.underflow == int(((torch.tensor([VALUES[:-1]]) != 0) & (low_x == 0)).sum())
    assert prelu.counts.overflow == int(torch.isinf(low_x).sum())
    assert prelu.counts.subnormal == int(((low_x != 0) & (low_x.abs() < torch.finfo(dtype).tiny)).sum())
    # backward: prelu sends w back to x, computed in the low dtype (the float32 gradient w cast down)
    sent = next(row for row in r.rows if row.phase == "backward" and row.rule == "Prelu")
    finite = torch.isfinite(low_w)
    assert sent.counts.underflow == int(((weights != 0) & (low_w == 0)).sum())
    assert sent.counts.overflow == int((~finite).sum())
    assert sent.underflow == sent.counts.underflow / 11 and sent.overflow == sent.counts.overflow / 11
    if dtype == torch.float16:
        assert (prelu.counts.underflow, prelu.counts.overflow, prelu.counts.subnormal) == (2, 2, 3)
    else:  # bfloat16 has float32's exponent: nothing here leaves its range
        assert (prelu.counts.underflow, prelu.counts.overflow, prelu.counts.subnormal) == (0, 0, 0)


def test_relative_error_is_measured_where_both_are_finite():
    reference = torch.tensor([1.0, 2.0, float("-inf")])
    assert relative_error(torch.tensor([1.0, 2.5, float("-inf")]), reference) == pytest.approx(0.5 / 2.5)
    assert relative_error(torch.tensor([2.0, 5.0, float("-inf")]), reference, scale=2.0) == pytest.approx(0.5 / 2.5)
    assert relative_error(torch.tensor([1.0, float("inf"), float("-inf")]), reference) == float("inf")


def test_the_gpt_rows_relative_error_is_the_direct_one():
    torch.manual_seed(1)
    gpt = tt.port(GPT())
    idx = torch.randint(0, 11, (2, 9))
    r = tt.precision(lambda i: gpt_loss(gpt, i), idx, dtype=torch.bfloat16)
    for row in r.rows:
        if row.value is None or not torch.isfinite(row.reference).all():
            continue
        a, b = row.value.double(), row.reference.double()
        direct = float((a - b).abs().max()) / max(float(a.abs().max()), float(b.abs().max()), 1e-12)
        assert row.rel_error >= direct - 1e-12  # a rule sending several gradients reports the largest error
    assert 0 < max(row.rel_error for row in r.rows) < 0.1


def test_the_predicted_layer_underflows_at_scale_one_and_not_at_two_to_the_sixteen():
    torch.manual_seed(0)
    model = tt.port(TinyHead())
    x = torch.randn(16, 8)
    unscaled = tt.precision(model, x, dtype=torch.float16)
    first = unscaled.first_underflow
    assert (first.rule, first.module) == ("LinearFunction", "head")
    # all 16 x 8 elements of the gradient it sends to its input (~1e-9) are flushed; its weight and bias gradients
    # (1e-4 times the activations, and 1e-4) are not
    assert first.counts.underflow == 16 * 8 and first.counts.elements == 16 * 8 + 8 + 1
    scaled = tt.precision(model, x, dtype=torch.float16, scale=2.0 ** 16)
    assert scaled.first_underflow is None and scaled.gradient_underflow == 0
    assert unscaled.gradient_underflow > 0.9
    head = next(r for r in scaled.rows if r.phase == "backward" and r.module == "head")
    assert head.rel_error < 1e-2  # scaled back, the float16 gradient is float32's to float16's resolution


def test_the_model_state_is_left_as_it_was():
    """Both runs move a train-mode BatchNorm's running statistics (as a forward in torch does); tt.precision puts them
    back, as it puts back .grad."""
    from precision_models import CNN, cnn_loss

    torch.manual_seed(0)
    model = tt.port(CNN())
    x, y = torch.randn(4, 1, 8, 8), torch.tensor([0, 1, 2, 3])
    before = {name: b.detach().as_subclass(torch.Tensor).clone() for name, b in model.named_buffers()}
    report = tt.precision(lambda a, b: cnn_loss(model, a, b), x, y, dtype=torch.bfloat16)
    assert any(r.rule == "BatchNormFunction" for r in report.rows)
    for name, b in model.named_buffers():
        assert torch.equal(b.detach().as_subclass(torch.Tensor), before[name]), name
    assert all(p.grad is None for p in model.parameters())
    cnn_loss(model, x, y)  # the forward itself still moves them, as torch's does
    assert int(model.bn1.num_batches_tracked) == 1


def test_a_float32_rules_gradient_sent_on_in_float16_is_counted_in_float16s_range():
    """mse_loss runs in float32 under autocast; its gradient 2 * 4 / 16 * 1e-6 reaches the float16 matmul as float16,
    where it is subnormal: torch's own gradient of that output is float16 and subnormal, and the row counts all 16."""
    x, w, t = torch.ones(4, 4), torch.ones(4, 4), torch.zeros(4, 4)
    with torch.autocast("cpu", dtype=torch.float16):
        h = (x @ w).requires_grad_()
        loss = F.mse_loss(h, t) * 1e-6
    loss.backward()
    assert h.grad.dtype == torch.float16 and bool((h.grad.abs() < torch.finfo(torch.float16).tiny).all())
    report = tt.precision(lambda x, w, t: F.mse_loss(x @ w, t) * 1e-6, tt.tracer(x), tt.tracer(w, requires_grad=True),
                          tt.tracer(t), dtype=torch.float16)
    row = next(r for r in report.rows if r.phase == "backward" and r.rule == "MseLoss")
    assert row.value.dtype == torch.float16 and row.counts.subnormal == row.counts.elements == 16
    assert count(h.grad.float(), h.grad.float(), dtype=torch.float16).subnormal == 16  # either way round
    assert count(h.grad, h.grad.float(), dtype=torch.float32).subnormal == 16
