"""F.local_response_norm rule and nn.LocalResponseNorm, against torch autograd."""
import pytest
import torch
import torch.nn.functional as F
from helpers import check_op, double_backward_matches, non_contiguous

import torchtrace as tt
from torchtrace.nn import local_response_norm as lrn

torch.manual_seed(0)
X = torch.randn(2, 5, 4, 3)


@pytest.mark.parametrize("size", [1, 2, 3, 4, 7])  # even sizes reach further back; 7 > channels
@pytest.mark.parametrize("x", [X, X.flatten(2), X[None], X.double()], ids=["4d", "3d", "5d", "float64"])
def test_local_response_norm(size, x):
    check_op(lambda x: F.local_response_norm(x, size, alpha=0.5, beta=0.75, k=1.5), x, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("fn, inputs", [
    (lambda x: F.local_response_norm(x, 2), (X,)),  # torch's defaults
    (lambda x: F.local_response_norm(x, 3, 2.0, 2.0, 0.5) * x.sum(), (non_contiguous(X),)),
    (lambda x: F.local_response_norm(x, 3), (torch.randn(0, 5, 3),)),  # empty
    (lambda x: F.local_response_norm(x, 3, 1.0, 1.0, 1.0), (torch.zeros(1, 3, 2),)),  # all-zero input
    (lambda x: lrn.LocalResponseNorm(3, 0.1, 0.5, 2.0)(x), (X,)),
])
def test_local_response_norm_forms(fn, inputs):
    check_op(fn, *inputs, rtol=1e-4, atol=1e-5)


def test_double_backward():
    double_backward_matches(lambda x: F.local_response_norm(x, 3, 0.5, 0.75, 1.5), X.double())


def test_module_prints_like_torch():
    assert repr(lrn.LocalResponseNorm(3, 0.1)) == repr(torch.nn.LocalResponseNorm(3, 0.1))
    x = tt.tracer(X, requires_grad=True)
    assert lrn.LocalResponseNorm(2)(x).grad_fn.name == "LocalResponseNormalizationBackward"
