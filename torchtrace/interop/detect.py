"""Is a tracer among some call arguments? (shared by every bridge)"""
from typing import Any, Iterator

import torch

from torchtrace.tracer import tracer as TRACER


def has_tracer(values: Any) -> bool:
    """A tracer among `values` or inside their lists, tuples and dicts (a few levels deep)."""
    return any(isinstance(v, TRACER) for v in tensors_in(values))


def tensors_in(values: Any, depth: int = 0) -> Iterator[torch.Tensor]:
    """The tensors among `values` and inside their lists, tuples and dicts (a few levels deep)."""
    for v in values:
        if isinstance(v, torch.Tensor):
            yield v
        elif depth < 3 and isinstance(v, (list, tuple)):
            yield from tensors_in(v, depth + 1)
        elif depth < 3 and isinstance(v, dict):
            yield from tensors_in(v.values(), depth + 1)
