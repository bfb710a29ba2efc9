"""F.max_unpool1d/2d/3d rules and nn.MaxUnpool1d/2d/3d, against torch autograd."""
import pytest
import torch
import torch.nn.functional as F
from helpers import check_op, double_backward_matches

import torchtrace as tt
from torchtrace.nn import unpooling

torch.manual_seed(0)
X = torch.randn(2, 3, 6, 8)
Y2, I2 = F.max_pool2d(X, 2, return_indices=True)
Y7, I7 = F.max_pool2d(X[..., :7], 2, return_indices=True)  # an odd width: output_size restores it
Y2S, I2S = F.max_pool2d(X, 3, 1, 1, return_indices=True)  # overlapping windows: repeated indices
Y1, I1 = F.max_pool1d(X.flatten(2), 3, return_indices=True)
Y3, I3 = F.max_pool3d(X[None], 2, return_indices=True)


@pytest.mark.parametrize("fn, inputs", [
    (lambda y: F.max_unpool2d(y, I2, 2), (Y2,)),
    (lambda y: F.max_unpool2d(y, I7, 2, output_size=(6, 7)), (Y7.double(),)),  # odd size restored
    (lambda y: F.max_unpool2d(y, I2, (2, 2), stride=2, output_size=X.shape), (Y2,)),
    (lambda y: F.max_unpool2d(y, I2[0], 2), (Y2[0],)),  # unbatched
    (lambda y: F.max_unpool1d(y, I1, 3), (Y1,)),
    (lambda y: F.max_unpool1d(y, I1, 3, 3, output_size=[49]), (Y1,)),
    (lambda y: F.max_unpool3d(y, I3, 2), (Y3,)),
    (lambda y: F.max_unpool2d(y, I2, 2) * y.sum(), (Y2,)),  # used twice
    (lambda y: unpooling.MaxUnpool2d(2)(y, I2), (Y2,)),
    (lambda y: unpooling.MaxUnpool1d(3)(y, I1), (Y1,)),
    (lambda y: unpooling.MaxUnpool3d(2)(y, I3), (Y3,)),
])
def test_max_unpool(fn, inputs):
    check_op(fn, *inputs)


def test_repeated_indices_follow_torch():
    """Overlapping pooling windows repeat an index: torch writes one of the values there, yet its backward gathers
    g for every input (a gather, not the derivative of the write). torchtrace follows torch; finite differences,
    which see only the written value, disagree, so this case is compared with torch autograd only."""
    check_op(lambda y: F.max_unpool2d(y, I2S, 3, 1, 1), Y2S.double(), gradcheck=False)


def test_pool_unpool_round_trip():
    """max_pool then max_unpool: the gradient reaches only the maxima, through both rules."""
    check_op(lambda x: F.max_unpool2d(*F.max_pool2d(x, 2, return_indices=True), 2, output_size=x.shape), X)


def test_double_backward():
    double_backward_matches(lambda y: F.max_unpool2d(y, I2, 2) ** 3, Y2.double())


def test_modules_print_like_torch():
    assert repr(unpooling.MaxUnpool2d(2, padding=1)) == repr(torch.nn.MaxUnpool2d(2, padding=1))
    assert F.max_unpool2d(tt.tracer(Y2, requires_grad=True), I2, 2).grad_fn.name == "MaxUnpool2dBackward"
