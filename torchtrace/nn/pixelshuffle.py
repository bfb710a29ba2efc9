"""Pixel and channel shuffles: pure permutations of the elements, so each gradient is the inverse permutation.

    pixel_shuffle(x, r):    (*, C r^2, H, W) -> (*, C, H r, W r)   ->  dx = pixel_unshuffle(g, r)
    pixel_unshuffle(x, r):  (*, C, H r, W r) -> (*, C r^2, H, W)   ->  dx = pixel_shuffle(g, r)
    channel_shuffle(x, G):  channels viewed as (G, C/G), transposed to (C/G, G)  ->  dx = channel_shuffle(g, C/G)
"""
import torch

from torchtrace.autograd.function import Function, register
from torchtrace.nn.module import Module


@register(torch.pixel_shuffle)  # = F.pixel_shuffle; nn.PixelShuffle calls it
class PixelShuffling(Function):
    """y = pixel_shuffle(x, r), a permutation  ->  dx = pixel_unshuffle(g, r)"""

    @staticmethod
    def forward(ctx, input, upscale_factor):
        ctx.factor = upscale_factor
        return torch.pixel_shuffle(input, upscale_factor)

    @staticmethod
    def backward(ctx, g):
        return torch.pixel_unshuffle(g, ctx.factor), None


@register(torch.pixel_unshuffle)  # = F.pixel_unshuffle
class PixelUnshuffling(Function):
    """y = pixel_unshuffle(x, r), a permutation  ->  dx = pixel_shuffle(g, r)"""

    @staticmethod
    def forward(ctx, input, downscale_factor):
        ctx.factor = downscale_factor
        return torch.pixel_unshuffle(input, downscale_factor)

    @staticmethod
    def backward(ctx, g):
        return torch.pixel_shuffle(g, ctx.factor), None


@register(torch.channel_shuffle, torch.native_channel_shuffle)  # = F.channel_shuffle, F.native_channel_shuffle
class ChannelShuffling(Function):
    """y = channel_shuffle(x, G): channel (i, j) of a (G, C/G) grid moves to (j, i)  ->  dx = channel_shuffle(g, C/G)"""

    @staticmethod
    def forward(ctx, input, groups):
        ctx.inverse = input.shape[1] // groups if input.dim() > 1 else 1
        return torch.channel_shuffle(input, groups)

    @staticmethod
    def backward(ctx, g):
        return torch.channel_shuffle(g, ctx.inverse), None


class PixelShuffle(Module, torch.nn.PixelShuffle):
    """torch.nn.PixelShuffle, recorded by torchtrace's pixel-shuffle rule."""


class PixelUnshuffle(Module, torch.nn.PixelUnshuffle):
    """torch.nn.PixelUnshuffle, recorded by torchtrace's pixel-unshuffle rule."""


class ChannelShuffle(Module, torch.nn.ChannelShuffle):
    """torch.nn.ChannelShuffle, recorded by torchtrace's channel-shuffle rule."""
