"""Python floats that change on every call and reach a rule's backward (a slope, bounds, an exponent, a
probability, a smoothing that switches on), and callables that are a new object on each access (`.T`, `.mT`,
`Function.apply`): each program applies one of these to its hidden value. The floats come from the program's own
random stream, so the compiled and the eager copy draw the same ones."""
import random
from typing import Any, Callable, List

import torch
import torch.nn.functional as F

import torchtrace as tt


class ScaleBy(tt.Function):
    """y = x * s  ->  dx = g * s (s a Python float given on each call)"""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, s: float) -> torch.Tensor:
        ctx.s = s
        return x * s

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> Any:
        return g * ctx.s, None


class CubeBy(torch.autograd.Function):
    """y = s x^3  ->  dx = 3 s x^2 g"""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, s: float) -> torch.Tensor:
        ctx.save_for_backward(x)
        ctx.s = s
        return x * x * x * s

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> Any:
        (x,) = ctx.saved_tensors
        return 3 * ctx.s * x * x * g, None


def _smoothed(h: torch.Tensor, r: random.Random) -> torch.Tensor:
    targets = torch.arange(h.shape[0]) % h.shape[1]
    return h + F.cross_entropy(h, targets, label_smoothing=r.choice([0.0, 0.1])) * 0.1


FLOAT_OPS: List[Callable[[torch.Tensor, random.Random], torch.Tensor]] = [
    lambda h, r: F.leaky_relu(h, r.uniform(0.01, 0.5)),
    lambda h, r: F.elu(h, r.uniform(0.5, 2.0)),
    lambda h, r: h.clamp(r.uniform(-1.0, -0.1), r.uniform(0.1, 1.0)),
    lambda h, r: (h.abs() + 0.5).pow(r.uniform(0.5, 3.0)),
    lambda h, r: F.dropout(h, r.uniform(0.0, 0.5), training=True),
    _smoothed,
    lambda h, r: F.hardtanh(h, r.uniform(-1.0, -0.1), r.uniform(0.1, 1.0)),
    lambda h, r: h * h.norm(p=r.choice([1.5, 2.0, 3.0]), dim=1, keepdim=True),
    lambda h, r: h @ (h.T @ h).mT * r.uniform(0.1, 1.0),
    lambda h, r: ScaleBy.apply(h, r.uniform(-2.0, 2.0)) + CubeBy.apply(h, r.uniform(0.1, 1.0)),
]
FLOAT_NAMES = ["leaky_relu slope", "elu alpha", "clamp bounds", "pow exponent", "dropout p",
               "label_smoothing 0 / 0.1", "hardtanh bounds", "p-norm", ".T / .mT", "Function.apply with a float"]
