"""Run a fuzz program on tracers and under torch autograd (float64) and compare everything observable."""
import contextlib
import re
import time
import warnings
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch

import torchtrace as tt
from torchtrace.coverage import is_refusal

from .generator import CI_FEATURES, FEATURES, generate
from .program import Program

RTOL, ATOL = 1e-6, 1e-9
OK, REFUSED, STRICTER, LENIENT, BOTH_RAISED, FAIL = "ok", "refused", "stricter", "lenient", "both raised", "FAIL"
# A difference in a program whose values or gradients (torch's) hold a NaN or an infinity: counted apart while the
# NaN/inf conventions of the rules are audited (KNOWN_CORE_BUGS["nan_inf"]); with that feature on, it fails.
NONFINITE = "nan/inf edge"
# torchtrace's saved-tensor version check fires where torch's does not when a rule saves more than torch does
# (e.g. its output): a clear error, not a silent gradient, counted apart so the rules can be slimmed.
STRICTER_MARKERS = ("for backward was modified by an in-place operation",)
# torch refuses when a tensor its node saved (often the output of an in-place op: y.exp_(); y.mul_(2)) is changed
# in place; torchtrace records an in-place op on a copy of the old value, so its saved tensors are untouched and it
# goes on (its own saved tensors are version-checked). Counted, not failed; the gradient is then not compared.
# The same for torch's refusal to rebase a view of a multi-output view op (unbind, split) after an in-place change.
LENIENT_MARKERS = ("needed for gradient computation has been modified by an inplace operation",
                   "This view is the output of a function that returns multiple views")


class Disagreement(AssertionError):
    """torchtrace and torch autograd disagree on a program."""


@dataclass
class Outcome:
    status: str
    detail: str = ""


def cotangent(shape: Sequence[int]) -> torch.Tensor:
    """A fixed, uneven gradient for an output (-0.5, 0.5, 1.5, -0.5, ...), so every element counts."""
    n = 1
    for s in shape:
        n *= s
    return (torch.arange(n, dtype=torch.float64) % 3 - 0.5).reshape(tuple(shape))


def _plain(t: Any) -> Any:
    if not isinstance(t, torch.Tensor):
        return t
    with torch._C.DisableTorchFunctionSubclass():
        return t.detach().clone().as_subclass(torch.Tensor)


def _observe(program: Callable, inputs: Sequence[torch.Tensor], leaf: Callable, backward: Callable,
             second: Callable, double: bool) -> Dict[str, Any]:
    """Everything the comparison looks at, from one side."""
    xs = [leaf(x) for x in inputs]
    outs, retained = program(*xs)
    seen: Dict[str, Any] = {f"output {i}": _plain(o) for i, o in enumerate(outs)}
    seen.update({f"output {i} requires_grad": bool(o.requires_grad) for i, o in enumerate(outs)})
    live = [o for o in outs if o.requires_grad]
    if live:
        backward(live, [cotangent(o.shape) for o in live], double)
    seen.update({f"grad of input {i}": _plain(x.grad) for i, x in enumerate(xs)})
    seen.update({f"retained grad {i}": _plain(r.grad) for i, r in enumerate(retained)})
    if double:
        firsts = [x.grad for x in xs]
        terms = [(g * cotangent(g.shape)).sum() for g in firsts if g is not None and g.requires_grad]
        results = second(sum(terms), xs) if terms else [None] * len(xs)
        seen.update({f"second derivative of input {i}": _plain(g) for i, g in enumerate(results)})
    return seen


@contextlib.contextmanager
def _torch_retain_grad_reads_grad_fn() -> Iterator[None]:
    """torch's retain_grad() on a view whose base was changed in place (`t0 = x.detach(); t1 = t0[0]; t0.sub_(w);
    t1.retain_grad()`) leaves t1.grad None after backward unless t1.grad_fn was read first, which brings the view's
    grad_fn up to date: torch's own gradient then flows (torch 2.13; torchtrace gives that gradient). The torch side
    reads grad_fn before each retain_grad, as any later use of the view does."""
    original = torch.Tensor.retain_grad

    def retain_grad(self: torch.Tensor) -> None:
        self.grad_fn  # noqa: B018 (the read brings a view's grad_fn up to date)
        original(self)

    torch.Tensor.retain_grad = retain_grad
    try:
        yield
    finally:
        torch.Tensor.retain_grad = original


