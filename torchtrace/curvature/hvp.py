"""Hessian-vector products, H v = d/dε ∇f(θ + ε v) at ε = 0, without forming H, and whole Hessians of small inputs.

Two ways, both one forward pass and one backward pass of f plus a pass of about the same size again, so an HVP
costs about two gradients:

- "forward-over-reverse" (the default): the gradient g = ∇f(θ) is computed with create_graph=True, so the
  backward's own ops are ordinary recorded ops; the dual-number pass of forward mode (torchtrace.forward) watches
  every recorded op, forward and backward alike, and carries the tangent θ̇ = v through them. The tangent of g is
  ġ = J_g v = H v. This is torch.func.jvp(torch.func.grad(f), (θ,), (v,)).
- "reverse-over-reverse": g is recorded as above, then a second backward from the scalar <g, v> gives
  ∇_θ <∇f(θ), v> = H^T v = H v (H is symmetric). This is torch.func.vjp(torch.func.grad(f), θ)[1](v).
"""
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Sequence, Tuple, Union

import torch

from torchtrace.autograd.engine import grad
from torchtrace.autograd.node import _next_sequence_nr as next_sequence_nr
from torchtrace.forward.api import _leaves, as_tangent, jacobian, recording_on
from torchtrace.forward.constant_results import constant_results, reads_a_gradient
from torchtrace.forward.dual import DualPass
from torchtrace.forward.transpose import plain

Tensors = Union[torch.Tensor, Tuple[torch.Tensor, ...]]
METHODS = ("forward-over-reverse", "reverse-over-reverse")


def _checked(method: str, what: str) -> None:
    if method not in METHODS:
        raise ValueError(f"{what}: method must be one of {METHODS}, not {method!r}")


def _gradient(loss: torch.Tensor, leaves: Sequence[torch.Tensor], name: str = "f") -> Tuple[torch.Tensor, ...]:
    """g = ∇loss, recorded (create_graph=True), a zero tensor for a leaf the loss does not use (all of them for a
    loss that depends on none: its Hessian is 0, as torch.func's)."""
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        shape = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
        raise ValueError(f"a Hessian needs a scalar function; {name} returned {shape}")
    if not getattr(loss, "_tt_requires_grad", False):
        return tuple(torch.zeros_like(plain(leaf)) for leaf in leaves)
    g = grad(loss, list(leaves), create_graph=True, allow_unused=True)
    return tuple(gi if gi is not None else torch.zeros_like(plain(leaf)) for gi, leaf in zip(g, leaves))


@dataclass
class HVPPasses:
    """What one HVP recorded: the loss, its recorded gradient, and (forward-over-reverse) the dual pass."""

    loss: torch.Tensor
    gradient: Tuple[torch.Tensor, ...]
    dual: Optional[DualPass]


def hvp_at(loss_of: Callable[[], torch.Tensor], leaves: Sequence[torch.Tensor], v: Sequence[torch.Tensor],
           method: str = "forward-over-reverse", name: str = "f") -> Tuple[List[torch.Tensor], HVPPasses]:
    """H v for the loss `loss_of()` (the function the caller calls `name`) computes from the tracer leaves `leaves`
    (they are not copied: a model's own parameters work), v one plain tensor per leaf. Returns (H v as plain
    tensors, the passes). It records with gradients on whatever the caller's grad mode (as torch.func ignores an
    outer no_grad, and records inside torch.inference_mode as torch.func does)."""
    _checked(method, "tt.hvp")
    with recording_on():
        return _hvp_at(loss_of, leaves, v, method, name)


def _hvp_at(loss_of: Callable[[], torch.Tensor], leaves: Sequence[torch.Tensor], v: Sequence[torch.Tensor],
            method: str, name: str) -> Tuple[List[torch.Tensor], HVPPasses]:
    if method == "forward-over-reverse":
        dual = DualPass()
        for leaf, t in zip(leaves, v):
            dual.seed(leaf, t)
        with dual.running():
            loss = loss_of()
            g = _gradient(loss, leaves, name)
        products = []
        for gi in g:
            dot = dual.tangent_of(gi)
            products.append(plain(dot) if dot is not None else torch.zeros_like(plain(gi)))
        return products, HVPPasses(loss, g, dual)
    loss = loss_of()
    g = _gradient(loss, leaves, name)
    terms = [gi.mul(vi).sum() for gi, vi in zip(g, v) if getattr(gi, "_tt_requires_grad", False)]
    if not terms:  # the gradient does not depend on θ: f is linear in θ, H = 0
        return [torch.zeros_like(plain(leaf)) for leaf in leaves], HVPPasses(loss, g, None)
    hv = grad(sum(terms), list(leaves), allow_unused=True)
    products = [plain(h) if h is not None else torch.zeros_like(plain(leaf)) for h, leaf in zip(hv, leaves)]
    return products, HVPPasses(loss, g, None)


