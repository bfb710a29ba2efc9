"""tt.explore(fn, *inputs): run the forward holding every result, so the player shows every node's value.

A graph built the ordinary way keeps its values up to a budget (tt.explore.keep_values), and only weak
references beyond it. Running the forward here keeps every output whatever the budget (the memory of all
intermediate results, as a forward that saves everything, while the graph lives), and notes each small op's
call (every tensor at most LIMIT elements, copied: also what the op produced, should it change in place
later) so its step gets a finite-difference check.
"""
import inspect
from typing import Any, Callable, Dict, List, Tuple

import torch

from torchtrace.autograd.state import observing
from torchtrace.inspect.explore.budget import keeping_every_value
from torchtrace.inspect.explore.local import LIMIT
from torchtrace.inspect.values import small_call
from torchtrace.tracer import tracer


def _leaf(value: Any) -> Any:
    """A tensor input becomes a leaf that requires grad (a copy for a plain tensor); a tracer is used as it is."""
    if isinstance(value, tracer) or not isinstance(value, torch.Tensor) or not value.is_floating_point():
        return value
    return tracer(value.detach(), requires_grad=True)


def _parameter_names(fn: Callable, n: int) -> List[str]:
    try:
        names = [p.name for p in inspect.signature(fn).parameters.values()
                 if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        names = []
    return [names[i] if i < len(names) else f"input {i}" for i in range(n)]


def run_holding(fn: Callable, inputs: tuple) -> Tuple[torch.Tensor, Dict[str, Any], Dict[Any, tuple]]:
    """fn(*inputs) with every recorded op's outputs kept by its node: (output, the inputs by fn's parameter names,
    node -> its small call)."""
    leaves = tuple(_leaf(v) for v in inputs)
    calls: Dict[Any, tuple] = {}

    def keep(node: Any, args: tuple, kwargs: dict, result: Any) -> None:
        outputs = result if isinstance(result, (tuple, list)) else (result,)
        call = small_call(args, kwargs, outputs, LIMIT)
        if call is not None:
            calls[node] = call

    with keeping_every_value(), observing(on_record=keep):
        output = fn(*leaves)
    if not isinstance(output, torch.Tensor):
        raise TypeError(f"tt.explore(fn, *inputs): fn must return one tensor (the output to differentiate), "
                        f"not {type(output).__name__}")
    names = {name: leaf for name, leaf in zip(_parameter_names(fn, len(leaves)), leaves)
             if isinstance(leaf, torch.Tensor)}
    return output, names, calls
