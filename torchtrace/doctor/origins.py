"""A dead layer's consequences: the first ReLU whose output is 0 for every example is the origin; a later layer
that kills the gradient because of it (its input is now the same for every example: the bias of the layer
between them) is a consequence, and the report says so instead of naming it alone.

The forward observer notes, for each ReLU, the share of its outputs that are exactly 0 and when it was
recorded; after the backward each "killed" finding is walked back through the graph to the earliest ReLU
upstream of it that was dead in the forward. When no gradient reached that ReLU (the later layer killed it
all), the origin gets a finding of its own, from its forward values.
"""
from typing import Any, Dict, List, Set, Tuple

import torch

from torchtrace.autograd.plain import plain_torch
from torchtrace.doctor import gates
from torchtrace.doctor.findings import Finding

DEAD_RULES = ("Relu",)


def zero_share(result: Any) -> float:
    """The share of a ReLU's outputs that are exactly 0."""
    if not isinstance(result, torch.Tensor) or result.numel() == 0:
        return 0.0
    with plain_torch():
        return float((result == 0).double().mean())


def _upstream(node: Any, candidates: Set[Any]) -> List[Any]:
    """The candidate nodes that `node` was computed from (an iterative walk over the recorded edges)."""
    found, stack, seen = [], [node], {node}
    while stack:
        current = stack.pop()
        for edge in current.edges:
            if edge.node is not None and edge.node not in seen:
                seen.add(edge.node)
                stack.append(edge.node)
                if edge.node in candidates:
                    found.append(edge.node)
    return found


def with_origins(killed: List[Finding], dead: Dict[Any, Tuple[int, float]], make: Any) -> List[Finding]:
    """`killed` findings with each consequence marked and its origin added; `dead`: ReLU node -> (place in the
    recording, share of zero outputs); `make(node, message, advice, share)` builds a finding at a node."""
    origins = {node for node, (_, share) in dead.items() if share >= gates.KILLED_SHARE}
    by_node = {f.node: f for f in killed}
    out = list(killed)
    for finding in sorted(killed, key=lambda f: dead.get(f.node, (0, 0.0))[0]):
        earlier = [n for n in _upstream(finding.node, origins) if dead[n][0] < dead.get(finding.node, (0, 0.0))[0]]
        if not earlier:
            continue
        origin = min(earlier, key=lambda n: dead[n][0])
        if origin not in by_node:
            share = dead[origin][1]
            why, advice = gates.KILLING[origin.rule.__name__]
            by_node[origin] = make(origin, f"{share:.0%} of its outputs are 0 in the forward: {why}; no gradient "
                                   "reaches it in this backward, as the later layers pass none", advice, share)
            out.insert(out.index(finding), by_node[origin])
        first = by_node[origin]
        finding.message += (f" - a consequence of the first dead layer, {first.rule} in {first.module or 'the model'}"
                            f" at {first.line}: its zeros make this layer's input the same for every example")
        finding.advice = f"fix the first dead layer ({first.module or first.line}); this one follows from it"
    return out
