"""F.gumbel_softmax (torchtrace/nn/gumbel_softmax.py): torch's samples and torch's gradients under the same seed."""
import pytest
import torch
import torch.nn.functional as F

import torchtrace as tt

LOGITS = torch.randn(4, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
WEIGHTS = torch.randn(4, 5, generator=torch.Generator().manual_seed(1), dtype=torch.float64)


def _run(leaf, create_graph, **kwargs):
    torch.manual_seed(3)
    y = F.gumbel_softmax(leaf, **kwargs)
    grad = (tt.grad if isinstance(leaf, tt.tracer) else torch.autograd.grad)(
        (y * WEIGHTS).sum(), [leaf], create_graph=create_graph)[0]
    return y, grad


@pytest.mark.parametrize("kwargs", [{}, {"tau": 0.3}, {"hard": True}, {"tau": 2.0, "hard": True, "dim": 0}])
def test_same_sample_and_gradients_as_torch(kwargs):
    ours = _run(tt.tracer(LOGITS.clone(), requires_grad=True), True, **kwargs)
    theirs = _run(LOGITS.clone().requires_grad_(), True, **kwargs)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a.as_subclass(torch.Tensor).detach(), b.detach(), rtol=1e-12, atol=1e-12)


def test_second_derivative_as_torch():
    x = tt.tracer(LOGITS.clone(), requires_grad=True)
    (second,) = tt.grad((_run(x, True, tau=0.5)[1] ** 2).sum(), [x])
    t = LOGITS.clone().requires_grad_()
    (expected,) = torch.autograd.grad((_run(t, True, tau=0.5)[1] ** 2).sum(), [t])
    torch.testing.assert_close(second, expected)
