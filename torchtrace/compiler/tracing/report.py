"""`python -m torchtrace ops --compile`: every registered rule judged by symbolic tracing on the calls PyTorch's
OpInfo samples make, one line per unclean rule with its reason, and the count per category."""
import sys
from collections import Counter
from typing import Any, Dict, Iterable, List, Optional

from torchtrace.autograd.function import RULES
from torchtrace.compiler.tracing.calls import RuleCall, rule_calls
from torchtrace.compiler.tracing.differential import differs_from_rule, replay
from torchtrace.compiler.tracing.judge import CATEGORIES, CLEAN, CLEAN_FLOATS, Verdict, fixed_float_trace, trace_rule
from torchtrace.compiler.tracing.straight_line import straight_line
from torchtrace.coverage import judged_ops, op_key
from torchtrace.naming import callable_name
from torchtrace.ops.listing import rules

NOT_EXERCISED = "not exercised"  # no OpInfo sample made a call of this rule
CODE_DIFFERS = "code differs"  # clean, but its generated code did not reproduce the rule on new inputs (a defect here)


def _checked(call: RuleCall, verdict: Verdict) -> Verdict:
    """A clean verdict whose generated code, run on moved inputs, equals the rule bit for bit; else CODE_DIFFERS."""
    try:
        difference = differs_from_rule(replay(call, verdict))
    except Exception as exc:
        difference = f"raised {type(exc).__name__}: {str(exc).strip()[:200]}"
    return verdict if difference is None else Verdict(verdict.rule, CODE_DIFFERS, difference, verdict.trace)


def judge_rule(calls: List[RuleCall]) -> Verdict:
    """A rule is as clean as its least clean call: the first unclean verdict (naming its OpInfo entry), else clean,
    with floats in arithmetic when any call's backward computes with them. Every clean call's generated code is run
    against the rule on new inputs."""
    verdicts = [trace_rule(c.rule, c.args, c.kwargs, c.mask) for c in calls]
    verdicts = [_checked(c, v) if v.clean else v for c, v in zip(calls, verdicts)]
    for call, verdict in zip(calls, verdicts):
        if not verdict.clean:
            fixed = fixed_float_trace(call.rule, call.args, call.kwargs, call.mask, verdict)
            verdict.reason = f"{verdict.reason} [{call.source}]" + (
                "; compiled: traced with its floats fixed, checked each call" if fixed is not None else "")
            return verdict
    floats = next((v for v in verdicts if v.category == CLEAN_FLOATS), None)
    return floats or verdicts[0]


def judge_all(only: Optional[Iterable[str]] = None, per_op: int = 3, per_rule: int = 4) -> Dict[type, Verdict]:
    """Every registered rule (refusals included) -> its verdict; a rule no sample calls: NOT_EXERCISED."""
    found = rule_calls(only, per_op, per_rule)
    return {rule: judge_rule(found[rule]) if found.get(rule) else Verdict(rule, NOT_EXERCISED)
            for rule in rules()}


def main(only: Optional[Iterable[str]] = None, per_op: int = 3, out: Any = None) -> Dict[type, Verdict]:
    """Print the unclean rules with their reasons, then the totals (clean counts only rules whose generated code
    reproduced the rule on every call tried)."""
    out = out or sys.stdout
    verdicts = judge_all(only, per_op)
    for verdict in sorted(verdicts.values(), key=lambda v: (v.category, v.rule.__name__)):
        if verdict.category not in (CLEAN, CLEAN_FLOATS, NOT_EXERCISED):
            print(f"{verdict.category:<18} {verdict.rule.__name__:<28} {verdict.reason}", file=out)
    floats = sorted(v.rule.__name__ for v in verdicts.values() if v.category == CLEAN_FLOATS)
    print(f"\n{CLEAN_FLOATS}: {', '.join(floats)}", file=out)
    counts = Counter(v.category for v in verdicts.values())
    exercised = len(verdicts) - counts[NOT_EXERCISED]
    parts = ", ".join(f"{category} {counts[category]}" for category in (*CATEGORIES, CODE_DIFFERS))
    print(f"\nrules: {len(verdicts)} registered, {exercised} exercised by OpInfo samples ({per_op} per entry) -- "
          f"{parts}; {NOT_EXERCISED} {counts[NOT_EXERCISED]}", file=out)
    fixed = sum("floats fixed" in v.reason for v in verdicts.values())
    print(f"of the unclean, {fixed} trace clean with their floats fixed (compiled code checks the floats each call; "
          "another value calls the rule)", file=out)
    return verdicts


def find_rule(name: str) -> type:
    """The registered rule called `name` (its class name, any case) or registered for the torch callable `name`."""
    for rule in rules():
        if rule.__name__.lower() == name.lower():
            return rule
    for func, rule in RULES.items():
        if callable_name(func) == name:
            return rule
    raise SystemExit(f"no registered rule is called {name!r} (the rule's class name, e.g. Mul, or a callable such as "
                     "torch.mul)")


def show_traced(name: str, out: Any = None) -> Optional[Verdict]:
    """Print the straight-line code traced from rule `name` on the first OpInfo call that gives a clean trace (or
    why none does); return that verdict."""
    out = out or sys.stdout
    rule = find_rule(name)
    spellings = {getattr(func, "__name__", "") for func, r in RULES.items() if r is rule}
    entries = [op_key(op) for op in judged_ops() if op.name.rsplit(".", 1)[-1] in spellings]
    calls = rule_calls(entries, per_op=3, per_rule=4).get(rule) if entries else None
    calls = calls or rule_calls(None, per_op=3, per_rule=1).get(rule)
    if not calls:
        print(f"{rule.__name__}: no OpInfo sample calls this rule, so there is no trace to show", file=out)
        return None
    verdicts = [trace_rule(c.rule, c.args, c.kwargs, c.mask) for c in calls]
    unclean = next(((c, v) for c, v in zip(calls, verdicts) if not v.clean), None)
    for call, verdict in zip(calls, verdicts):
        if verdict.clean:
            print(f"# {verdict.category}, traced on a call from OpInfo's {call.source}", file=out)
            if unclean:
                print(f"# not every call is clean: {unclean[1].category} -- {unclean[1].reason} [{unclean[0].source}]",
                      file=out)
            print(file=out)
            print(straight_line(verdict).source, file=out)
            return verdict
    print(f"{rule.__name__}: {verdicts[0].category} -- {verdicts[0].reason} [{calls[0].source}]", file=out)
    return verdicts[0]
