"""Checks of the numeric arguments the tools share: a count given as a float or a string would fail deep inside
(slicing, torch.zeros), a zero or negative one would return nothing or divide by zero. Each error names the tool and
the argument; a value of the wrong kind is a TypeError, one out of range a ValueError (as Python's own range())."""
import math
import numbers
from typing import Any, List

import torch


def integer(tool: str, name: str, value: Any) -> int:
    """`value` as an int (a seed), else a TypeError that names the argument (True is not 1 here)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{tool}: {name} must be an integer, not {value!r}")
    return int(value)


def count(tool: str, name: str, value: Any, least: int = 1) -> int:
    """`value` as an int of at least `least`, else a TypeError or ValueError that names the argument."""
    value = integer(tool, name, value)
    if value < least:
        raise ValueError(f"{tool}: {name} must be at least {least}, not {value}")
    return int(value)


def positive(tool: str, name: str, value: Any) -> float:
    """`value` as a finite float above 0, else a ValueError that names the argument."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (math.isfinite(value) and value > 0):
        raise ValueError(f"{tool}: {name} must be a finite number above 0, not {value!r}")
    return float(value)


def input_tuples(tool: str, value: Any, single_tensor_entries: bool) -> List[Any]:
    """check_inputs: a list (or tuple) with the arguments of each further call, else a TypeError (a tensor here would be
    iterated row by row as if each row were a call's arguments). `single_tensor_entries`: an entry may be a lone tensor
    (one argument), as the tool's example inputs may be."""
    if value is None:
        return []
    example = "check_inputs=[(x2,), (x3,)]"
    if isinstance(value, torch.Tensor) or not isinstance(value, (list, tuple)):
        raise TypeError(f"{tool}: check_inputs is a list of argument tuples, one per further call ({example}), "
                        f"not a {type(value).__name__}")
    for i, entry in enumerate(value):
        if not isinstance(entry, (list, tuple)) and not (single_tensor_entries and isinstance(entry, torch.Tensor)):
            raise TypeError(f"{tool}: check_inputs[{i}] is a {type(entry).__name__}; each entry is the tuple of one "
                            f"call's arguments ({example})")
    return list(value)
