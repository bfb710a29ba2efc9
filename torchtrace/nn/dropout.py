"""Dropout: y = x * m / (1 - p) with a random 0/1 mask m (kept with probability 1 - p); dy/dx = m / (1 - p).

The mask is torch's own: forward runs torch's dropout on a tensor of ones, which makes the very same
random draws as running it on x, and returns exactly the scale m / (1 - p). So, after the same
torch.manual_seed, torchtrace's Dropout drops the same elements as torch.nn.Dropout, bit for bit.
Feature dropout (dropout1d/2d/3d) draws one m per (sample, channel) and broadcasts it over the spatial
dims. In eval mode (training=False) or with p = 0 dropout is the identity, as torch's: no mask, no random numbers.
Alpha dropout (for SELU networks) sets dropped units to SELU's saturation value and then applies an affine
map a y + b that keeps the mean and variance: y = x a m + shift. Its forward runs torch's alpha_dropout on
zeros, which draws exactly torch's mask and returns the shift, from which the mask is read back (shift > 0
exactly where a unit is kept); so it too matches torch bit for bit under the same seed.
`inplace=True` writes the result into the input (recorded as x.relu_() is); when dropout is the identity the
input is handed back untouched (`is_identity`), as torch does, so that is no in-place change at all. The in-place
form of plain dropout (F.dropout(x, inplace=True), torch.dropout_) draws its mask as torch's does on every device,
with bernoulli_ on a new tensor: out of place, torch runs a fused kernel on CUDA that draws differently.
"""
import math
from typing import Callable

import torch
import torch.nn.functional as F

from torchtrace.autograd.function import INPLACE, Function, register
from torchtrace.nn.module import Module


class DropoutFunction(Function):
    """y = x * m / (1 - p), m ~ Bernoulli(1 - p) elementwise  ->  dy/dx = m / (1 - p)"""

    op = staticmethod(F.dropout)
    draws_random = True

    @staticmethod
    def is_identity(input, p=0.5, training=True, inplace=False, *, train=None) -> bool:
        """Eval mode or p = 0 (torch.dropout(x, p, train=...) spells training `train`)."""
        return _identity(p, training if train is None else train)

    @staticmethod
    def forward(ctx, input, p=0.5, training=True, inplace=False, *, train=None):
        training = training if train is None else train
        ctx.identity = ctx._rule.is_identity(input, p, training)
        if ctx.identity:
            return input
        scale = ctx._rule.op(torch.ones_like(input), p, training)  # torch's own draws: m / (1 - p)
        ctx.save_for_backward(scale)
        return input * scale

    @staticmethod
    def backward(ctx, g):
        if ctx.identity:
            return g
        (scale,) = ctx.saved_tensors
        return g * scale


def _identity(p: float, training: bool) -> bool:
    """Eval mode or p = 0: torch draws nothing and returns x itself (so y = x, dy/dx = 1, and no mask is made)."""
    return isinstance(p, (int, float)) and 0 <= p <= 1 and (not training or p == 0)


def _scale_drawn_in_place(ones: torch.Tensor, p: float, refusal: type) -> torch.Tensor:
    """m / (1 - p) drawn as torch's in-place dropout draws it: bernoulli_(1 - p) on a new tensor (p = 1: no draws).
    A p outside [0, 1] raises `refusal` (F.dropout: ValueError; torch.dropout_: RuntimeError), torch's message."""
    if not 0 <= p <= 1:
        raise refusal(f"dropout probability has to be between 0 and 1, but got {p}")
    if p == 1:
        return torch.zeros_like(ones)
    return torch.empty_like(ones).bernoulli_(1 - p).div_(1 - p)


class InPlaceDropout(DropoutFunction):
    """in place (F.dropout(x, inplace=True)): y = x * m / (1 - p), m ~ Bernoulli(1 - p)  ->  dy/dx = m / (1 - p)"""

    @staticmethod
    def op(ones: torch.Tensor, p: float, training: bool) -> torch.Tensor:
        return _scale_drawn_in_place(ones, p, ValueError)


class TorchInPlaceDropout(DropoutFunction):
    """torch.dropout_(x, p, train): y = x * m / (1 - p), m ~ Bernoulli(1 - p)  ->  dy/dx = m / (1 - p)"""

    @staticmethod
    def op(ones: torch.Tensor, p: float, training: bool) -> torch.Tensor:
        return _scale_drawn_in_place(ones, p, RuntimeError)


