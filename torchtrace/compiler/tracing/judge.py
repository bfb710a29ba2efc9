"""Trace one call of a rule three times and decide whether the record is straight-line code for every call of the
same layout (clean), or why not.

The three runs, each on fresh plain copies of the call's arguments, forward then backward (on random incoming
gradients), under a `RuleRecorder`:

1. with the call's own floats;
2. with each float a `SymbolicFloat` (`Var(i)`), which records arithmetic and refuses every way to steer Python;
3. with every float perturbed.

Clean: nothing was refused or raised, the three records make the same calls with the same arguments, every
symbolic float evaluates exactly to the number run 1 passed (and, with the perturbed floats, to the number run 3
passed), and every plain number is the same in all three runs (a float that left the record through C code, such
as `math.sqrt(p)`, is a plain number that changes in run 3).
"""
import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from torchtrace.autograd.node import Context
from torchtrace.compiler.tracing.recorder import Number, Refusal, RuleRecorder, Statement, TensorRef, short_name
from torchtrace.compiler.tracing.symbolic_float import Const, FloatSteering, SymbolicFloat, Var, steered

CLEAN = "clean"  # no float of the call reaches the backward
CLEAN_FLOATS = "clean, floats in arithmetic"  # the backward computes with the call's floats, never branches on them
BRANCHES = "branches or reads"  # branches on a float, reads a tensor's values, or records what it cannot hold
ESCAPES = "float escapes"  # a float of the call leaves the record (float(), repr, C code such as math.sqrt)
CATEGORIES = (CLEAN, CLEAN_FLOATS, BRANCHES, ESCAPES)


@dataclass
class Trace:
    """What one run recorded: the call's arguments as templates (tensors `x0`, `x1`..., floats `Var(i)`), the
    statements of both halves, what each half returned, and the names of the incoming gradients."""

    rule: type
    args: Any
    kwargs: Any
    floats: List[float]
    statements: List[Statement]
    mask: int  # bit i set: argument i needs a gradient (the trace holds for this ctx.needs_input_grad only)
    forward_result: Any = None
    gradients: List[Optional[str]] = field(default_factory=list)
    backward_result: Any = None
    # what the forward left in its Context, as templates (a tensor the record does not know: UNKNOWN): where the
    # backward finds each tensor it reads, when the code runs on a Context the rule's own forward filled
    ctx_saved: Any = ()
    ctx_attributes: Any = field(default_factory=dict)
    # the shape and dtype of each named tensor once the backward returned (of the call's layout: the same on every
    # call the trace serves, whose arguments and incoming gradients have the recorded shapes and dtypes)
    metas: Dict[str, Tuple[torch.Size, torch.dtype]] = field(default_factory=dict)


@dataclass
class Verdict:
    """The judgement of one call of a rule: its category, why (for an unclean one), and the symbolic run's trace."""

    rule: type
    category: str
    reason: str = ""
    trace: Optional[Trace] = None

    @property
    def clean(self) -> bool:
        return self.category in (CLEAN, CLEAN_FLOATS)


def perturb(x: float) -> float:
    """A nearby float, inside [0, 1] when x is (a probability stays one), never equal to x unless infinite."""
    return x * (1 - 2 ** -6) + 2 ** -9


def _floats(tree: Any) -> List[float]:
    if isinstance(tree, float):
        return [tree]
    if isinstance(tree, (list, tuple)) and not isinstance(tree, torch.Size):
        return [f for item in tree for f in _floats(item)]
    if isinstance(tree, dict):
        return [f for item in tree.values() for f in _floats(item)]
    return []


def _tensors(tree: Any) -> List[torch.Tensor]:
    if isinstance(tree, torch.Tensor):
        return [tree]
    if isinstance(tree, (list, tuple)) and not isinstance(tree, torch.Size):
        return [t for item in tree for t in _tensors(item)]
    if isinstance(tree, dict):
        return [t for item in tree.values() for t in _tensors(item)]
    return []


def call_values(args: tuple, kwargs: dict) -> Tuple[List[torch.Tensor], List[float]]:
    """A call's tensors and floats in the order a trace names them: tensor i is `x{i}`, float i is `f{i}`."""
    return _tensors((tuple(args), dict(kwargs))), _floats((tuple(args), dict(kwargs)))


def _copy(tree: Any, numbers: List[float], recorder: RuleRecorder, names: List[int]) -> Any:
    """Fresh plain copies of the arguments, declared to the recorder as x0, x1...; the floats taken from `numbers`
    in order. `names` counts the tensors seen (one name per position, even where a tensor is passed twice)."""
    if isinstance(tree, torch.Tensor):
        copy = tree.detach().clone()
        names.append(0)
        recorder.declare(copy, f"x{len(names) - 1}")
        return copy
    if isinstance(tree, float):
        return numbers.pop(0)
    if isinstance(tree, list):
        return [_copy(item, numbers, recorder, names) for item in tree]
    if isinstance(tree, tuple) and not isinstance(tree, torch.Size):
        items = [_copy(item, numbers, recorder, names) for item in tree]
        return type(tree)(*items) if hasattr(type(tree), "_fields") else type(tree)(items)
    if isinstance(tree, dict):
        return {k: _copy(v, numbers, recorder, names) for k, v in tree.items()}
    return tree


