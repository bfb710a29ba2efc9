"""tt.jvp and tt.jacobian: forward mode built from two reverse passes, and Jacobians in either mode.

Reverse mode gives vector-Jacobian products: one backward from a cotangent u computes g(u) = J^T u.
g is linear in u, so differentiating it again with respect to u, along a tangent v, gives

    d/du < J^T u, v >  =  J v        (the Jacobian-vector product: forward mode)

The first backward runs with create_graph=True from a cotangent u that is itself a tracer requiring a
gradient, so the engine records J^T u as a graph in u; the second backward, seeded with v, walks that
graph. The value of u never matters (zeros will do). A Jacobian of f: R^n -> R^m then takes m reverse
passes (one row each) or n forward passes (one column each): reverse mode wins for wide Jacobians
(many inputs, few outputs: a loss), forward mode for tall ones.
"""
from typing import Any, Callable, List, Sequence, Tuple, Union

import torch

from torchtrace.autograd.engine import grad
from torchtrace.autograd.plain import plain_torch
from torchtrace.tracer import as_tracer

Tensors = Union[torch.Tensor, Tuple[torch.Tensor, ...]]


def _plain(t: torch.Tensor) -> torch.Tensor:
    with plain_torch():
        return t.detach().as_subclass(torch.Tensor)


def _inputs(values: Sequence[Any], what: str) -> List[torch.Tensor]:
    """Fresh tracer leaves for the primals (floating tensors only), so f's graph starts at them."""
    leaves = []
    for i, value in enumerate(values):
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{what}[{i}] is a {type(value).__name__}; pass tensors (torch.tensor(...) or tt.tracer)")
        if not (value.is_floating_point() or value.is_complex()):
            raise TypeError(f"{what}[{i}] has dtype {value.dtype}; only floating-point inputs have derivatives")
        with plain_torch():
            leaves.append(as_tracer(_plain(value).clone(), requires_grad=True))
    return leaves


def _outputs(result: Any) -> Tuple[List[torch.Tensor], bool]:
    """f's outputs as a list, and whether f returned a tuple (the results keep that structure)."""
    is_tuple = isinstance(result, (tuple, list))
    outputs = list(result) if is_tuple else [result]
    for i, out in enumerate(outputs):
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"f must return a tensor or a tuple of tensors; output {i} is a {type(out).__name__}")
    return outputs, is_tuple


def _zeros_where_unused(grads: Sequence[Any], like: Sequence[torch.Tensor]) -> List[torch.Tensor]:
    return [_plain(g) if g is not None else torch.zeros_like(_plain(t)) for g, t in zip(grads, like)]


class _Linearised:
    """f at the primals, with J^T u recorded as a graph in the cotangents u (the first reverse pass)."""

    def __init__(self, f: Callable, primals: Sequence[torch.Tensor]):
        self.inputs = _inputs(primals, "primals")
        self.outputs, self.is_tuple = _outputs(f(*self.inputs))
        self.live = [i for i, out in enumerate(self.outputs) if out.requires_grad]
        self.cotangents: List[torch.Tensor] = []
        self.vjp: Sequence[Any] = ()

    def _record_vjp(self) -> None:
        """J^T u with create_graph=True, from cotangents u that require a gradient (once, on first use)."""
        if self.cotangents or not self.live:
            return
        self.cotangents = [as_tracer(torch.zeros_like(_plain(self.outputs[i])), requires_grad=True)
                           for i in self.live]
        self.vjp = grad([self.outputs[i] for i in self.live], self.inputs, self.cotangents,
                        create_graph=True, allow_unused=True)

    def jvp(self, tangents: Sequence[torch.Tensor]) -> List[torch.Tensor]:
        """J v, one output per f output: the second reverse pass, d/du < J^T u, v >."""
        self._record_vjp()
        wired = [(g, t) for g, t in zip(self.vjp, tangents) if g is not None and g.requires_grad]
        products = (grad([g for g, _ in wired], self.cotangents, [t for _, t in wired], retain_graph=True,
                         allow_unused=True) if wired else [None] * len(self.live))
        by_output = dict(zip(self.live, products))
        return [_plain(by_output[i]) if by_output.get(i) is not None else torch.zeros_like(_plain(out))
                for i, out in enumerate(self.outputs)]

    def vjp_row(self, output: int, cotangent: torch.Tensor) -> List[torch.Tensor]:
        """J_output^T e for one output: an ordinary reverse pass."""
        if not self.outputs[output].requires_grad:
            return [torch.zeros_like(_plain(x)) for x in self.inputs]
        grads = grad(self.outputs[output], self.inputs, cotangent, retain_graph=True, allow_unused=True)
        return _zeros_where_unused(grads, self.inputs)

    def values(self) -> Tensors:
        plain = tuple(_plain(out) for out in self.outputs)
        return plain if self.is_tuple else plain[0]


