"""A clean trace's generated code against the rule it was traced from, on new inputs of the same layout.

`moved` makes the new inputs (each float tensor moved by about 1%, signs and domains kept; each float of the call
perturbed); `replay` runs the rule's own forward and backward and the generated `forward` and `backward` on them,
and `differs_from_rule` says where the two differ (bit for bit), or None.
"""
from typing import Any, List, NamedTuple, Optional, Tuple

import torch

from torchtrace.autograd.node import Context
from torchtrace.compiler.tracing.calls import RuleCall
from torchtrace.compiler.tracing.judge import Verdict, call_values, incoming, perturb
from torchtrace.compiler.tracing.straight_line import straight_line
from torchtrace.nested import flatten


def moved(tree: Any, generator: torch.Generator) -> Any:
    """New inputs of the same layout (strides included): float tensors times (1 + 0.01 noise), floats perturbed."""
    if isinstance(tree, torch.Tensor):
        if not tree.is_floating_point():
            return tree.clone()
        noise = torch.randn(tree.shape, generator=generator, dtype=tree.dtype)
        return torch.empty_strided(tree.shape, tree.stride(), dtype=tree.dtype).copy_(tree * (1 + 0.01 * noise))
    if isinstance(tree, float):
        return perturb(tree)
    if isinstance(tree, list):
        return [moved(item, generator) for item in tree]
    if isinstance(tree, tuple) and not isinstance(tree, torch.Size):
        items = [moved(item, generator) for item in tree]
        return type(tree)(*items) if hasattr(type(tree), "_fields") else type(tree)(items)
    if isinstance(tree, dict):
        return {k: moved(v, generator) for k, v in tree.items()}
    return tree


def copies(tree: Any) -> Any:
    """The same arguments with every tensor cloned (a run may change its arguments in place)."""
    if isinstance(tree, torch.Tensor):
        return tree.clone()
    if isinstance(tree, list):
        return [copies(item) for item in tree]
    if isinstance(tree, tuple) and not isinstance(tree, torch.Size):
        items = [copies(item) for item in tree]
        return type(tree)(*items) if hasattr(type(tree), "_fields") else type(tree)(items)
    if isinstance(tree, dict):
        return {k: copies(v) for k, v in tree.items()}
    return tree


def tensors_of(tree: Any) -> List[torch.Tensor]:
    return [t for t in flatten(tree)[0] if isinstance(t, torch.Tensor)] if tree is not None else []


def rule_run(call: RuleCall, args: tuple, kwargs: dict, seed: int = 0) -> Tuple[Any, list, Any]:
    """The rule itself on plain tensors: its forward's result, the incoming gradients, its backward's result."""
    ctx = Context(call.rule, (), call.mask)
    torch.manual_seed(seed)
    out = call.rule.forward(ctx, *args, **kwargs)
    grads = incoming(out, seed + 1)
    with torch.no_grad():
        return out, grads, call.rule.backward(ctx, *grads)


def _difference(ours: Any, theirs: Any) -> Optional[str]:
    a, b = tensors_of(ours), tensors_of(theirs)
    if len(a) != len(b):
        return f"{len(a)} tensors, the rule {len(b)}"
    for i, (x, y) in enumerate(zip(a, b)):
        if x.shape != y.shape or x.dtype != y.dtype:
            return f"tensor {i}: {tuple(x.shape)} {x.dtype}, the rule {tuple(y.shape)} {y.dtype}"
        if not torch.equal(x, y) and not (x.is_floating_point() and torch.equal(x.isnan(), y.isnan()) and
                                          torch.equal(x.nan_to_num(0), y.nan_to_num(0))):
            return f"tensor {i} differs"
    return None


class Replay(NamedTuple):
    """One comparison: the moved inputs and incoming gradients, then what the rule and the generated code gave."""

    args: tuple
    kwargs: dict
    grads: list
    rule_result: Any
    rule_gradients: Any
    result: Any
    gradients: Any


def replay(call: RuleCall, verdict: Verdict, seed: int = 0) -> Replay:
    """Run the rule and the generated code of its clean verdict on the same moved inputs."""
    code = straight_line(verdict)
    generator = torch.Generator().manual_seed(seed)
    args, kwargs = moved(call.args, generator), moved(call.kwargs, generator)
    rule_result, grads, rule_gradients = rule_run(call, copies(args), copies(kwargs), seed)
    tensors, floats = call_values(copies(args), copies(kwargs))
    torch.manual_seed(seed)
    result, saved = code.forward(*tensors, *floats)
    with torch.no_grad():
        gradients = code.backward(*saved, *(g for g in grads if g is not None), *floats)
    return Replay(args, kwargs, grads, rule_result, rule_gradients, result, gradients)


def differs_from_rule(run: Replay) -> Optional[str]:
    """Where the generated code differed from the rule (None: equal bit for bit, NaNs in the same places)."""
    forward = _difference(run.result, run.rule_result)
    if forward:
        return f"forward: {forward}"
    backward = _difference(run.gradients, run.rule_gradients)
    return f"backward: {backward}" if backward else None
