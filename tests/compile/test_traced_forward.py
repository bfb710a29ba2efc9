"""A clean statement's traced forward (what replay runs instead of the rule's forward) against the rule's forward, on
calls from OpInfo samples: the same result bits, the same Context (saved tensors by role, their versions,
every attribute), on new inputs and new floats."""
from typing import Any, List

import pytest
import torch
from test_symbolic_differential import FAMILIES

from torchtrace.autograd.node import Context
from torchtrace.compiler.ir import describe
from torchtrace.compiler.step_code import StepCode, step_code
from torchtrace.compiler.tracing.calls import rule_calls
from torchtrace.compiler.tracing.judge import perturb


def _fresh(tree: Any, seed: List[int]) -> Any:
    """New values of the same layout: float tensors moved by ~1%, floats perturbed (the trace holds for any)."""
    if isinstance(tree, torch.Tensor):
        copy = torch.empty_strided(tree.shape, tree.stride(), dtype=tree.dtype, device=tree.device)
        copy.copy_(tree)
        if copy.is_floating_point():
            seed[0] += 1
            noise = torch.randn(tree.shape, generator=torch.Generator().manual_seed(seed[0]), dtype=tree.dtype)
            copy.add_(noise * 0.01)
        return copy
    if isinstance(tree, float):
        return perturb(tree)
    if isinstance(tree, (list, tuple)) and not isinstance(tree, torch.Size):
        return type(tree)(_fresh(item, seed) for item in tree)
    return tree


def _same(a: Any, b: Any, roles: dict) -> bool:
    """Equal values; a tensor of one run plays the same role (argument i, the result) as its twin in the other."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and roles.get(id(a), "made") == roles.get(id(b), "made") and \
            a.shape == b.shape and a.dtype == b.dtype and torch.equal(torch.nan_to_num(a), torch.nan_to_num(b))
    if isinstance(a, (list, tuple)) and not isinstance(a, torch.Size):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y, roles) for x, y in zip(a, b))
    if isinstance(a, dict):
        return type(b) is dict and a.keys() == b.keys() and all(_same(a[k], b[k], roles) for k in a)
    if isinstance(a, float) and a != a:
        return isinstance(b, float) and b != b
    return type(a) is type(b) and a == b


def _run(forward: Any, rule: type, mask: int, args: tuple) -> tuple:
    ctx = Context(rule, (), mask)
    out = forward(ctx, *args)
    return out, ctx


# OpInfo calls conv2d with keywords (replay moves them to positions first); sort has two results (the rule's forward
# runs: it returns torch's named tuple)
POSITIONAL = sorted(set(FAMILIES) - {"conv", "sorting"})


@pytest.mark.parametrize("family", POSITIONAL)
def test_traced_forward_leaves_the_rules_context(family):
    calls = rule_calls([e for e in FAMILIES[family]], per_op=3, per_rule=3)
    compared = 0
    for rule, found in calls.items():
        for n, call in enumerate(found):
            code = step_code(rule, describe(call.args, call.kwargs)[0], call.mask, call.args, call.kwargs)
            if not isinstance(code, StepCode) or code.forward is None:
                continue
            fresh = _fresh(call.args, [n])  # (its tensors' versions moved: each run gets clones)
            args, twin = (tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in fresh) for _ in range(2))
            theirs, their_ctx = _run(rule.forward, rule, call.mask, args)
            ours, our_ctx = _run(code.forward, rule, call.mask, twin)
            roles = {id(a): f"argument {i}" for i, a in enumerate(args) if isinstance(a, torch.Tensor)}
            roles.update({id(a): f"argument {i}" for i, a in enumerate(twin) if isinstance(a, torch.Tensor)})
            roles[id(theirs)], roles[id(ours)] = "result", "result"
            where = f"{rule.__name__} ({call.source}):\n{code.forward_source}"
            assert _same(theirs, ours, roles), f"{where}: results differ"
            assert _same(their_ctx._saved, our_ctx._saved, roles), f"{where}: saved tensors differ"
            assert their_ctx._versions == our_ctx._versions, f"{where}: saved versions differ"
            assert _same(vars(their_ctx), vars(our_ctx), roles), f"{where}: {vars(their_ctx)} != {vars(our_ctx)}"
            compared += 1
    assert compared, f"no {family} call has a traced forward"