class HVPReport:
    """How tt.hvp(..., report=True) computed H v: `method`, `loss` (f at θ), and `explore()`, the player on the
    backward pass that carried H v (see HVPReport.explore)."""

    def __init__(self, f: Callable, primals: Sequence[torch.Tensor], v: Sequence[torch.Tensor], method: str):
        self.f, self.primals, self.v, self.method = f, primals, v, method

    def explore(self) -> Any:
        """The player (tt.explore) on the pass that carries H v, recomputed on fresh leaves.

        forward-over-reverse: the backward of f, whose every op the dual pass followed; each node is annotated
        with the tangent of its output (ẏ = J ẋ, the forward half of the pass), and the recorded gradient's own
        ops carry ġ = H v. reverse-over-reverse: the second backward, from <∇f, v>, walking the ops the first
        backward recorded; the leaves' .grad it fills are H v.
        """
        from torchtrace.inspect.explore import explore

        leaves = _leaves(self.primals, "params")
        if self.method == "reverse-over-reverse":
            g = _gradient(self.f(*leaves), leaves)
            inner = sum(gi.mul(vi).sum() for gi, vi in zip(g, self.v))
            return explore(inner, list(leaves))
        dual = DualPass()
        for leaf, t in zip(leaves, self.v):
            dual.seed(leaf, t)
        with dual.running():
            loss = self.f(*leaves)
        player = explore(loss, list(leaves), retain_graph=True)
        for key, tangent in dual.tangents.items():
            if not isinstance(key, tuple):  # a seeded leaf: its tangent is v itself
                continue
            try:
                player.annotate(key[0], "tangent", f"forward tangent of output {key[1]}: ẏ = J ẋ = "
                                f"{_short(tangent)}", severity="info")
            except ValueError:  # a node the player did not draw
                continue
        return player


def _short(t: torch.Tensor) -> str:
    flat = t.detach().reshape(-1)
    shown = ", ".join(f"{x:.4g}" for x in flat[:4].tolist())
    return f"[{shown}{', …' if flat.numel() > 4 else ''}] (shape {tuple(t.shape)})"


def _as_tuple(x: Tensors, what: str) -> Tuple[Tuple[torch.Tensor, ...], bool]:
    if isinstance(x, torch.Tensor):
        return (x,), False
    if isinstance(x, (tuple, list)) and all(isinstance(t, torch.Tensor) for t in x):
        return tuple(x), True
    raise TypeError(f"{what} must be a tensor or a tuple of tensors, not {type(x).__name__}")


def hvp(f: Callable[..., torch.Tensor], params: Tensors, v: Tensors, method: str = "forward-over-reverse",
        report: bool = False) -> Any:
    """H v, the Hessian of the scalar f(*params) at params times v, without forming H (as torch.func's HVP,
    torch.func.jvp(torch.func.grad(f), params, v)[1]).

    params and v are a tensor or matching tuples of tensors; the result has v's structure. method:
    "forward-over-reverse" (the tangent v carried through the forward and the recorded backward: ġ = H v) or
    "reverse-over-reverse" (a second backward from <∇f, v>: ∇<∇f, v> = H v). report=True returns
    (H v, HVPReport); the report's explore() shows the passes in the player.
    """
    primals, is_tuple = _as_tuple(params, "params")
    vs, v_tuple = _as_tuple(v, "v")
    if len(vs) != len(primals) or v_tuple != is_tuple:
        raise ValueError("v must have params' structure: one tensor per parameter")
    for i, (p, t) in enumerate(zip(primals, vs)):
        if t.shape != p.shape:
            raise ValueError(f"v[{i}] has shape {tuple(t.shape)}, params[{i}] has {tuple(p.shape)}")
    _checked(method, "tt.hvp")
    with recording_on():  # (leaves made under the caller's inference_mode would not record)
        leaves = _leaves(primals, "params")
        vs = tuple(as_tangent(t, p, f"tt.hvp: v[{i}]", f"params[{i}]", "tt.hvp")
                   for i, (t, p) in enumerate(zip(vs, primals)))
        first_node = next_sequence_nr()
        products, passes = hvp_at(lambda: f(*leaves), leaves, vs, method)
    anchor = reads_a_gradient(primals, leaves, [passes.loss], first_node)  # (a result torch.func would differentiate)
    products = constant_results(products, anchor, "tt.hvp")
    result = tuple(products) if is_tuple else products[0]
    return (result, HVPReport(f, primals, vs, method)) if report else result


def hessian(f: Callable[..., torch.Tensor], x: Tensors, method: str = "forward-over-reverse") -> Any:
    """The Hessian H_ij = ∂²f/∂x_i∂x_j of the scalar f at x, as torch.func.hessian: shape x.shape + x.shape for a
    tensor x; for a tuple of inputs, a tuple of tuples `H[i][j]` of shape x_i.shape + x_j.shape.

    It is the Jacobian of the recorded gradient x -> ∇f(x): one dual pass per input element (forward-over-reverse,
    a column H e_k each) or one backward per gradient element (reverse-over-reverse, a row e_kᵀ H each). Meant for
    small inputs: n passes for n elements.
    """
    _checked(method, "tt.hessian")
    _, is_tuple = _as_tuple(x, "x")

    def gradient(*xs: torch.Tensor) -> Tensors:
        g = _gradient(f(*xs), xs)
        return g if is_tuple else g[0]

    with recording_on():
        return jacobian(gradient, x, mode="forward" if method == "forward-over-reverse" else "reverse")