def dropout_rule(name: str, op: Callable, math_line: str, base: type = DropoutFunction) -> type:
    """The rule of a dropout variant: `base` (DropoutFunction) drawing its mask with `op`, in place as out of place."""
    body = {"__doc__": math_line, "op": staticmethod(op)}
    rule = register(op, rule=type(name, (base,), body))
    rule.inplace_rule = rule
    return rule


register(F.dropout, DropoutFunction)
DropoutFunction.inplace_rule = InPlaceDropout  # F.dropout(x, inplace=True)
dropout_rule("TorchDropout", torch.dropout,
             "torch.dropout(x, p, train): y = x * m / (1 - p), m ~ Bernoulli(1 - p)  ->  dx = g m / (1 - p)")
INPLACE[torch.dropout_] = (TorchInPlaceDropout, torch.dropout)
FEATURE = "y = x * m / (1 - p), one m ~ Bernoulli(1 - p) per (sample, channel)  ->  dy/dx = m / (1 - p)"
dropout_rule("Dropout1dFunction", F.dropout1d, FEATURE)
dropout_rule("Dropout2dFunction", F.dropout2d, FEATURE)
dropout_rule("Dropout3dFunction", F.dropout3d, FEATURE)
dropout_rule("FeatureDropout", torch.feature_dropout, f"torch.feature_dropout(x, p, train): {FEATURE}")


ALPHA = 1.7580993408473766  # SELU's -scale * alpha: the value a dropped unit takes before the affine correction


class AlphaDropoutFunction(Function):
    """y = a (x m + alpha' (1 - m)) + b, m ~ Bernoulli(1 - p)  ->  dx = g a m  (a and b keep SELU's mean and
    variance)"""

    op = staticmethod(F.alpha_dropout)
    draws_random = True

    @staticmethod
    def is_identity(input, p=0.5, training=False, inplace=False, *, train=None) -> bool:
        """Eval mode (F.alpha_dropout's default) or p = 0 (torch.alpha_dropout(x, p, train) spells it `train`)."""
        return _identity(p, training if train is None else train)

    @staticmethod
    def forward(ctx, input, p=0.5, training=False, inplace=False, *, train=None):
        training = training if train is None else train
        ctx.identity = ctx._rule.is_identity(input, p, training)
        if ctx.identity:
            return input
        shift = ctx._rule.op(torch.zeros_like(input), p, training)  # torch's draws: a' (m - 1) + a' p, a' = alpha a
        if input.numel() == 0:
            scale = torch.ones_like(input)
        elif p == 1:
            scale = torch.zeros_like(input)
        else:  # the kept units are those whose shift is a' p > 0; dropped ones have a' (p - 1) < 0
            a = 1 / math.sqrt((ALPHA * ALPHA * p + 1) * (1 - p))
            scale = (shift > 0).to(input.dtype) * a
        ctx.save_for_backward(scale)
        return input * scale + shift

    backward = staticmethod(DropoutFunction.backward)


register(F.alpha_dropout, AlphaDropoutFunction)
ALPHA_MATH = "y = a (x m + alpha' (1 - m)) + b, one m ~ Bernoulli(1 - p) per (sample, channel)  ->  dx = g a m"
dropout_rule("TorchAlphaDropout", torch.alpha_dropout,
             "torch.alpha_dropout(x, p, train): y = a (x m + alpha' (1 - m)) + b  ->  dx = g a m", AlphaDropoutFunction)
dropout_rule("FeatureAlphaDropoutFunction", F.feature_alpha_dropout, ALPHA_MATH, AlphaDropoutFunction)
dropout_rule("TorchFeatureAlphaDropout", torch.feature_alpha_dropout, ALPHA_MATH, AlphaDropoutFunction)


class Dropout(Module, torch.nn.Dropout):
    """torch.nn.Dropout: zeroes each element with probability p in train(), identity in eval()."""


class Dropout1d(Module, torch.nn.Dropout1d):
    """torch.nn.Dropout1d: zeroes whole channels of (N, C, L) or (C, L) inputs."""


class Dropout2d(Module, torch.nn.Dropout2d):
    """torch.nn.Dropout2d: zeroes whole channels of (N, C, H, W) inputs."""


class Dropout3d(Module, torch.nn.Dropout3d):
    """torch.nn.Dropout3d: zeroes whole channels of (N, C, D, H, W) inputs."""


class AlphaDropout(Module, torch.nn.AlphaDropout):
    """torch.nn.AlphaDropout: dropout that keeps SELU's self-normalising mean and variance."""


class FeatureAlphaDropout(Module, torch.nn.FeatureAlphaDropout):
    """torch.nn.FeatureAlphaDropout: alpha dropout of whole channels."""