def _torch_backward(outs: list, grads: list, double: bool) -> None:
    torch.autograd.backward(outs, grads, create_graph=double)


def _torch_second(total: torch.Tensor, xs: list) -> list:
    return list(torch.autograd.grad(total, xs, allow_unused=True))


def _tt_backward(outs: list, grads: list, double: bool) -> None:
    tt.backward(outs, grads, create_graph=double)


def _tt_second(total: torch.Tensor, xs: list) -> list:
    return list(tt.grad(total, xs, allow_unused=True))


def _torch_leaf(x: torch.Tensor) -> torch.Tensor:
    return x.clone().requires_grad_(True)


def _tt_leaf(x: torch.Tensor) -> torch.Tensor:
    return tt.tracer(x.clone(), requires_grad=True)


def _first_difference(ours: Dict[str, Any], theirs: Dict[str, Any]) -> Tuple[Optional[str], bool]:
    """The first observation that differs (a gradient that is None on one side counts as zeros), and whether a NaN
    or an infinity is among the differing elements. Tolerance: rtol 1e-6 plus 1e-6 of the tensor's largest
    finite magnitude (gradients of ill-conditioned programs differ in their last digits)."""
    for key, b in theirs.items():
        a = ours.get(key)
        if not isinstance(b, torch.Tensor) and not isinstance(a, torch.Tensor):
            if a != b:
                return f"{key}: torchtrace {a}, torch {b}", False
            continue
        a = torch.zeros_like(b) if a is None else a
        b = torch.zeros_like(a) if b is None else b
        if a.shape != b.shape:
            return f"{key}: shape {tuple(a.shape)}, torch {tuple(b.shape)}", False
        a = a.to(b.dtype)
        finite = b[torch.isfinite(b)]
        atol = ATOL + RTOL * (finite.abs().max().item() if finite.numel() else 0.0)
        close = torch.isclose(a, b, rtol=RTOL, atol=atol, equal_nan=True)
        if not bool(close.all()):
            wrong = ~close
            nonfinite = not bool(torch.isfinite(a[wrong]).all() and torch.isfinite(b[wrong]).all())
            return f"{key} differs:\n  torchtrace {_short(a)}\n  torch      {_short(b)}", nonfinite
    return None, False


def _short(t: Any) -> str:
    if not isinstance(t, torch.Tensor):
        return repr(t)
    return repr(t.tolist()) if t.numel() <= 12 else f"tensor of shape {tuple(t.shape)}"


def _nonfinite(inputs: Sequence[torch.Tensor], seen: Dict[str, Any]) -> bool:
    """A NaN or an infinity among the values -- or a magnitude past 1e6, where the program is so ill-conditioned
    (1 / sin(x) near x = pi, ...) that rounding differences between equally right formulas show."""
    values = list(inputs) + [v for v in seen.values() if isinstance(v, torch.Tensor) and v.is_floating_point()]
    return any(not bool((torch.isfinite(v) & (v.abs() < 1e6)).all()) for v in values)


