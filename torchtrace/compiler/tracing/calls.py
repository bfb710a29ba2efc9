"""Real calls of the registered rules, from PyTorch's OpInfo samples: each sample runs once on tracers, and every
node it records gives its rule, the arguments its forward received (as plain copies) and which needed a gradient."""
import warnings
from typing import Any, Callable, Dict, Iterable, List, NamedTuple, Optional

import torch

from torchtrace.autograd.plain import plain_torch
from torchtrace.autograd.state import observing
from torchtrace.coverage import _copies, _run, _tt_leaf, judged_ops, op_key, samples


class RuleCall(NamedTuple):
    """One recorded call: rule.forward(ctx, *args, **kwargs) with ctx.needs_input_grad from `mask`."""

    rule: type
    func: Any
    args: tuple
    kwargs: dict
    mask: int
    source: str  # the OpInfo entry whose sample made it


def _plain_copy(tree: Any) -> Any:
    if isinstance(tree, torch.Tensor):
        with plain_torch():
            return tree.detach().as_subclass(torch.Tensor).clone()
    if isinstance(tree, list):
        return [_plain_copy(item) for item in tree]
    if isinstance(tree, tuple) and not isinstance(tree, torch.Size):
        items = [_plain_copy(item) for item in tree]
        return type(tree)(*items) if hasattr(type(tree), "_fields") else type(tree)(items)
    if isinstance(tree, dict):
        return {k: _plain_copy(v) for k, v in tree.items()}
    return tree


def _as_call(node: Any, args: tuple, kwargs: dict, source: str) -> Optional[RuleCall]:
    """What an on_record observer sees, as a RuleCall (None for a Function.apply: it has no torch callable)."""
    if node.func is None:
        return None
    return RuleCall(node.rule, node.func, _plain_copy(args), _plain_copy(kwargs), node.ctx._mask, source)


def calls_of(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> List[RuleCall]:
    """The rule calls `fn(*args, **kwargs)` records, in order (make the arguments tracers that require grad)."""
    order: List[RuleCall] = []

    def collect(node: Any, call_args: tuple, call_kwargs: dict, result: Any) -> None:
        call = _as_call(node, call_args, call_kwargs, getattr(fn, "__name__", "fn"))
        if call is not None:
            order.append(call)

    with observing(on_record=collect):
        fn(*args, **kwargs)
    return order


def rule_calls(only: Optional[Iterable[str]] = None, per_op: int = 2, per_rule: int = 2) -> Dict[type, List[RuleCall]]:
    """rule -> its calls from the first `per_op` samples of each OpInfo entry (or of those named in `only`, by name or
    name.variant), run in their function form: up to `per_rule` calls of a rule from each entry."""
    wanted = set(only) if only is not None else None
    found: Dict[type, List[RuleCall]] = {}
    for op in judged_ops():
        name = op_key(op)
        if wanted is not None and name not in wanted and op.name not in wanted:
            continue

        def collect(node: Any, args: tuple, kwargs: dict, result: Any, source: str = name) -> None:
            calls = found.setdefault(node.rule, [])
            from_here = sum(c.source == source for c in calls)
            call = _as_call(node, args, kwargs, source) if from_here < per_rule else None
            if call is not None:
                calls.append(call)

        try:
            sample_list = list(samples(op, per_op))
        except Exception:  # the entry cannot make samples here: no calls from it
            continue
        for sample in sample_list:
            try:
                inp, args, kwargs, _ = _copies(sample, _tt_leaf)
                with warnings.catch_warnings(), observing(on_record=collect):
                    warnings.simplefilter("ignore")
                    _run(lambda x, *a, **k: op.gradcheck_wrapper(op.op, x, *a, **k), inp, args, kwargs, sample)
            except Exception:  # refused or rejected on tracers: whatever it recorded before still counts
                continue
    return found
