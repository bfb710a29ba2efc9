"""The doctor's underflow finding: a gradient that is 0 only because a rule computed it in a low dtype.

While tt.diagnose's backward runs, every rule that ran under torch.autocast in float16 or bfloat16 is run a second
time in float32, on the same incoming gradient and the same saved values cast up. Where float32 gives a nonzero
gradient and the low dtype gave 0, the zero is the dtype's doing: the rule is the one where the zeros start (the
rules after it receive zeros in both runs and are not named again).
"""
import copy
from typing import Any, List, Optional, Tuple

import torch

from torchtrace.autograd.node import Node, edge_gradient, gradient_for
from torchtrace.autograd.plain import plain_torch

LOW = (torch.float16, torch.bfloat16)
UNDERFLOW_SHARE = 0.5  # named when at least this share of a gradient's elements underflowed
ADVICE = ("scale the loss: torch.amp.GradScaler (or multiply the loss by 2**16 and divide the gradients by it before "
          "the step), or run in bfloat16, which has float32's range")


def _up(value: Any) -> Any:
    """A plain float32 copy of a low-precision floating tensor (tensors in tuples and lists too)."""
    if type(value) in (tuple, list):  # plain containers only: a named tuple of metadata stays as it is
        return type(value)(_up(v) for v in value)
    if isinstance(value, torch.Tensor) and value.dtype in LOW:
        return value.detach().as_subclass(torch.Tensor).float()
    return value


def in_float32(node: Node, grads: List[Any]) -> Optional[tuple]:
    """node's backward again, in float32, outside autocast (None when the rule cannot run so)."""
    ctx = copy.copy(node.ctx)
    ctx._saved, ctx._versions = tuple(_up(t) for t in node.ctx._saved), [None] * len(node.ctx._saved)
    for name, value in list(vars(ctx).items()):
        vars(ctx)[name] = _up(value)
    try:
        with plain_torch(), torch.autocast(node.autocast[0], enabled=False):
            result = node.rule.backward(ctx, *_up(list(grads)))
    except Exception:  # a rule that needs its own dtypes (a cast back, an integer path): no second opinion
        return None
    return result if isinstance(result, tuple) else (result,)


def underflowed(low: Any, reference: Any) -> Tuple[int, int]:
    """(elements nonzero in float32 and 0 in the low dtype, elements) of one gradient."""
    if not isinstance(low, torch.Tensor) or not isinstance(reference, torch.Tensor) or low.shape != reference.shape:
        return 0, 0
    with plain_torch():
        return int(((reference != 0) & (low == 0)).sum()), low.numel()


def _summed(edge: Any, grads: tuple) -> Optional[torch.Tensor]:
    """What edge_gradient hands the input, without its cast to the input's (low) dtype: the float32 value."""
    g = gradient_for(edge, grads)
    if g is None or g.shape == edge.shape:
        return g
    with plain_torch():
        return g.sum_to_size(edge.shape)


class UnderflowWatch:
    """An on_backward observer; `found` holds (node, share, dtype) for each rule whose gradient underflowed."""

    def __init__(self) -> None:
        self.found: List[Tuple[Node, float, torch.dtype]] = []

    def __call__(self, node: Node, grads: List[Any], result: tuple) -> None:
        if not node.autocast or node.autocast[1] not in LOW:
            return
        reference = in_float32(node, grads)
        if reference is None:
            return
        flushed = total = 0
        for edge in node.edges:  # what each input receives (a broadcast bias's gradient summed to its shape)
            n, size = underflowed(edge_gradient(edge, result), _summed(edge, reference))
            flushed, total = flushed + n, total + size
        if total and flushed / total >= UNDERFLOW_SHARE:
            self.found.append((node, flushed / total, node.autocast[1]))

    def findings(self, watch: Any) -> List[Any]:
        """The doctor's findings, named by `watch` (module, line, math)."""
        found = []
        for node, share, dtype in self.found:
            name = str(dtype).replace("torch.", "")
            subnormal = torch.tensor(1, dtype=torch.int16).view(dtype).item()
            message = (f"underflowed {name}: {share:.0%} of this gradient is below {subnormal:.0e} in float32 (the "
                       f"smallest {name}) and 0 in {name}; every layer before this one receives those zeros")
            found.append(watch.finding(node, "underflow", "backward", message, ADVICE, share))
        return found