def compare(program: Callable, inputs: Sequence[torch.Tensor], double: bool = False,
            strict_nonfinite: bool = True) -> Outcome:
    """Run on both sides. OK, REFUSED (a clear torchtrace refusal), BOTH_RAISED, or FAIL with the first difference."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            with _torch_retain_grad_reads_grad_fn():
                theirs = _observe(program, inputs, _torch_leaf, _torch_backward, _torch_second, double)
            torch_error = None
        except Exception as exc:
            theirs, torch_error = None, exc
        try:
            ours = _observe(program, inputs, _tt_leaf, _tt_backward, _tt_second, double)
            tt_error = None
        except Exception as exc:
            ours, tt_error = None, exc
    if torch_error is not None:
        if tt_error is not None:
            return Outcome(BOTH_RAISED, f"{type(torch_error).__name__} / {type(tt_error).__name__}")
        if any(marker in str(torch_error) for marker in LENIENT_MARKERS):
            return Outcome(LENIENT, f"torch refuses an in-place change ({_line(torch_error)[:60]}...)")
        return Outcome(FAIL, f"torch raised {type(torch_error).__name__}: {_line(torch_error)}; torchtrace did not")
    if tt_error is not None:
        if is_refusal(tt_error):
            return Outcome(REFUSED, f"{type(tt_error).__name__}: {_line(tt_error)}")
        if isinstance(tt_error, RuntimeError) and any(marker in str(tt_error) for marker in STRICTER_MARKERS):
            return Outcome(STRICTER, _line(tt_error).split(" for backward")[0].split(" was modified")[0])
        return Outcome(FAIL, f"torchtrace raised {type(tt_error).__name__}: {_line(tt_error)}; torch did not")
    difference, nonfinite = _first_difference(ours, theirs)
    if difference and not strict_nonfinite and (nonfinite or _nonfinite(inputs, theirs)):
        return Outcome(NONFINITE, difference.split(":")[0].split(" differs")[0])
    return Outcome(FAIL, difference) if difference else Outcome(OK)


def _line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else ""


def assert_same(program: Callable, inputs: Sequence[torch.Tensor], double: bool = False) -> None:
    """The check a printed fuzz program runs: torchtrace matches torch autograd, or refuses clearly."""
    outcome = compare(program, inputs, double)
    if outcome.status == FAIL:
        raise Disagreement(outcome.detail)


def run_program(p: Program) -> Outcome:
    return compare(p.function(), [v for _, v in p.inputs], p.double, strict_nonfinite=p.strict_nonfinite)


def shrink(p: Program, outcome: Outcome) -> Tuple[Program, Outcome]:
    """Drop statements one at a time while the program still fails the same way."""
    kind = _kind(outcome)
    changed = True
    while changed:
        changed = False
        for i in reversed(range(len(p.lines))):
            candidate = p.without(i)
            try:
                result = run_program(candidate)
            except Exception:
                continue
            if result.status == FAIL and _kind(result) == kind:
                p, outcome, changed = candidate, result, True
                break
    if p.double:
        single = Program(p.inputs, p.lines, p.outputs, p.retained, False, p.strict_nonfinite)
        result = run_program(single)
        if result.status == FAIL:
            p = single
    p = p.without_unused_inputs()
    return p, run_program(p)


def _kind(outcome: Outcome) -> str:
    """What failed, without positions: 'output N', 'grad of input N', 'torch raised RuntimeError', ..."""
    return re.sub(r"\d+", "N", outcome.detail.split(":")[0].split(" differs")[0])


@dataclass
class Tally:
    """Counts over a fuzz run; failures keep the shrunk program and its source."""

    counts: Counter = field(default_factory=Counter)
    refusals: Counter = field(default_factory=Counter)
    failures: List[Tuple[int, Program, Outcome]] = field(default_factory=list)

    def add(self, seed: int, p: Program, outcome: Outcome, minimize: bool = True) -> None:
        self.counts[outcome.status] += 1
        if outcome.status in (REFUSED, STRICTER, LENIENT, NONFINITE):
            self.refusals[f"{outcome.status}: {outcome.detail[:110]}"] += 1
        if outcome.status == FAIL:
            if minimize:
                p, outcome = shrink(p, outcome)
            self.failures.append((seed, p, outcome))

    def summary(self) -> str:
        total = sum(self.counts.values())
        parts = [f"{total} programs: " + ", ".join(f"{k} {v}" for k, v in sorted(self.counts.items()))]
        if self.refusals:
            parts.append("refusals:")
            parts += [f"  {n:5d}  {reason}" for reason, n in self.refusals.most_common()]
        return "\n".join(parts)


def report(seed: int, p: Program, outcome: Outcome) -> str:
    """A failure as readable, pasteable Python."""
    return f"# DISAGREEMENT (seed {seed}): {outcome.detail}\n{p.source()}\n"


CI_PROGRAMS, CI_SEED = 300, 0


def fuzz(seed: int, count: Optional[int], minutes: Optional[float], known_bugs: bool, quiet: bool = False) -> Tally:
    """Draw programs from seed, seed + 1, ... until `count` programs or `minutes` have passed."""
    features = FEATURES if known_bugs else CI_FEATURES
    tally = Tally()
    deadline = time.monotonic() + 60 * minutes if minutes else None
    n = 0
    while (count is None or n < count) and (deadline is None or time.monotonic() < deadline):
        program = generate(seed + n, features)
        before = len(tally.failures)
        tally.add(seed + n, program, run_program(program))
        if len(tally.failures) > before and not quiet:
            print(report(*tally.failures[-1]), flush=True)
        n += 1
    return tally
