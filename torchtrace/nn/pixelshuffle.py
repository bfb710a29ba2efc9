"""Pixel and channel shuffles: pure permutations of the elements, so each gradient is the inverse permutation.

    pixel_shuffle(x, r):    (*, C r^2, H, W) -> (*, C, H r, W r)   ->  dx = pixel_unshuffle(g, r)
    pixel_unshuffle(x, r):  (*, C, H r, W r) -> (*, C r^2, H, W)   ->  dx = pixel_shuffle(g, r)
    channel_shuffle(x, G):  channels viewed as (G, C/G), transposed to (C/G, G)  ->  dx = channel_shuffle(g, C/G)
"""
from typing import Any

import torch

from torchtrace.nn.module import Module
from torchtrace.ops.shape import structural


def _channel_unshuffle(g: torch.Tensor, x: Any, y: Any, groups: int) -> torch.Tensor:
    return torch.channel_shuffle(g, x.shape[1] // groups if len(x.shape) > 1 else 1)


for _rule in (  # = F.pixel_shuffle, F.pixel_unshuffle (nn.PixelShuffle calls them), F.(native_)channel_shuffle
    structural("PixelShuffling", [torch.pixel_shuffle], "y = pixel_shuffle(x, r), a permutation  ->  dx = "
               "pixel_unshuffle(g, r)", lambda g, x, y, upscale_factor: torch.pixel_unshuffle(g, upscale_factor),
               uses=()),
    structural("PixelUnshuffling", [torch.pixel_unshuffle], "y = pixel_unshuffle(x, r), a permutation  ->  dx = "
               "pixel_shuffle(g, r)", lambda g, x, y, downscale_factor: torch.pixel_shuffle(g, downscale_factor),
               uses=()),
    structural("ChannelShuffling", [torch.channel_shuffle, torch.native_channel_shuffle], "y = channel_shuffle(x, G): "
               "channel (i, j) of a (G, C/G) grid moves to (j, i)  ->  dx = channel_shuffle(g, C/G)",
               _channel_unshuffle),
):
    _rule.__module__ = __name__  # filed under this module, not shape.py where the factory lives


class PixelShuffle(Module, torch.nn.PixelShuffle):
    """torch.nn.PixelShuffle, recorded by torchtrace's pixel-shuffle rule."""


class PixelUnshuffle(Module, torch.nn.PixelUnshuffle):
    """torch.nn.PixelUnshuffle, recorded by torchtrace's pixel-unshuffle rule."""


class ChannelShuffle(Module, torch.nn.ChannelShuffle):
    """torch.nn.ChannelShuffle, recorded by torchtrace's channel-shuffle rule."""