def incoming(out: Any, seed: int) -> List[Optional[torch.Tensor]]:
    """One gradient per output, as the engine passes them: random for a floating output, zeros for another tensor
    (no gradient reaches it), None where the output is not a tensor."""
    generator = torch.Generator().manual_seed(seed)
    outputs = [out] if isinstance(out, torch.Tensor) else list(out) if isinstance(out, (list, tuple)) else [out]

    def gradient(o: Any) -> Optional[torch.Tensor]:
        if not isinstance(o, torch.Tensor):
            return None
        if o.is_floating_point() or o.is_complex():
            return torch.randn(o.shape, generator=generator, dtype=o.dtype).to(o.device)
        return torch.zeros(o.shape, dtype=o.dtype, device=o.device)

    return [gradient(o) for o in outputs]


def run_rule_recorded(rule: type, args: tuple, kwargs: dict, mask: int, numbers: List[Any],
                      seed: int = 0) -> Tuple[Trace, RuleRecorder]:
    """Run `rule` forward then backward on copies of the arguments (floats replaced by `numbers`), recording. The
    incoming gradients come from a generator of their own (`seed`); a rule that draws random numbers draws them from
    torch's, which is not reseeded (the record holds no values: the runs agree whatever they draw)."""
    recorder = RuleRecorder()
    names: List[int] = []
    used, numbers = [float.__float__(n) for n in numbers], list(numbers)
    call_args = _copy(tuple(args), numbers, recorder, names)
    call_kwargs = _copy(dict(kwargs), numbers, recorder, names)
    trace = Trace(rule, recorder.template(call_args), recorder.template(call_kwargs),
                  used, recorder.statements, mask)
    ctx = Context(rule, (), mask)
    with recorder:
        out = rule.forward(ctx, *call_args, **call_kwargs)
    trace.forward_result = recorder.template(out)
    trace.ctx_saved = recorder.template(ctx._saved, strict=False)
    trace.ctx_attributes = {k: recorder.template(v, strict=False) for k, v in vars(ctx).items()}
    grads = incoming(out, seed + 1)
    trace.gradients = [None if g is None else recorder.declare(g, f"g{i}") for i, g in enumerate(grads)]
    recorder.phase = "backward"
    with torch.no_grad(), recorder:
        result = rule.backward(ctx, *grads)
    trace.backward_result = recorder.template(result)
    trace.metas = recorder.metas()
    return trace, recorder


def trace_rule(rule: type, args: tuple, kwargs: dict, mask: int, seed: int = 0) -> Verdict:
    """Judge one call of `rule` (its arguments as the engine hands them to forward; `mask`: bit i set when argument
    i needs a gradient). Never raises for what the rule does; the verdict says it."""
    try:
        return _judged(rule, args, kwargs, mask, seed)
    finally:  # a refusal kept in the thread's list holds, by its traceback, every frame of the call being recorded
        steered().clear()  # (the user's step, its activations and saved tensors) until the next rule is judged


def _judged(rule: type, args: tuple, kwargs: dict, mask: int, seed: int) -> Verdict:
    floats = _floats((args, kwargs))
    runs: List[Trace] = []
    for label, numbers in (("", floats),
                           ("symbolic floats: ", [SymbolicFloat(f, Var(i)) for i, f in enumerate(floats)]),
                           ("perturbed floats: ", [perturb(f) for f in floats])):
        steered().clear()
        recorder: Optional[RuleRecorder] = None
        try:
            trace, recorder = run_rule_recorded(rule, args, kwargs, mask, numbers, seed)
        except FloatSteering as exc:
            return _steered(rule, exc)
        except Refusal as exc:
            return Verdict(rule, BRANCHES, f"{exc.kind}: {exc.what}")
        except Exception as exc:  # the rule itself failed on these arguments (or the perturbed floats)
            if steered():
                return _steered(rule, steered()[0])
            return Verdict(rule, BRANCHES, f"{label}the rule raised {type(exc).__name__}: {_first_line(exc)}")
        if steered():
            return _steered(rule, steered()[0])
        if recorder.refusals:
            first = recorder.refusals[0]
            return Verdict(rule, BRANCHES, f"{first.kind}: {first.what} (the rule caught the refusal)")
        runs.append(trace)
    difference = _difference(*runs)
    if difference:
        return Verdict(rule, difference[0], difference[1], runs[1])
    symbolic = runs[1]
    in_backward = any(_symbolic(s.args) or _symbolic(s.kwargs) for s in symbolic.statements if s.phase == "backward")
    return Verdict(rule, CLEAN_FLOATS if in_backward or _symbolic(symbolic.backward_result) else CLEAN, "", symbolic)


