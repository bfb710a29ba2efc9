"""check_inputs: the compiled code and eager torchtrace on the same inputs, compared output by output."""
import copy
from typing import Any, List, Tuple

import torch

from torchtrace.autograd.engine import backward
from torchtrace.compiler import guards
from torchtrace.compiler.recorder import _rng_state, _set_rng_state, plain
from torchtrace.errors import GradientMismatch, UnsupportedOperationError


def _leaves(compiled: Any, args: tuple) -> List[Tuple[str, torch.Tensor]]:
    """Named tensors whose gradient is compared: the inputs that require grad, then captured leaves."""
    flat: List[Tuple[str, torch.Tensor]] = []
    for name, value in zip(guards.argument_names(compiled.fn, len(args)), args):
        guards.flatten(value, name, flat)
    found = [(f"gradient of input {name}", t) for name, t in flat if t.requires_grad]
    found += [(f'gradient of params["{label}"]', t) for label, t in compiled.latest_captured()
              if t.requires_grad and getattr(t, "_tt_node", None) is None]
    return found


def _run(fn: Any, args: tuple, leaves: List[Tuple[str, torch.Tensor]], rng: tuple) -> Tuple[list, list]:
    """Outputs and leaf gradients of one run (the leaves' .grad is left as it was)."""
    kept = [t.grad for _, t in leaves]
    for _, t in leaves:
        t.grad = None
    _set_rng_state(rng)
    outputs = guards.output_tensors(fn(*args))
    weighted = [(o * torch.linspace(0.5, 1.5, o.numel(), dtype=o.dtype).reshape(o.shape)).sum()
                for o in outputs if o.requires_grad]
    if weighted:
        backward(weighted)
    grads = [t.grad for _, t in leaves]
    for (_, t), g in zip(leaves, kept):
        t.grad = g
    return [plain(o).detach().clone() for o in outputs], grads


def compare_with_eager(compiled: Any, args: tuple, tolerance: float) -> None:
    """Raise GradientMismatch naming the first output or gradient where compiled and eager differ."""
    key = compiled._key(args, {})[0]
    if compiled.eager_reason is not None:  # it runs eagerly: nothing generated to compare
        return
    if not any(s.valid() for s in compiled.specialisations.get(key, ())):
        compiled._trace(copy.copy(args), {}, compiled._key(args, {}))  # so the comparison runs generated code
        if compiled.eager_reason is not None:
            return
    if getattr(compiled, "latest", None) is None or compiled.latest.grad_effects is not None:
        raise UnsupportedOperationError(
            "tt.compile: check_inputs / verify cannot compare a training step with eager (running both would "
            "update the parameters twice) — compare it by training a copy of the model eagerly on the same batches")
    leaves = _leaves(compiled, args)
    rng = _rng_state()
    buffers = [(t, plain(t).detach().clone()) for _, t in compiled.latest_captured() if not t.requires_grad]
    eager_out, eager_grads = _run(compiled.fn, args, leaves, rng)
    _restore(buffers)  # both runs start from the same running statistics, and the check leaves them as they were
    code_out, code_grads = _run(compiled, args, leaves, rng)
    _restore(buffers)
    _set_rng_state(rng)
    for i, (a, b) in enumerate(zip(code_out, eager_out)):
        _compare(f"output {i}", a, b, tolerance)
    for (what, _), a, b in zip(leaves, code_grads, eager_grads):
        _compare(what, a, b, tolerance)


def _restore(buffers: List[Tuple[torch.Tensor, torch.Tensor]]) -> None:
    with torch.no_grad():
        for t, data in buffers:
            plain(t).copy_(data)


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
