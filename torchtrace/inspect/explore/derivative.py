"""A step's local derivative, labelled with what it is, so a student reads it in the input's and output's shapes.

J[k][j] = d out_k / d in_j is read off the rule (local.py). Its kind decides how it is written:
- elementwise: out and input have one shape and J is diagonal; written as that diagonal, in the input's shape:
  downstream = upstream * local, element by element.
- broadcast sum: the input was broadcast to the output's shape and the op is elementwise there; written as the
  elementwise derivative in the output's shape: downstream = upstream * local, summed over the broadcast dims.
- reduction: each input element feeds one output element (sum, mean, a loss); written in the input's shape:
  downstream = upstream of its output element * local.
- Jacobian block: anything else (matmul, softmax, a transpose); written as J with the output's shape followed by
  the input's: downstream[j] = sum_k upstream[k] J[k, j].
"""
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import torch

from torchtrace.autograd.plain import plain_torch
from torchtrace.inspect.explore.shown import nested, shape_text

SHOWN = 64  # a local derivative with at most this many numbers is written out

Matrix = List[List[float]]


@dataclass
class LocalDerivative:
    """The rule's local derivative of one output (or all outputs) with respect to one input."""

    kind: str  # "elementwise", "broadcast sum", "reduction" or "Jacobian block"
    shape: str  # "d out (2, 3) / d input (3)"
    text: str  # the numbers, shaped as the kind says ('' when there are more than SHOWN)
    how: str  # how the chain rule combines it with the upstream gradient
    matrix: Matrix  # J[k][j], outputs' and input's elements flattened

    def __str__(self) -> str:
        return f"{self.kind} {self.shape}: {self.text or '(too many numbers to show)'}"


def _diagonal(j: torch.Tensor) -> bool:
    return j.shape[0] == j.shape[1] and bool((j - torch.diag_embed(j.diagonal())).eq(0).all())


def broadcast_dims(shape: Sequence[int], to: Sequence[int]) -> Optional[Tuple[int, ...]]:
    """The dimensions of `to` that broadcasting `shape` to `to` created or stretched (None: it does not broadcast)."""
    if len(shape) > len(to):
        return None
    lead = len(to) - len(shape)
    if any(s not in (1, t) for s, t in zip(shape, to[lead:])):
        return None
    return tuple(range(lead)) + tuple(lead + i for i, (s, t) in enumerate(zip(shape, to[lead:])) if s == 1 and t != 1)


def _text(values: torch.Tensor) -> str:
    return nested(values.tolist()) if values.numel() <= SHOWN else ""


def describe(matrix: Matrix, broadcast: Optional[Matrix], out_shapes: Sequence[torch.Size],
             in_shape: torch.Size) -> LocalDerivative:
    """Label J (`matrix`); `broadcast` is J before the gradient was summed back to the input's shape (rule ran on
    the input broadcast to the output's shape), when it was."""
    with plain_torch():
        j = torch.tensor(matrix, dtype=torch.float64).reshape(sum(s.numel() for s in out_shapes), in_shape.numel())
        outs = " ".join(shape_text(s) for s in out_shapes)
        label = f"d out {outs} / d input {shape_text(in_shape)}"
        single = len(out_shapes) == 1
        out_shape = out_shapes[0]
        if single and tuple(out_shape) == tuple(in_shape) and _diagonal(j):
            return LocalDerivative("elementwise", label, _text(j.diagonal().reshape(in_shape)),
                                   "downstream = upstream × local, element by element", matrix)
        dims = broadcast_dims(in_shape, out_shape) if single else None
        if dims and broadcast is not None:
            raw = torch.tensor(broadcast, dtype=torch.float64).reshape(out_shape.numel(), out_shape.numel())
            if _diagonal(raw):
                return LocalDerivative(
                    "broadcast sum", label, _text(raw.diagonal().reshape(out_shape)),
                    f"the input {shape_text(in_shape)} was broadcast to {shape_text(out_shape)}: downstream = "
                    f"upstream × local element by element, summed over dim{'s' if len(dims) > 1 else ''} "
                    f"{', '.join(map(str, dims))}", matrix)
        if j.shape[0] < j.shape[1] and bool((j.ne(0).sum(0) <= 1).all()):
            how = ("downstream = upstream × local" if j.shape[0] == 1 else
                   "each input element feeds one output element: downstream = its upstream × local")
            return LocalDerivative("reduction", label, _text(j.sum(0).reshape(in_shape)), how, matrix)
        block = j.reshape(*out_shape, *in_shape) if single else j
        return LocalDerivative("Jacobian block", label, _text(block),
                               "downstream[j] = Σ_k upstream[k] · J[k, j] (J: the output's shape, then the input's)",
                               matrix)
