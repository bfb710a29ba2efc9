"""One recorded op as a tangent rule sees it: the primal arguments, their tangents, the result, the rule's ctx.

A tangent rule is `rule(call) -> tangent of the result` (a tuple, one per output, for an op with several). It
runs under plain_torch(): tracers behave as plain tensors and nothing is recorded. A missing tangent is None
(a symbolic zero): an input that does not depend on the primals costs nothing.
"""
from typing import Any, List, Optional

import torch

from torchtrace.autograd.node import Context


class NoTangent(Exception):
    """Raised by a tangent rule for a case it does not cover: the op falls back to its own backward, transposed."""


class Call:
    """What the op was called with (args as its rule's forward takes them), the tangents of those args (`dots`,
    None for no tangent; a list for a list argument), and what it returned (`out`)."""

    __slots__ = ("node", "args", "kwargs", "out", "dots", "kwdots")

    def __init__(self, node: Any, args: tuple, kwargs: dict, out: Any, dots: List[Any], kwdots: dict):
        self.node, self.args, self.kwargs, self.out, self.dots, self.kwdots = node, args, kwargs, out, dots, kwdots

    @property
    def ctx(self) -> Any:
        return self.node.ctx

    @property
    def rule(self) -> type:
        return self.node.rule

    def dot(self, i: int) -> Optional[torch.Tensor]:
        """The tangent of argument i (None: zero)."""
        return self.dots[i] if i < len(self.dots) else None

    def arg(self, i: int, name: str, default: Any = None) -> Any:
        """Argument i, passed by position or as keyword `name`."""
        if i < len(self.args):
            return self.args[i]
        return self.kwargs.get(name, default)

    def only(self, *positions: int) -> None:
        """Refuse (fall back) when an argument outside `positions` carries a tangent."""
        if self.kwdots or any(d is not None and i not in positions for i, d in enumerate(self.dots)):
            raise NoTangent

    def run(self, *args: Any, **kwargs: Any) -> Any:
        """The op itself (its rule's forward, with a fresh ctx) on other arguments: a linear op's tangent."""
        return self.rule.forward(Context(self.rule), *args, **kwargs)


def zeros_for(value: Any) -> Any:
    """The zero tangent of a floating tensor argument."""
    return torch.zeros_like(value)