def jvp(f: Callable, primals: Tuple[torch.Tensor, ...], tangents: Tuple[torch.Tensor, ...]) -> Tuple[Tensors, Tensors]:
    """(f(*primals), J @ tangents), as torch.func.jvp: forward mode, built from two reverse passes.

    d/du < J^T u, v > = J v: the first pass records J^T u with create_graph=True, the second seeds it with v.
    primals and tangents are tuples of tensors of equal shapes; outputs keep f's structure (tensor or tuple).
    """
    if not isinstance(primals, tuple) or not isinstance(tangents, tuple):
        raise TypeError("tt.jvp(f, primals, tangents): primals and tangents must be tuples of tensors, "
                        "e.g. tt.jvp(f, (x,), (v,))")
    if len(primals) != len(tangents):
        raise ValueError(f"tt.jvp: {len(primals)} primals but {len(tangents)} tangents; give one tangent per primal")
    tangents_plain = []
    for i, (p, t) in enumerate(zip(primals, tangents)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"tangents[{i}] is a {type(t).__name__}; pass a tensor shaped like primals[{i}]")
        if isinstance(p, torch.Tensor) and t.shape != p.shape:
            raise ValueError(f"tangents[{i}] has shape {tuple(t.shape)}, primals[{i}] has {tuple(p.shape)}; "
                             "a tangent has its primal's shape")
        tangents_plain.append(_plain(t).to(p.dtype) if isinstance(p, torch.Tensor) else t)
    linear = _Linearised(f, primals)
    products = linear.jvp(tangents_plain)
    return linear.values(), tuple(products) if linear.is_tuple else products[0]


def _unit(like: torch.Tensor, k: int) -> torch.Tensor:
    e = torch.zeros(like.numel(), dtype=like.dtype, device=like.device)
    e[k] = 1
    return e.view(like.shape)


def jacobian(f: Callable, inputs: Tensors, mode: str = "reverse") -> Any:
    """The Jacobian of f at inputs, with the shapes and nesting of torch's functional `jacobian`.

    mode="reverse": one reverse pass per output element (a row of J each);
    mode="forward": one forward pass (tt.jvp's construction) per input element (a column of J each).
    For a tensor input and output the result has shape output.shape + input.shape; a tuple of inputs
    or outputs gives a tuple (tuples of tuples for both: `J[output][input]`).
    """
    if mode not in ("forward", "reverse"):
        raise ValueError(f"tt.jacobian: mode must be 'forward' or 'reverse', not {mode!r}")
    inputs_tuple = isinstance(inputs, tuple)
    primals = inputs if inputs_tuple else (inputs,)
    linear = _Linearised(f, primals)
    outs, xs = linear.outputs, linear.inputs
    blocks = [[_plain(o).new_zeros(o.shape + x.shape) for x in xs] for o in outs]
    if mode == "reverse":
        for i, out in enumerate(outs):
            for k in range(out.numel()):
                row = linear.vjp_row(i, _unit(_plain(out), k))
                for j, g in enumerate(row):
                    blocks[i][j].view(out.numel(), *xs[j].shape)[k] = g
    else:
        for j, x in enumerate(xs):
            for k in range(x.numel()):
                tangents = [_unit(_plain(x), k) if m == j else torch.zeros_like(_plain(other))
                            for m, other in enumerate(xs)]
                for i, column in enumerate(linear.jvp(tangents)):
                    blocks[i][j].view(*outs[i].shape, x.numel())[..., k] = column
    per_output = [tuple(row) if inputs_tuple else row[0] for row in blocks]
    return tuple(per_output) if linear.is_tuple else per_output[0]
