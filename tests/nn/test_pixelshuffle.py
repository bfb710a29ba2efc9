"""pixel_shuffle, pixel_unshuffle, channel_shuffle rules and their modules, against torch autograd."""
import pytest
import torch
import torch.nn.functional as F
from helpers import check_op, double_backward_matches, non_contiguous

import torchtrace as tt
from torchtrace.nn import pixelshuffle

torch.manual_seed(0)
X = torch.randn(2, 8, 3, 4)


@pytest.mark.parametrize("fn, inputs", [
    (lambda x: F.pixel_shuffle(x, 2), (X,)),
    (lambda x: torch.pixel_shuffle(x, upscale_factor=2), (X.double(),)),
    (lambda x: F.pixel_shuffle(x, 1), (X,)),
    (lambda x: F.pixel_shuffle(x, 2), (X[0],)),  # unbatched
    (lambda x: F.pixel_shuffle(x, 2), (X[None],)),  # extra batch dims
    (lambda x: F.pixel_shuffle(x, 2) * x.sum(), (non_contiguous(X),)),
    (lambda x: F.pixel_unshuffle(x, 2), (torch.randn(2, 3, 4, 6),)),
    (lambda x: F.pixel_unshuffle(x, (3)), (torch.randn(1, 2, 6, 3).double(),)),
    (lambda x: F.pixel_unshuffle(F.pixel_shuffle(x, 2) ** 2, 2), (X,)),
    (lambda x: F.channel_shuffle(x, 4), (X,)),
    (lambda x: F.channel_shuffle(x, 2), (torch.randn(3, 6, 5),)),
    (lambda x: F.channel_shuffle(x, 8), (torch.randn(0, 8, 2, 2),)),  # empty batch
    (lambda x: pixelshuffle.PixelShuffle(2)(x), (X,)),
    (lambda x: pixelshuffle.PixelUnshuffle(2)(x), (torch.randn(2, 3, 4, 6),)),
    (lambda x: pixelshuffle.ChannelShuffle(2)(x), (X,)),
])
def test_shuffles(fn, inputs):
    check_op(fn, *inputs)


def test_native_channel_shuffle_has_the_same_gradient():
    """torch has no derivative for native_channel_shuffle; ours is channel_shuffle's (finite differences agree)."""
    assert tt.gradcheck(lambda x: F.native_channel_shuffle(x, 2), X.double())
    x = tt.tracer(X, requires_grad=True)
    g = torch.randn(2, 8, 3, 4)
    F.native_channel_shuffle(x, 2).backward(g)
    assert torch.equal(x.grad, F.channel_shuffle(g, 4))


def test_double_backward():
    double_backward_matches(lambda x: F.pixel_shuffle(x, 2) ** 3, X.double())
    double_backward_matches(lambda x: F.channel_shuffle(x, 2) ** 3, X.double())


def test_modules_print_and_record_like_torch():
    for ours, theirs in [(pixelshuffle.PixelShuffle(3), torch.nn.PixelShuffle(3)),
                         (pixelshuffle.PixelUnshuffle(2), torch.nn.PixelUnshuffle(2)),
                         (pixelshuffle.ChannelShuffle(4), torch.nn.ChannelShuffle(4))]:
        assert repr(ours) == repr(theirs) and isinstance(ours, type(theirs))
    x = tt.tracer(X, requires_grad=True)
    assert pixelshuffle.PixelShuffle(2)(x).grad_fn.name == "PixelShufflingBackward"
    assert F.pixel_unshuffle(x, 1).grad_fn.name == "PixelUnshufflingBackward"
    assert F.channel_shuffle(x, 2).grad_fn.name == "ChannelShufflingBackward"
