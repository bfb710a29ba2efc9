"""The tangent table: each gradient rule's tangent (forward-mode) rule, keyed by the rule's name.

An entry reads like a `result:` line of PyTorch's derivatives.yaml: the rules it serves, the math
(ẏ = J ẋ, the Jacobian-vector product), and a function of the `Call`. The families live in the modules
named after them (`pointwise.py`, `shapes.py`, ...); importing this package fills the table. A user's
Function (tt.Function or torch's autograd.Function) that defines `jvp(ctx, *tangents)` has its own.
"""
from typing import Callable, Dict, Iterable, Optional

from torchtrace.autograd.function import INPLACE, RULES
from torchtrace.rule_math import rule_math

TangentRule = Callable[..., object]
TANGENTS: Dict[str, TangentRule] = {}  # rule name -> tangent rule
MATH: Dict[str, str] = {}  # rule name -> its tangent in one line of math
_OURS = ("torchtrace.ops", "torchtrace.nn", "torchtrace.autograd")


def declare(names: Iterable[str], math: str, rule: TangentRule) -> TangentRule:
    """Give every rule in `names` the tangent `rule` (documented by `math`)."""
    for name in names.split() if isinstance(names, str) else names:
        if name in TANGENTS:
            raise ValueError(f"{name} has two tangent rules")
        TANGENTS[name], MATH[name] = rule, math
    return rule


def tangent(names: str, math: str) -> Callable[[TangentRule], TangentRule]:
    """Decorator form of `declare`."""
    return lambda rule: declare(names, math, rule)


def tangent_rule(rule: type) -> Optional[TangentRule]:
    """The tangent rule of a gradient rule: torchtrace's own from the table, a user Function's `jvp`, or None."""
    if rule.__module__.startswith(_OURS):
        found = TANGENTS.get(rule.__name__)
        if found is not None:
            return found
    from torchtrace.forward.custom import user_jvp

    return user_jvp(rule)


def math_of(name: str) -> str:
    """The tangent of rule `name` in one line; "{gradient}" in a table entry stands for the rule's own math."""
    rule = our_rules().get(name)
    return MATH[name].replace("{gradient}", rule_math(rule) if rule is not None else "")


def our_rules() -> Dict[str, type]:
    """Every gradient rule torchtrace records, by name: the registered ones, those of in-place forms only
    (x[i] = v, F.dropout(x, inplace=True)), and the two that views use."""
    from torchtrace.autograd.views import ViewOfBase, WriteIntoView

    in_place = [getattr(rule, "inplace_rule", rule) for rule in RULES.values()]
    rules = [*RULES.values(), *in_place, *(rule for rule, _ in INPLACE.values()), ViewOfBase, WriteIntoView]
    return {rule.__name__: rule for rule in rules if rule.__module__.startswith(_OURS)}
