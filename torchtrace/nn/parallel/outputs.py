"""What DistributedDataParallel does with a forward's outputs, as torch's DDP does.

`find_tensors` lists the tensors inside an output (tensors, lists, tuples, dicts, dataclasses), from which the
reducer finds the parameters a forward did not use. With find_unused_parameters=True the outputs also pass through
a sink: one node that every path from the loss into the model crosses, so its backward runs before any gradient of
the model and knows which outputs the loss used (an `OutputReached` node in front of each output marks it).
Parameters only the unused outputs reach then count as unused, and those outputs' part of the graph gets no
gradient, so their parameters keep `.grad` as it was (torch's DDPSink lets them receive an undefined gradient for
that).
Like torch's, the sink goes through lists, tuples, named tuples and dicts; a dataclass output is searched for
tensors but not rebuilt.
"""
import dataclasses
from typing import Any, List, Tuple

import torch

from torchtrace.autograd.function import Function
from torchtrace.nested import flatten
from torchtrace.nn.parallel.reducer import Reducer, reachable_leaves


def find_tensors(value: Any) -> List[torch.Tensor]:
    """The tensors inside a forward's output (a tensor, or nested lists / tuples / dicts / dataclasses of them)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = [getattr(value, field.name) for field in dataclasses.fields(value)]
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in find_tensors(item)]
    return []


class _Iteration:
    """One synchronised forward's outputs, as the sink sees them: their graph roots and which ones the loss used."""

    def __init__(self, reducer: Reducer, outputs: List[torch.Tensor]):
        self.reducer = reducer
        self.roots = [t.grad_fn for t in outputs]
        self.reached = [False] * len(outputs)


class DDPSink(Function):
    """Identity on the outputs: its backward tells the reducer which parameters this backward reaches (from the
    outputs the loss used), and sends no gradient into the outputs it did not use."""

    @staticmethod
    def forward(ctx: Any, iteration: _Iteration, *outputs: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        ctx.iteration = iteration
        return tuple(t.clone() for t in outputs)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> Tuple[Any, ...]:
        iteration = ctx.iteration
        used = [root for root, reached in zip(iteration.roots, iteration.reached) if reached]
        iteration.reducer.backward_begins(reachable_leaves(used))
        return (None, *[g if reached else None for g, reached in zip(grads, iteration.reached)])


class OutputReached(Function):
    """Identity on one output: its backward runs only if the loss used that output, and marks it."""

    @staticmethod
    def forward(ctx: Any, iteration: _Iteration, k: int, output: torch.Tensor) -> torch.Tensor:
        ctx.iteration, ctx.k = iteration, k
        return output.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[Any, ...]:
        ctx.iteration.reached[ctx.k] = True
        return None, None, grad


def through_sink(output: Any, reducer: Reducer) -> Any:
    """The forward's output with every tensor that has a graph passed through one DDPSink (and then its own
    OutputReached)."""
    leaves, rebuild = flatten(output)
    places = [k for k, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor) and leaf.grad_fn is not None]
    if not places:
        return output
    iteration = _Iteration(reducer, [leaves[k] for k in places])
    sunk = DDPSink.apply(iteration, *[leaves[k] for k in places])
    for n, (k, t) in enumerate(zip(places, sunk)):
        leaves[k] = OutputReached.apply(iteration, n, t)
    return rebuild(leaves)
