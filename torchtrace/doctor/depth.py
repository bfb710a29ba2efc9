"""Gradients out of scale with the weights: the relative gradient |dL/dW| / |W| of each weight matrix.

- Over depth, from the layer nearest the loss to the farthest: each layer of a stack multiplies the gradient by its
  local derivative, so saturating activations (sigmoid' <= 1/4) make the first layers' gradients vanish, and a
  stack whose backward gain is above 1 makes them explode. Healthy networks (normalised, residual, initialised for
  their depth) keep nearest and farthest within a few orders of magnitude; beyond DEPTH_RATIO it is a finding.
- In size: where the activations grow layer by layer (a plain stack at gain 3: x 3^20 by the end), the gradient of
  every layer grows with them, evenly (the depth ratio stays near 1) but huge: a median relative gradient above
  SIZE_RATIO means that any learning rate that moves the weights sanely is far too large for the gradient. A
  recurrence is such a stack in time: one weight used at every step, its gradient the sum over steps of products of
  the recurrent gain (x 3^29 after 30 steps at gain 3), so the size test holds for a single weight matrix too.
"""
import collections
import math
import statistics
from typing import Any, Dict, List, Tuple

import torch

from torchtrace.autograd.node import AccumulateGrad
from torchtrace.autograd.plain import plain_torch
from torchtrace.doctor.findings import Finding

DEPTH_RATIO = 1e4
SIZE_RATIO = 1e4
RECURRENT_USES = 3  # a weight that many ops used: one applied at every step of a loop
ADVICE = {"exploding": "initialise each layer for its depth (kaiming / xavier gain), normalise the activations "
                       "(LayerNorm, BatchNorm), add residual connections, or clip the gradient norm",
          "recurrent": "keep the recurrent weight's largest singular value at most 1 (orthogonal initialisation), "
                       "use a gated cell (LSTM, GRU), run the backward through fewer steps (truncated BPTT), or "
                       "clip the gradient norm",
          "vanishing": "initialise each layer for its depth (kaiming / xavier gain), use ReLU-like activations rather "
                       "than saturating ones, normalise the activations, or add residual connections"}


def depth_findings(order: List[Any], grads: Dict[int, torch.Tensor], names: Dict[int, str]) -> List[Finding]:
    """A finding when the relative gradient of the weight matrix farthest from the loss is DEPTH_RATIO times that
    of the nearest (or that much smaller). `order`: the graph from the loss; `grads`: id(leaf) -> its gradient."""
    relative: List[Tuple[str, float, int]] = []  # (name, |dL/dW| / |W|, how many ops used W)
    uses = collections.Counter(edge.node for node in order for edge in node.edges if type(edge.node) is AccumulateGrad)
    for node in order:  # nearest the loss first
        if not isinstance(node, AccumulateGrad) or node.variable.dim() < 2 or id(node.variable) not in grads:
            continue
        with plain_torch():
            weight = float(node.variable.detach().double().norm())
            grad = float(grads[id(node.variable)].double().norm())
        if weight > 0 and grad > 0 and math.isfinite(grad):
            name = names.get(id(node.variable), f"a {tuple(node.variable.shape)} weight")
            relative.append((name, grad / weight, uses[node]))
    if not relative:
        return []
    median = statistics.median(ratio for _, ratio, _ in relative)
    if median > SIZE_RATIO:  # (any number of weights: a recurrence explodes through one weight used at every step)
        largest, _, used = max(relative, key=lambda item: item[1])
        recurrent = used >= RECURRENT_USES
        return [Finding("exploding", "backward", "", "", "", "", f"exploding gradients: the median relative gradient "
                        f"|dL/dW| / |W| of the {len(relative)} weight matrices is {median:.1e} (healthy training: "
                        f"below 1), largest at {largest}" + (f", which {used} ops used: a recurrence whose backward "
                                                             "gain is above 1 multiplies the gradient at every step"
                                                             if recurrent else ""),
                        ADVICE["recurrent" if recurrent else "exploding"])]
    if len(relative) < 3:
        return []
    (near, near_ratio, _), (far, far_ratio, _) = relative[0], relative[-1]
    growth = far_ratio / near_ratio
    if 1 / DEPTH_RATIO <= growth <= DEPTH_RATIO:
        return []
    kind = "exploding" if growth > 1 else "vanishing"
    message = (f"{kind} gradients over depth: the relative gradient |dL/dW| / |W| is {far_ratio:.2e} at {far} (the "
               f"weight farthest from the loss) and {near_ratio:.2e} at {near} (the nearest), a factor {growth:.1e} "
               f"across {len(relative)} weight matrices")
    return [Finding(kind, "backward", "", "", "", "", message, ADVICE[kind])]
