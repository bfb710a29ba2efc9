"""F.unfold / F.fold rules (each the other's adjoint) and nn.Unfold / nn.Fold, against torch autograd."""
import pytest
import torch
import torch.nn.functional as F
from helpers import check_op, double_backward_matches, non_contiguous

import torchtrace as tt
from torchtrace.nn import fold

torch.manual_seed(0)
X = torch.randn(2, 3, 5, 6)


@pytest.mark.parametrize("fn, inputs", [
    (lambda x: F.unfold(x, 2), (X,)),
    (lambda x: F.unfold(x, (2, 3), dilation=(2, 1), padding=1, stride=(1, 2)), (X,)),
    (lambda x: F.unfold(x, 3, stride=2), (X.double(),)),  # windows skip the last row/column
    (lambda x: F.unfold(x, kernel_size=3, padding=2, dilation=2), (X[0],)),  # unbatched
    (lambda x: F.unfold(x, 2) * x.sum(), (non_contiguous(X),)),
    (lambda x: F.unfold(x, 2), (torch.randn(0, 3, 4, 4),)),  # empty batch
    (lambda x: F.fold(x, (4, 5), 2), (torch.randn(2, 12, 12),)),
    (lambda x: F.fold(x, (5, 6), (2, 3), stride=(1, 2), padding=1), (torch.randn(2, 12, 18).double(),)),
    (lambda x: F.fold(x, 6, 2, dilation=2, stride=2), (torch.randn(8, 4),)),  # unbatched
    (lambda x: F.fold(F.unfold(x, 3, padding=1), (5, 6), 3, padding=1), (X,)),  # overlaps add up
    (lambda x: fold.Unfold(2, stride=2)(x), (X,)),
    (lambda x: fold.Fold((4, 5), 2)(x), (torch.randn(2, 12, 12),)),
])
def test_unfold_fold(fn, inputs):
    check_op(fn, *inputs)


def test_double_backward():
    double_backward_matches(lambda x: F.unfold(x, 2, padding=1) ** 3, X.double())
    double_backward_matches(lambda x: F.fold(x, (4, 5), 2) ** 3, torch.randn(2, 12, 12).double())


def test_modules_print_and_record_like_torch():
    assert repr(fold.Unfold(3, padding=1)) == repr(torch.nn.Unfold(3, padding=1))
    assert repr(fold.Fold((4, 4), 2)) == repr(torch.nn.Fold((4, 4), 2))
    x = tt.tracer(X, requires_grad=True)
    assert fold.Unfold(2)(x).grad_fn.name == "Im2ColBackward"
    assert F.fold(F.unfold(x, 2), (5, 6), 2).grad_fn.name == "Col2ImBackward"
