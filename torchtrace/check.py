"""tt.check (against torch autograd) and tt.gradcheck (against central finite differences)."""
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from torchtrace.argument_checks import input_tuples
from torchtrace.autograd import engine
from torchtrace.autograd.node import Context, Node, gradient_for
from torchtrace.autograd.plain import plain_torch
from torchtrace.autograd.state import observing
from torchtrace.errors import GradientMismatch
from torchtrace.factories import as_tracer
from torchtrace.naming import callable_name
from torchtrace.nested import flatten
from torchtrace.reference import PlainCopies, finite_differences


def _plain(t: torch.Tensor) -> torch.Tensor:
    with plain_torch():
        return t.detach().clone().as_subclass(torch.Tensor)


def _differentiable(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and (x.is_floating_point() or x.is_complex())


class CheckReport:
    """What tt.check compared: outputs, input gradients, graph nodes, and the largest difference seen."""

    reference = "torch autograd"  # or "finite differences (why torch autograd was not the reference)"
    n_captured = 0  # gradients of leaves fn uses without taking them as inputs (a ported model's parameters)

    def __init__(self, n_outputs: int, n_gradients: int, n_nodes: int, max_abs_diff: float):
        self.n_outputs, self.n_gradients = n_outputs, n_gradients
        self.n_nodes, self.max_abs_diff = n_nodes, max_abs_diff
        self.ok = True

    def __repr__(self) -> str:
        captured = f" and {self.n_captured} gradients of tensors it uses" if self.n_captured else ""
        return (f"CheckReport(ok: {self.n_outputs} outputs and {self.n_gradients} input gradients{captured} match "
                f"{self.reference} over {self.n_nodes} graph nodes, max |diff| = {self.max_abs_diff:.3g})")


def check(fn: Callable, *inputs: Any, check_inputs: Optional[Sequence[Sequence[Any]]] = None,
          rtol: float = 1e-5, atol: float = 1e-6) -> CheckReport:
    """Run fn on tracers and under torch autograd; compare outputs and every input gradient."""
    further = input_tuples("tt.check", check_inputs, single_tensor_entries=False)
    reports = [_check_once(fn, args, rtol, atol) for args in [inputs, *further]]
    total = reports[0]
    if total.n_gradients == 0 and total.n_captured == 0:
        raise ValueError("tt.check compared no gradient: fn took no floating-point tensor input and used no tensor "
                         "that requires grad. Pass the tensors to differentiate as inputs (floating point), or call "
                         "a ported model inside fn (its parameters are then checked)")
    for extra in reports[1:]:
        total.n_nodes += extra.n_nodes
        if extra.reference != total.reference:
            total.reference = f"{total.reference}; {extra.reference}"
        total.max_abs_diff = max(total.max_abs_diff, extra.max_abs_diff)
    return total


def _weights(outputs: List[Any], seed: int = 0) -> List[Optional[torch.Tensor]]:
    """A fixed random cotangent per floating output, so every output's gradient is checked."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(o.shape, generator=generator, dtype=o.dtype).to(o.device) if _differentiable(o) else None
            for o in outputs]


def _compare(what: str, ours: Any, theirs: Any, rtol: float, atol: float) -> float:
    if ours.shape != theirs.shape:
        raise GradientMismatch(f"{what}: shape {tuple(ours.shape)} differs from torch's {tuple(theirs.shape)}")
    diff = (ours.double() - theirs.double()).abs().nan_to_num(0.0)
    same_nan = torch.equal(ours.isnan(), theirs.isnan())
    if not same_nan or not torch.allclose(ours.double(), theirs.double(), rtol=rtol, atol=atol, equal_nan=True):
        raise GradientMismatch(f"{what} differs from torch autograd: max |diff| = {diff.max().item():.3g}")
    return diff.max().item() if diff.numel() else 0.0


class RandomState:
    """torch's random generators (CPU, and CUDA once initialised) as they are now, to replay: every run of the
    checked function then draws the same numbers (dropout masks), as its first run did."""

    def __init__(self) -> None:
        self.cpu = torch.get_rng_state()
        self.cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() \
            else None

    def replay(self) -> None:
        torch.set_rng_state(self.cpu)
        if self.cuda is not None:
            torch.cuda.set_rng_state_all(self.cuda)


def _keep_call(node: Node, args: tuple, kwargs: dict, result: Any) -> None:
    """Remember each node's arguments, so its rule can be re-checked alone if gradients disagree."""
    node.note(call=(args, kwargs))


def _check_once(fn: Callable, inputs: Sequence[Any], rtol: float, atol: float) -> CheckReport:
    leaves, rebuild = flatten(list(inputs))
    ours = [as_tracer(_plain(x), _differentiable(x)) if isinstance(x, torch.Tensor) else x for x in leaves]
    theirs = [_plain(x).requires_grad_(_differentiable(x)) if isinstance(x, torch.Tensor) else x for x in leaves]
    observed: List[Tuple[Node, List[Any], Tuple[Any, ...]]] = []
    recorded: List[Node] = []

    def keep_call(node: Node, args: tuple, kwargs: dict, result: Any) -> None:
        _keep_call(node, args, kwargs, result)
        recorded.append(node)

    random_state = RandomState()
    with observing(keep_call, lambda node, grads, result: observed.append((node, grads, result))):
        out_ours, _ = flatten(fn(*rebuild(ours)))
        _refuse_no_tensor("tt.check", out_ours)
        random_state.replay()  # the reference run draws what ours drew
        with PlainCopies() as reference_run:  # torch autograd alone: parameters and captured tracers as plain copies
            out_theirs, _ = flatten(fn(*rebuild(theirs)))
        weights = _weights(out_ours)
        worst = max([_compare(f"output {i}", _plain(a), b.detach(), rtol, atol)
                     for i, (a, b) in enumerate(zip(out_ours, out_theirs)) if isinstance(a, torch.Tensor)] or [0.0])
        captured = reference_run.leaves()
        kept = [t._tt_grad for t, _ in captured]
        try:
            for t, _ in captured:  # their gradient from this backward alone; restored below
                t._tt_grad = None
            pairs = [(o, w) for o, w in zip(out_ours, weights) if w is not None and o.requires_grad]
            if pairs:
                engine.backward([o for o, _ in pairs], [w for _, w in pairs])
            ours_captured = [t._tt_grad for t, _ in captured]
        finally:
            for (t, _), grad in zip(captured, kept):
                t._tt_grad = grad
        reason = _why_not_torch(recorded, out_ours, out_theirs)
        loss = sum((o * w).sum() for o, w in zip(out_theirs, weights) if w is not None and o.requires_grad)
        if reason is None and isinstance(loss, torch.Tensor):
            try:
                loss.backward()
            except (RuntimeError, NotImplementedError) as error:
                reason = f"torch autograd cannot differentiate it ({str(error).splitlines()[0]})"
    if reason is not None:
        return _check_by_finite_differences(fn, leaves, rebuild, ours, weights, reason, len(out_ours), len(observed),
                                            random_state)
    n_grads = 0
    try:
        for i, (a, b) in enumerate(zip(ours, theirs)):
            if isinstance(b, torch.Tensor) and b.requires_grad:
                expected = b.grad if b.grad is not None else torch.zeros_like(b)
                got = a.grad if a.grad is not None else torch.zeros_like(expected)
                worst = max(worst, _compare(f"gradient of input {i}", got, expected, rtol, atol))
                n_grads += 1
        for k, ((t, copy), got) in enumerate(zip(captured, ours_captured)):
            expected = copy.grad if copy.grad is not None else torch.zeros_like(copy)
            got = got if got is not None else torch.zeros_like(expected)
            what = f"gradient of tensor {k} that fn uses without taking it as an input (shape {tuple(t.shape)})"
            worst = max(worst, _compare(what, got, expected, rtol, atol))
    except GradientMismatch as mismatch:
        raise GradientMismatch(f"{mismatch}\n{_first_diverging_node(observed, rtol, atol)}") from None
    report = CheckReport(len(out_ours), n_grads, len(observed), worst)
    report.n_captured = len(captured)
    return report


def _why_not_torch(recorded: List[Node], out_ours: List[Any], out_theirs: List[Any]) -> Optional[str]:
    """Why torch autograd is no reference for this function (None: it is one)."""
    users = sorted({node.rule.user_backward for node in recorded if getattr(node.rule, "user_backward", None)})
    if users:
        return (f"it calls the torch autograd Function {', '.join(users)}, whose backward torch runs as written, "
                "not derived from its forward")
    for i, (a, b) in enumerate(zip(out_ours, out_theirs)):
        if isinstance(a, torch.Tensor) and a.requires_grad and isinstance(b, torch.Tensor) and not b.requires_grad:
            return f"torch autograd does not differentiate output {i}"
    return None


def _check_by_finite_differences(fn: Callable, leaves: List[Any], rebuild: Callable, ours: List[Any],
                                 weights: List[Optional[torch.Tensor]], reason: str, n_outputs: int,
                                 n_nodes: int, random_state: RandomState) -> CheckReport:
    """Compare the inputs' gradients with central finite differences (float64), saying why torch was not used.
    Every evaluation draws the random numbers of the first run."""
    after_one_run = RandomState()

    def projected(values: List[Any]) -> float:
        random_state.replay()
        outs, _ = flatten(fn(*rebuild(values)))
        return sum(float((o.double() * w.double()).sum()) for o, w in zip(outs, weights) if w is not None)

    numeric = finite_differences(projected, leaves)
    after_one_run.replay()
    worst = 0.0
    for k, expected in numeric.items():
        got = ours[k].grad if ours[k].grad is not None else torch.zeros_like(expected)
        loose = got.dtype != torch.float64  # the gradient is rounded in the input's own dtype
        rtol, atol = (1e-2, 1e-3) if loose else (1e-3, 1e-5)
        if not torch.allclose(got.double(), expected, rtol=rtol, atol=atol, equal_nan=True):
            diff = (got.double() - expected).abs().nan_to_num(0.0).max().item()
            raise GradientMismatch(f"gradient of input {k} differs from finite differences: max |diff| = {diff:.3g} "
                                   f"(compared with finite differences, not torch autograd: {reason})")
        worst = max(worst, (got.double() - expected).abs().nan_to_num(0.0).max().item() if got.numel() else 0.0)
    report = CheckReport(n_outputs, len(numeric), n_nodes, worst)
    report.reference = f"finite differences ({reason})"
    return report


def _local_reference(node: Node, grads: List[Any]) -> Dict[Any, torch.Tensor]:
    """torch autograd's vector-Jacobian product of this one node, on copies of its recorded inputs."""
    args, kwargs = node.notes["call"]
    keys = [edge.position for edge in node.edges]
    copies: Dict[Any, torch.Tensor] = {}

    def leaf(key: Any, x: Any) -> Any:
        if key in keys:
            copies[key] = _plain(x).requires_grad_(True)
            return copies[key]
        return _plain(x) if isinstance(x, torch.Tensor) else x

    new_args = [[leaf((i, j), e) for j, e in enumerate(a)] if isinstance(a, (list, tuple)) else leaf(i, a)
                for i, a in enumerate(args)]
    new_kwargs = {k: leaf(node.rule.param_index(k), v) for k, v in kwargs.items()}
    out = node.rule.forward(Context(node.rule), *new_args, **new_kwargs)  # torch autograd records its torch calls
    outs, _ = flatten(out)
    total = sum((o * g).sum() for o, g in zip(outs, grads) if g is not None and o.requires_grad)
    if isinstance(total, torch.Tensor):
        total.backward()
    return {key: c.grad for key, c in copies.items()}


def _first_diverging_node(observed: List[Tuple[Node, List[Any], Tuple[Any, ...]]], rtol: float, atol: float) -> str:
    """Walk the nodes in the order gradients flowed; report the first whose own rule disagrees with torch."""
    for node, grads, result in observed:
        if "call" not in (node.notes or {}):
            continue
        reference = _local_reference(node, grads)
        for edge in node.edges:
            key, ours = edge.position, gradient_for(edge, result)
            theirs = reference.get(key)
            if theirs is None:
                continue
            ours = torch.zeros_like(theirs) if ours is None else ours.sum_to_size(theirs.shape)
            if not torch.allclose(ours.double(), theirs.double(), rtol=rtol, atol=atol, equal_nan=True):
                where = callable_name(node.func) if node.func else f"{node.rule.__name__}.apply"
                diff = (ours.double() - theirs.double()).abs().max().item()
                return (f"First diverging node: {node.name} ({where}), gradient for argument {key}: "
                        f"max |diff| = {diff:.3g}")
    return "No single node's rule disagrees with torch; the difference comes from how gradients were combined."


def _refuse_no_tensor(tool: str, outputs: List[Any]) -> None:
    """A function that returns no tensor leaves nothing to compare: say so rather than report a check of nothing."""
    if not any(isinstance(o, torch.Tensor) for o in outputs):
        kinds = ", ".join(sorted({type(o).__name__ for o in outputs})) or "nothing"
        raise ValueError(f"{tool}: the function returned no tensor ({kinds}), so there is nothing to compare: return "
                         "the tensor(s) whose gradients you want checked")


def gradcheck(fn: Callable, *inputs: Any, eps: float = 1e-6, atol: float = 1e-5, rtol: float = 1e-3,
              raise_exception: bool = True) -> bool:
    """Compare torchtrace's Jacobian with central finite differences, in float64, entry by entry (as torch's
    gradcheck): row r of each output's block from one backward pass of the unit cotangent e_r, column j from
    (f(x + eps e_j) - f(x - eps e_j)) / 2 eps. Raises GradientMismatch naming the input and output that differ
    (`raise_exception=False`: returns False instead, as torch's)."""
    try:
        return _gradcheck(fn, inputs, eps, atol, rtol)
    except GradientMismatch:
        if raise_exception:
            raise
        return False


def _gradcheck(fn: Callable, inputs: tuple, eps: float, atol: float, rtol: float) -> bool:
    if not eps > 0:
        raise ValueError(f"tt.gradcheck: eps is the finite-difference step and must be positive, not {eps}")
    leaves, rebuild = flatten(list(inputs))
    if not any(_differentiable(x) for x in leaves):
        raise ValueError("tt.gradcheck expects at least one floating-point tensor input: it checks the gradients with "
                         "respect to the inputs (for a model's parameters, use tt.check)")
    leaves = [_plain(x).double().contiguous() if _differentiable(x) else x for x in leaves]
    ours = [as_tracer(x.clone(), True) if _differentiable(x) else x for x in leaves]
    out_ours, _ = flatten(fn(*rebuild(ours)))
    _refuse_no_tensor("tt.gradcheck", out_ours)
    checked = [i for i, x in enumerate(leaves) if _differentiable(x)]
    outputs = [k for k, o in enumerate(out_ours) if _differentiable(o)]
    analytic = _analytic_jacobian([out_ours[k] for k in outputs], [ours[i] for i in checked])

    def evaluated() -> List[torch.Tensor]:
        outs, _ = flatten(fn(*rebuild(leaves)))
        return [_plain(outs[k]).double().reshape(-1) for k in outputs]

    for column, i in enumerate(checked):
        flat = leaves[i].view(-1)
        numeric = [torch.zeros(out_ours[k].numel(), flat.numel(), dtype=torch.float64) for k in outputs]
        with torch.no_grad():
            for j in range(flat.numel()):
                original = flat[j].item()
                flat[j] = original + eps
                plus = evaluated()
                flat[j] = original - eps
                minus = evaluated()
                flat[j] = original
                for block, p, m in zip(numeric, plus, minus):
                    block[:, j] = (p - m) / (2 * eps)
        for row, (k, block) in enumerate(zip(outputs, numeric)):
            ours_block = analytic[row][column]
            if not torch.allclose(ours_block, block, atol=atol, rtol=rtol):
                diff = (ours_block - block).abs().max().item()
                raise GradientMismatch(f"gradient of input {i} differs from finite differences (output {k}): max "
                                       f"|diff| = {diff:.3g}")
    return True


def _analytic_jacobian(outputs: List[Any], inputs: List[Any]) -> List[List[torch.Tensor]]:
    """J[output][input] as (output elements, input elements) float64 matrices, a row per backward pass of a unit
    cotangent (zeros where an output does not depend on an input, or needs no gradient)."""
    blocks = [[torch.zeros(o.numel(), x.numel(), dtype=torch.float64) for x in inputs] for o in outputs]
    for o, row_blocks in zip(outputs, blocks):
        if not o.requires_grad:
            continue
        for r in range(o.numel()):
            unit = torch.zeros(o.numel(), dtype=o.dtype, device=o.device)
            unit[r] = 1
            row = engine.grad([o], inputs, [unit.view(o.shape)], retain_graph=True, allow_unused=True)
            for block, g in zip(row_blocks, row):
                if g is not None:
                    block[r] = _plain(g).double().reshape(-1)
    return blocks