def fixed_float_trace(rule: type, args: tuple, kwargs: dict, mask: int, verdict: Verdict) -> Optional[Trace]:
    """For a call whose rule branches on one of its floats or lets one escape: its trace with the floats as the
    constants they were (code that holds while they are the same), or None when that record is refused too (the
    rule reads a tensor's values) or the call has no float."""
    floats = _floats((args, kwargs))
    if not floats or verdict.category not in (BRANCHES, ESCAPES) or "float" not in verdict.reason:
        return None
    try:
        trace, recorder = run_rule_recorded(rule, args, kwargs, mask, list(floats))
    except Exception:
        return None
    return None if recorder.refusals else trace


def _steered(rule: type, exc: FloatSteering) -> Verdict:
    if exc.escapes:
        return Verdict(rule, ESCAPES, f"a float of the call leaves the record: {exc.what}")
    return Verdict(rule, BRANCHES, f"branches on a float of the call: {exc.what}")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else ""


def _symbolic(tree: Any) -> bool:
    if isinstance(tree, Number):
        return not isinstance(tree.expression, Const)
    if isinstance(tree, (list, tuple)) and not isinstance(tree, (TensorRef, torch.Size)):
        return any(_symbolic(item) for item in tree)
    if isinstance(tree, dict):
        return any(_symbolic(item) for item in tree.values())
    return False


def _same_number(x: Any, y: Any) -> bool:
    if isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y):
        return True
    return type(x) is type(y) and x == y and (not isinstance(x, float) or math.copysign(1, x) == math.copysign(1, y))


def _difference(concrete: Trace, symbolic: Trace, perturbed: Trace) -> Optional[Tuple[str, str]]:
    """(category, reason) of the first way the three runs disagree, None when they agree as a clean trace must."""
    if not (len(concrete.statements) == len(symbolic.statements) == len(perturbed.statements)):
        return BRANCHES, (f"the calls differ between runs ({len(concrete.statements)} calls, "
                          f"{len(perturbed.statements)} with the floats perturbed)")
    values = (concrete.floats, perturbed.floats)
    for a, b, c in zip(concrete.statements, symbolic.statements, perturbed.statements):
        where = f"{a.phase} {short_name(a.func)}"
        if not (a.kind == b.kind == c.kind and a.phase == b.phase == c.phase and a.func == b.func == c.func):
            return BRANCHES, f"the calls differ between runs at {where} (with perturbed floats: {short_name(c.func)})"
        if a.kind == "read" and not (_equal(a.value, b.value) and _equal(a.value, c.value)):
            return BRANCHES, (f"{where} reads {a.value!r}, and {c.value!r} when the floats change: a float of the "
                              "call decides a layout")
        found = _template_difference((a.args, a.kwargs, a.outputs), (b.args, b.kwargs, b.outputs),
                                     (c.args, c.kwargs, c.outputs), values)
        if found:
            return found[0], f"{found[1]} at {where}"
    found = _template_difference(
        (concrete.forward_result, concrete.gradients, concrete.backward_result),
        (symbolic.forward_result, symbolic.gradients, symbolic.backward_result),
        (perturbed.forward_result, perturbed.gradients, perturbed.backward_result), values)
    return (found[0], f"{found[1]} in what the rule returns") if found else None


def _equal(x: Any, y: Any) -> bool:
    try:
        return bool(type(x) is type(y) and x == y)
    except Exception:
        return False


def _template_difference(a: Any, b: Any, c: Any, values: Sequence[List[float]]) -> Optional[Tuple[str, str]]:
    if isinstance(b, Number):
        if not (isinstance(a, Number) and isinstance(c, Number)):
            return BRANCHES, "a number differs between runs"
        expected = (a.expression.evaluate(()), c.expression.evaluate(()))
        for floats, want in zip(values, expected):
            if not _same_number(b.expression.evaluate(floats), want):
                if isinstance(b.expression, Const):
                    return ESCAPES, (f"a number computed from the call's floats outside the record (through C code, "
                                     f"such as math.sqrt) is {float.__repr__(float(want))} when they change")
                return ESCAPES, "a symbolic float does not evaluate to the number passed"
        return None
    if isinstance(b, TensorRef) or not isinstance(b, (list, tuple, dict)) or isinstance(b, torch.Size):
        return None if _equal(a, b) and _equal(a, c) else (BRANCHES, f"an argument differs between runs ({a!r})")
    if type(a) is not type(b) or type(c) is not type(b) or len(a) != len(b) or len(c) != len(b):
        return BRANCHES, "an argument's structure differs between runs"
    items = zip(a.values(), b.values(), c.values()) if isinstance(b, dict) else zip(a, b, c)
    if isinstance(b, dict) and not (list(a) == list(b) == list(c)):
        return BRANCHES, "keyword arguments differ between runs"
    for x, y, z in items:
        found = _template_difference(x, y, z, values)
        if found:
            return found
    return None
