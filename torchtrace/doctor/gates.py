"""Rules that kill or shrink the gradient they pass: the share of elements a ReLU zeroes, a tanh saturates.

A rule *kills* an element when a nonzero gradient reaches it and zero leaves (ReLU where its input was
<= 0, clamp outside [min, max]); it *saturates* one when less than SATURATED_FACTOR of it leaves (tanh,
sigmoid far from 0). Flags (documented on the docs page):
- killed:    at least KILLED_SHARE of the elements that received a gradient passed none on
             (a healthy ReLU layer passes about half);
- saturated: at least SATURATED_SHARE of them passed on less than 1% of it.
"""
from typing import Optional, Tuple

import torch

from torchtrace.autograd.plain import plain_torch

KILLED_SHARE = 0.9
SATURATED_SHARE = 0.5
SATURATED_FACTOR = 0.01

KILLING = {
    "Relu": ("ReLU passes no gradient where its input is <= 0",
             "the layer before it makes every input negative (a large negative bias, a bad initialisation or a "
             "learning rate that pushed it there): re-initialise it (kaiming), lower the learning rate, or use "
             "LeakyReLU / GELU"),
    "Hardtanh": ("hardtanh / ReLU6 pass no gradient outside their range",
                 "scale the inputs into the linear range (normalise the layer before it)"),
    "Clamp": ("clamp passes no gradient where its input is outside [min, max]",
              "widen the range, or clamp a value that does not need a gradient"),
    "ClampMin": ("clamp_min passes no gradient where its input is below the minimum", "lower the minimum"),
    "ClampMax": ("clamp_max passes no gradient where its input is above the maximum", "raise the maximum"),
    "Threshold": ("threshold passes no gradient below its threshold", "lower the threshold"),
}
SATURATING = {
    "Tanh": ("tanh' = 1 - y^2 is below 0.01 once |x| > 3",
             "keep the pre-activations near 0: normalise the layer before it, smaller initial weights "
             "(xavier), or a lower learning rate"),
    "Sigmoid": ("sigmoid' = y (1 - y) is below 0.01 once |x| > 4.6",
                "keep the pre-activations near 0 (normalisation, smaller initial weights), or use a loss on the "
                "logits (F.binary_cross_entropy_with_logits)"),
}


def unit_dim(shape: torch.Size) -> Optional[int]:
    """The dimension that indexes units: channels of an image batch (N, C, H, W), features otherwise."""
    if len(shape) < 2:
        return None
    return 1 if len(shape) == 4 else len(shape) - 1


def gate_shares(g_out: torch.Tensor, g_in: torch.Tensor) -> Tuple[float, float, float]:
    """(killed share, saturated share, share of units killed for every example) over elements that got a gradient."""
    with plain_torch():
        got = g_out != 0
        reached = int(got.sum())
        if reached == 0 or g_in.shape != g_out.shape:
            return 0.0, 0.0, 0.0
        killed = got & (g_in == 0)
        shrunk = got & ~killed & (g_in.abs() < SATURATED_FACTOR * g_out.abs())
        dim = unit_dim(g_out.shape)
        units = 0.0
        if dim is not None:
            dead_units = (killed | ~got).movedim(dim, 0).flatten(1).all(dim=1)
            units = float(dead_units.double().mean())
        return int(killed.sum()) / reached, int(shrunk.sum()) / reached, units
