"""The in-place ELU family (F.elu/selu/celu with inplace=True, F.elu_, torch.selu_, torch.celu_): as in torch, their
gradient reads the result y, where the out-of-place forms read the input x.

Both give the same first derivative; they differ in which tensor a second derivative flows through, so a hook on
the in-place result sees second-order gradients exactly when torch's does. With y <= 0 <=> x <= 0 and
y = a s (e^(i x) - 1) there (a = alpha, s = scale, i = input scale):  dy/dx = i (y + a s) if y <= 0, else s.
"""
from typing import Any, Callable, Tuple

import torch
import torch.nn.functional as F

from torchtrace.autograd.function import INPLACE, RULES, Function
from torchtrace.nn.activation import SELU_ALPHA, SELU_SCALE, _below_zero


def from_result(name: str, target: Callable, constants: Callable[..., Tuple[float, float, float]],
                **defaults: Any) -> type:
    """Rule for the in-place form of `target`; constants(**options) gives (a s, s, i) of the formula above."""
    names = list(defaults)

    def forward(ctx: Any, input: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        options = {**defaults, **dict(zip(names, args)), **kwargs}
        options.pop("inplace", None)
        y = target(input, **options)
        ctx.constants = constants(**options)
        ctx.save_for_backward(y)
        return y

    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        (y,) = ctx.saved_tensors
        negative, scale, input_scale = ctx.constants
        # flat in y at y = 0: the second derivative there is 0, as torch's elu_double_backward (mask y < 0)
        return torch.where(y <= 0, g * input_scale * (_below_zero(y, y) + negative), g * scale)

    doc = f"in place: y = {target.__name__}(x), read from y  ->  dy/dx = i (y + a s) if y <= 0, else s"
    rule = type(name, (Function,), {"__doc__": doc, "forward": staticmethod(forward),
                                    "backward": staticmethod(backward)})
    out_of_place = RULES[target]
    out_of_place.inplace_rule = rule  # F.elu(x, inplace=True) is recorded with this rule
    for twin, (owner, callable_) in list(INPLACE.items()):
        if owner is out_of_place:  # F.elu_, torch.selu_, torch.celu_
            INPLACE[twin] = (rule, callable_)
    return rule


from_result("EluInPlace", F.elu, lambda alpha: (alpha, 1.0, 1.0), alpha=1.0, inplace=False)
from_result("SeluInPlace", F.selu, lambda: (SELU_ALPHA * SELU_SCALE, SELU_SCALE, 1.0), inplace=False)
from_result("CeluInPlace", F.celu, lambda alpha: (alpha, 1.0, 1.0 / alpha), alpha=1.0, inplace=False)
