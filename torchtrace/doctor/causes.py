"""What the doctor sees at the op that made the first NaN or Inf, and the registry of causes read from it.

A cause is a function of one `AtOp` (the rule, its arguments, what it returned; in the backward also what it
saved and the gradient it received) that returns (what happened, what to change) when the values show that this
cause is the one, and None otherwise. Causes are tried in order: those registered for the rule first, then the
general ones of the phase (an overflow of the dtype's range, ...). Nothing is fixed per rule: every sentence is
computed from the values at the op, so one rule can be given different causes on different values.

    add_cause("forward", my_cause)              # tried for every rule, before the general ones
    add_cause("backward", my_cause, rule="Pow")  # tried first for Pow's backward
"""
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from torchtrace.doctor.values import all_finite, describe, tensors_in

Explained = Tuple[str, str]
INF_MADE_NAN = "turned an Inf of its inputs into NaN"  # what cause_of says when no cause explains a NaN from an Inf


@dataclass
class AtOp:
    """One op where a value stopped being finite.

    forward: `args`/`kwargs` as called (`named`: bound to the rule's parameter names where they bind), `result`
    its outputs. backward: `saved` what the rule saved (numbers included), `incoming` the gradients it received,
    `result` the gradients it sent, `ctx` the rule's context (eps, dims, options)."""

    rule: str
    phase: str
    args: tuple = ()
    kwargs: Dict[str, Any] = field(default_factory=dict)
    named: Dict[str, Any] = field(default_factory=dict)
    result: List[Any] = field(default_factory=list)
    saved: List[Any] = field(default_factory=list)
    incoming: List[Any] = field(default_factory=list)
    ctx: Any = None

    @property
    def inputs(self) -> List[torch.Tensor]:
        """The floating-point tensors the op read: the call's arguments, or what the rule saved."""
        return tensors_in([*self.args, *self.kwargs.values()]) if self.phase == "forward" else tensors_in(self.saved)

    @property
    def outputs(self) -> List[torch.Tensor]:
        return tensors_in(self.result)


def bind(forward: Callable, args: tuple, kwargs: dict) -> Dict[str, Any]:
    """The call's arguments by the names of a rule's forward (ctx left out); {} when they do not bind."""
    try:
        bound = inspect.signature(forward).bind(None, *args, **kwargs)
    except (TypeError, ValueError):
        return {}
    bound.apply_defaults()
    return dict(list(bound.arguments.items())[1:])


def at_forward(rule: type, args: tuple, kwargs: dict, result: Any) -> AtOp:
    outputs = list(result) if isinstance(result, (tuple, list)) else [result]
    return AtOp(rule.__name__, "forward", args, kwargs, bind(rule.forward, args, kwargs), outputs)


def at_backward(node: Any, grads: List[Any], result: tuple) -> AtOp:
    return AtOp(node.rule.__name__, "backward", result=list(result), saved=list(node.saved), incoming=list(grads),
                ctx=node.ctx)


Cause = Callable[[AtOp], Optional[Explained]]
BY_RULE: Dict[Tuple[str, str], List[Cause]] = {}  # (phase, rule name) -> causes tried first
GENERAL: Dict[str, List[Cause]] = {"forward": [], "backward": []}  # causes tried for every rule, in order


def add_cause(phase: str, cause: Cause, rule: Optional[str] = None, first: bool = False) -> Cause:
    """Register `cause` for `rule`'s `phase` ("forward" or "backward"), or for every rule when `rule` is None;
    `first` puts it before those registered already."""
    causes = BY_RULE.setdefault((phase, rule), []) if rule is not None else GENERAL[phase]
    causes.insert(0, cause) if first else causes.append(cause)
    return cause


def cause_of(at: AtOp) -> Explained:
    """The first registered cause that the values at the op show, or an account of the values themselves."""
    for cause in (*BY_RULE.get((at.phase, at.rule), ()), *GENERAL[at.phase]):
        found = cause(at)
        if found is not None:
            return found
    if at.phase == "forward":
        inputs = "; ".join(f"input {i}: {describe(t)}" for i, t in enumerate(at.inputs)) or "no tensor inputs"
        if not all_finite(at.inputs):  # NaN out of an Inf in: inf - inf, 0 * inf, inf / inf
            return (f"{at.rule} {INF_MADE_NAN} ({inputs})",
                    "find where that Inf came from (the finding before this one) and keep it out")
        return (f"{at.rule} gave a non-finite result from finite inputs ({inputs})",
                "compute this op in float64 on the same inputs to see whether it is an overflow or a singular point")
    shown = "; ".join(describe(t) for t in at.inputs) or "nothing saved"
    return (f"its gradient formula is not finite at the saved values ({shown})",
            "find which saved value sits at a singular point of the formula (0 in a denominator, a root or a log) "
            "and keep the forward away from it")
