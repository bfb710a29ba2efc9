"""check_inputs / verify: the compiled function and eager torchtrace on the same inputs, compared output by output."""
import inspect
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from torch.overrides import TorchFunctionMode

from torchtrace.autograd.engine import backward
from torchtrace.autograd.state import observing
from torchtrace.compiler.replay import tensors_in
from torchtrace.errors import GradientMismatch, UnsupportedOperationError


def plain(t: torch.Tensor) -> torch.Tensor:
    return torch.Tensor.detach(t).as_subclass(torch.Tensor)


def flat_tensors(value: Any, name: str, found: List[Tuple[str, torch.Tensor]]) -> None:
    """(name, tensor) for every tensor in nested tuples, lists and dicts: x, batch_0, batch_1, inputs_mask."""
    if isinstance(value, torch.Tensor):
        found.append((name, value))
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            flat_tensors(item, f"{name}_{i}", found)
    elif isinstance(value, dict):
        for key, item in value.items():
            flat_tensors(item, f"{name}_{key}", found)


def argument_names(fn: Callable, n: int) -> List[str]:
    """The names of fn's first n positional parameters (input0, input1, ... where it has none)."""
    target = fn.forward if isinstance(fn, torch.nn.Module) else fn
    try:
        names = [p.name for p in inspect.signature(target).parameters.values()
                 if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        names = []
    return [names[i] if i < len(names) else f"input{i}" for i in range(n)]


def _leaves(compiled: Any, args: tuple) -> List[Tuple[str, torch.Tensor]]:
    """Named leaves whose gradient is compared: the inputs that require grad, then a module's parameters."""
    found: List[Tuple[str, torch.Tensor]] = []
    for name, value in zip(argument_names(compiled.fn, len(args)), args):
        flat_tensors(value, name, found)
    leaves = [(f"gradient of input {name}", t) for name, t in found if t.requires_grad and t.is_leaf]
    if isinstance(compiled.fn, torch.nn.Module):
        leaves += [(f"gradient of {name}", p) for name, p in compiled.fn.named_parameters() if p.requires_grad]
    return leaves


def _run(fn: Any, args: tuple, leaves: List[Tuple[str, torch.Tensor]], rng: torch.Tensor,
         inside: Optional[list] = None) -> Tuple[list, list]:
    """Outputs and leaf gradients of one run (the leaves' .grad is left as it was); `inside` collects the backward
    passes fn ran itself."""
    kept = [t.grad for _, t in leaves]
    for _, t in leaves:
        t.grad = None
    torch.set_rng_state(rng)
    outputs = tensors_in(fn(*args))
    if inside:
        inside.append("fn ran a backward pass itself")
        return [], []
    weighted = [(o * torch.linspace(0.5, 1.5, o.numel(), dtype=o.dtype).reshape(o.shape)).sum()
                for o in outputs if o.requires_grad]
    if weighted:
        backward(weighted)
    grads = [t.grad for _, t in leaves]
    for (_, t), g in zip(leaves, kept):
        t.grad = g
    return [plain(o).clone() for o in outputs], grads


class Snapshots(TorchFunctionMode):
    """Keeps a copy of every tensor a call reads (and of a leaf's .grad), as it was when first read, so that
    `restore` can undo what the call wrote: running statistics, or a training step's update."""

    def __init__(self) -> None:
        super().__init__()
        self.kept: Dict[int, tuple] = {}

    def __torch_function__(self, func: Callable, types: Any, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
        for a in (*args, *(kwargs or {}).values()):
            if isinstance(a, torch.Tensor) and id(a) not in self.kept:
                with torch._C.DisableTorchFunction():
                    grad = _grad_of(a)
                    self.kept[id(a)] = (a, a.detach().clone(), grad, None if grad is None else grad.detach().clone())
        return func(*args, **(kwargs or {}))

    def restore(self) -> None:
        with torch._C.DisableTorchFunction(), torch.no_grad():
            for t, data, grad, grad_data in self.kept.values():
                if t.shape == data.shape and not torch.equal(t, data):
                    t.copy_(data)
                if grad is not None and grad.shape == grad_data.shape and not torch.equal(grad, grad_data):
                    grad.copy_(grad_data)
                if grad is not None or _grad_of(t) is not None:
                    _set_grad(t, grad)


def _grad_of(t: torch.Tensor) -> Optional[torch.Tensor]:
    if hasattr(type(t), "_tt_grad"):
        return t._tt_grad
    return t.grad if t.is_leaf else None


def _set_grad(t: torch.Tensor, grad: Optional[torch.Tensor]) -> None:
    if hasattr(type(t), "_tt_grad"):
        t._tt_grad = grad
    elif t.is_leaf:
        t.grad = grad


def compare_with_eager(compiled: Any, args: tuple, tolerance: float) -> None:
    """Raise GradientMismatch naming the first output or gradient where compiled and eager differ."""
    leaves = _leaves(compiled, args)
    rng = torch.get_rng_state()
    snapshots = Snapshots()
    passes: List[Any] = []
    with observing(on_backward=lambda *_: passes.append(1)), snapshots:
        eager_out, eager_grads = _run(compiled.fn, args, leaves, rng, inside=passes)
    snapshots.restore()  # both runs start from the same state, and the check leaves it as it was
    if "fn ran a backward pass itself" in passes:
        raise UnsupportedOperationError(
            "tt.compile: check_inputs / verify cannot compare a training step with eager (running both would "
            "update the parameters twice; the parameters and .grad are put back, but an optimizer may have filled "
            "its state) — compare it by training a copy of the model eagerly on the same batches")
    code_out, code_grads = _run(compiled._run_plain, args, leaves, rng)
    snapshots.restore()
    torch.set_rng_state(rng)
    for i, (a, b) in enumerate(zip(code_out, eager_out)):
        _compare(f"output {i}", a, b, tolerance)
    for (what, _), a, b in zip(leaves, code_grads, eager_grads):
        _compare(what, a, b, tolerance)


def _compare(what: str, ours: Any, eager: Any, tolerance: float) -> None:
    if ours is None or eager is None:
        if ours is not eager:
            raise GradientMismatch(f"{what}: compiled gives {'None' if ours is None else 'a tensor'}, eager "
                                   f"torchtrace {'None' if eager is None else 'a tensor'}")
        return
    ours, eager = plain(ours), plain(eager)
    if ours.shape != eager.shape:
        raise GradientMismatch(f"{what}: compiled shape {tuple(ours.shape)} differs from eager {tuple(eager.shape)}")
    if not torch.allclose(ours, eager, rtol=tolerance, atol=tolerance, equal_nan=True):
        diff = (ours.double() - eager.double()).abs().max().item()
        raise GradientMismatch(f"{what} differs between compiled and eager torchtrace: max |diff| = {diff:.3g}")
