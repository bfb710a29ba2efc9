"""Is a tracer among some call arguments? (shared by every bridge)"""
from typing import Any

from torchtrace.tracer import tracer as TRACER


def has_tracer(values: Any, depth: int = 0) -> bool:
    """A tracer among `values` or inside their lists, tuples and dicts (a few levels deep)."""
    for v in values:
        if isinstance(v, TRACER):
            return True
        if depth < 3 and isinstance(v, (list, tuple)) and has_tracer(v, depth + 1):
            return True
        if depth < 3 and isinstance(v, dict) and has_tracer(v.values(), depth + 1):
            return True
    return False
