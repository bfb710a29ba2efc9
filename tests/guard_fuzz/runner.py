"""Run fuzzer programs: random mutations between calls, each compiled call compared with eager torchtrace, its
outputs, gradients, parameters and side effects (the log it fills, what it prints)."""
import contextlib
import io
import math
import random
import time
import traceback
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional, Tuple

import torch

import torchtrace as tt

from .floats import FLOAT_NAMES
from .mutations import MUTATIONS
from .programs import CONFIG, READ_NAMES, SHIFT, Program, build

CI_SEED, CI_PROGRAMS, CALLS = 9000, 24, 12


@dataclass
class Tally:
    programs: int = 0
    calls: int = 0
    replays: int = 0  # calls that matched the recorded program to their end
    refused: int = 0
    failures: List[str] = field(default_factory=list)

    def summary(self) -> str:
        return (f"{self.programs} programs, {self.calls} compiled calls ({self.replays} replayed to the end), "
                f"{self.refused} refused, {len(self.failures)} differences from eager")


def _plain(t: torch.Tensor) -> torch.Tensor:
    return t.detach().as_subclass(torch.Tensor)


def _run(side, model, x: torch.Tensor, seed: int) -> Tuple[torch.Tensor, list]:
    """Output and gradients (parameters, then the input if it is a leaf that requires grad) of one call."""
    for p in model.parameters():
        p.grad = None
    leaf = getattr(x, "requires_grad", False) and x.is_leaf
    if leaf:
        x.grad = None
    torch.manual_seed(seed)
    out = side(x)
    (out * torch.linspace(0.5, 1.5, out.numel(), dtype=out.dtype).reshape(out.shape)).sum().backward()
    grads = [None if p.grad is None else _plain(p.grad).clone() for p in model.parameters()]
    return _plain(out).clone(), grads + ([None if x.grad is None else _plain(x.grad).clone()] if leaf else [])


def _step_of(model, x: torch.Tensor):
    """A training step over `model`: zero_grad, forward, weighted loss, backward, SGD with momentum."""
    optimizer = tt.optim.SGD(model.parameters(), lr=0.01, momentum=0.5)

    def step(inputs: torch.Tensor) -> torch.Tensor:
        optimizer.zero_grad()
        out = model(inputs)
        loss = (out * torch.linspace(0.5, 1.5, out.numel(), dtype=out.dtype).reshape(out.shape)).sum()
        loss.backward()
        optimizer.step()
        return loss
    return step


def _run_step(step, model, x: torch.Tensor, seed: int) -> Tuple[torch.Tensor, list]:
    """Loss of one training step, then the parameters and their gradients (and the input's) after it."""
    leaf = getattr(x, "requires_grad", False) and x.is_leaf
    if leaf:
        x.grad = None
    torch.manual_seed(seed)
    loss = step(x)
    after = [t for p in model.parameters() for t in (p, p.grad)] + ([x.grad] if leaf else [])
    return _plain(loss).clone(), [None if t is None else _plain(t).clone() for t in after]


def _close(a: Optional[torch.Tensor], b: Optional[torch.Tensor]) -> bool:
    if a is None or b is None:
        return a is b
    tolerance = 1e-9 if a.dtype == torch.float64 else 1e-4
    return a.shape == b.shape and torch.allclose(a, b, rtol=tolerance, atol=tolerance, equal_nan=True)


def _eager_raises_too(error: Exception, eager_call: Callable[[], Any]) -> bool:
    """Does the eager side raise the same kind of error (anomaly mode on a step that made NaN names the node whose
    backward returned it: a compiled call's own node, or eager's)?"""
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            eager_call()
    except Exception as eager_error:  # noqa: BLE001 - compared with the compiled side's
        return type(eager_error) is type(error) and str(eager_error).split("'")[0] == str(error).split("'")[0]
    return False


def run_program(seed: int, calls: int, tally: Tally) -> None:
    """Compile one program, then `calls` times: mutate both copies, call compiled and eager, compare."""
    SHIFT["value"], CONFIG.SCALE, Program.factor = 0.5, 1.0, 1.0
    torch.set_anomaly_enabled(False)
    rng = random.Random(seed)
    a, b, width = build(seed)
    x = torch.randn(4, width, dtype=torch.float64)
    training = seed % 2 == 1  # every other program is compiled as a whole training step
    history = [f"program {seed} (reads the branch with {READ_NAMES[a.read]}, {FLOAT_NAMES[a.float_op]}"
               f"{', a training step' if training else ''})"]
    side_a, side_b = (_step_of(a, x), _step_of(b, x)) if training else (a, b)
    run = (lambda side, model, inputs, at: _run_step(side, model, inputs, at)) if training else _run
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled = tt.compile(side_a, (x,))
        tally.programs += 1
        try:
            for call in range(calls):
                name = rng.choice(list(MUTATIONS)) if rng.random() < 0.7 else "nothing"  # also calls that replay
                x = MUTATIONS[name](a, b, rng, x)
                history.append(name)
                replayed = compiled.replayed
                try:
                    with contextlib.redirect_stdout(io.StringIO()) as printed:
                        got = run(compiled, a, x, seed + call)
                except Exception as error:  # noqa: BLE001 - any error the eager side does not raise is a failure
                    if not _eager_raises_too(error, lambda: run(side_b, b, x, seed + call)):
                        tally.failures.append(" -> ".join(history) + "\n" + traceback.format_exc(limit=3))
                    return
                with contextlib.redirect_stdout(io.StringIO()) as printed_eager:
                    expected = run(side_b, b, x, seed + call)
                tally.calls += 1
                tally.replays += compiled.replayed > replayed
                outputs = [got[0], *got[1]], [expected[0], *expected[1]]
                if len(outputs[0]) != len(outputs[1]) or not all(map(_close, *outputs)):
                    tally.failures.append(" -> ".join(history) + ": compiled differs from eager")
                    return
                if printed.getvalue() != printed_eager.getvalue() or len(a.log) != len(b.log) or not all(
                        p == q or abs(p - q) <= 1e-6 * (1 + abs(q)) or (math.isnan(p) and math.isnan(q))
                        for p, q in zip(a.log, b.log)):
                    tally.failures.append(" -> ".join(history) + ": a side effect differs from eager's")
                    return
        finally:
            torch.set_anomaly_enabled(False)


def fuzz(seed: int = CI_SEED, programs: Optional[int] = CI_PROGRAMS, seconds: Optional[float] = None,
         calls: int = CALLS) -> Tally:
    """Run `programs` programs from `seed` on (or, with `seconds`, as many as fit in that time)."""
    tally = Tally()
    deadline = time.monotonic() + seconds if seconds else None
    index = 0
    while (programs is None or index < programs) and (deadline is None or time.monotonic() < deadline):
        run_program(seed + index, calls, tally)
        index += 1
    return tally
