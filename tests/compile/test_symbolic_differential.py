"""A traced rule's straight-line code against the rule itself, family by family, on calls from OpInfo samples.

For every clean trace: the generated forward and backward, run on new inputs (each float tensor moved by ~1%, each
float of the call perturbed), must equal the rule's own forward and backward run on the same inputs, bit for bit.
Then the gradients are compared with torch autograd on the same call; where they differ, central finite differences
decide (the test fails unless they side with the traced code).
"""
from typing import Dict, List

import pytest
import torch
from references import finite_differences

from torchtrace.compiler.tracing import trace_rule
from torchtrace.compiler.tracing.calls import RuleCall, rule_calls
from torchtrace.compiler.tracing.differential import Replay, copies, differs_from_rule, replay, tensors_of

FAMILIES: Dict[str, List[str]] = {  # rule family (the file holding the rules) -> OpInfo entries that call them
    "arithmetic": ["mul", "add", "div.no_rounding_mode", "pow"],
    "pointwise": ["exp", "sigmoid", "atan2", "clamp", "lerp", "addcmul", "where"],
    "reduction": ["sum", "mean", "amax", "cumsum"],
    "shape": ["permute", "expand", "cat", "transpose"],
    "linalg": ["matmul", "addmm.decomposed", "trace"],
    "linalg_inverse": ["linalg.inv"],
    "softmax": ["softmax", "log_softmax"],
    "activation": ["nn.functional.leaky_relu", "nn.functional.elu", "nn.functional.hardtanh",
                   "nn.functional.softplus"],
    "loss": ["nn.functional.mse_loss", "nn.functional.huber_loss", "nn.functional.cross_entropy"],
    "loss_margin": ["nn.functional.margin_ranking_loss"],
    "normalization": ["nn.functional.layer_norm", "nn.functional.group_norm", "nn.functional.rms_norm"],
    "conv": ["nn.functional.conv2d"],
    "pooling": ["nn.functional.avg_pool2d", "nn.functional.max_pool2d"],
    "indexing": ["gather", "index_select", "masked_fill"],
    "sorting": ["sort"],
    "special": ["special.erfcx"],
    "distance": ["nn.functional.pairwise_distance"],
    "linear": ["nn.functional.linear"],
}


@pytest.fixture(scope="module")
def calls() -> Dict[type, List[RuleCall]]:
    return rule_calls([e for entries in FAMILIES.values() for e in entries], per_op=2, per_rule=2)


def _against_torch(call: RuleCall, run: Replay) -> bool:
    """Compare the traced gradients with torch autograd's on the same call; False when torch cannot run the call
    as the rule received it (its arguments were moved to the rule's positions) or computes something else."""
    args, kwargs, grads, traced = run.args, run.kwargs, run.grads, run.gradients
    positions = [i for i, a in enumerate(args) if call.mask >> i & 1 and isinstance(a, torch.Tensor)
                 and a.is_floating_point()]
    if not positions:
        return False
    args = list(copies(args))
    for i in positions:
        args[i].requires_grad_(True)

    def weighted() -> torch.Tensor:
        outputs = tensors_of(call.func(*args, **kwargs))
        return sum((o * g).sum() for o, g in zip(outputs, grads) if g is not None and o.is_floating_point())

    try:
        out = call.func(*args, **kwargs)
        if differs_from_rule(run._replace(result=[o.detach() for o in tensors_of(out)])):
            return False  # torch's callable, called as the rule received the call, computes something else
        expected = torch.autograd.grad(weighted(), [args[i] for i in positions], allow_unused=True)
    except Exception:
        return False
    traced = traced if isinstance(traced, tuple) else (traced,)
    for i, want in zip(positions, expected):
        got = traced[i]
        got = torch.zeros_like(args[i]) if got is None else got.sum_to_size(args[i].shape)
        want = torch.zeros_like(args[i]) if want is None else want
        if torch.allclose(got, want, rtol=1e-6, atol=1e-7, equal_nan=True):
            continue
        with torch.no_grad():  # torch and the traced code disagree: finite differences decide
            leaf = args[i].detach().clone(memory_format=torch.contiguous_format)
            args[i] = leaf
            (numeric,) = finite_differences(weighted, [leaf])
        assert torch.allclose(got, numeric, rtol=1e-4, atol=1e-5), (
            f"{call.rule.__name__} ({call.source}): traced gradient of argument {i} differs from torch autograd "
            "and from finite differences")
    return True


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_traced_backward_equals_the_rule_and_torch(calls, family):
    checked, against_torch = [], 0
    for rule, rule_calls_ in calls.items():
        if rule.__module__.rsplit(".", 1)[-1] != family:
            continue
        for call in rule_calls_:
            verdict = trace_rule(call.rule, call.args, call.kwargs, call.mask)
            if not verdict.clean:
                continue
            run = replay(call, verdict, seed=len(checked))
            where = f"{rule.__name__} ({call.source})"
            assert differs_from_rule(run) is None, f"{where}: {differs_from_rule(run)}"
            against_torch += _against_torch(call, run)
            checked.append(where)
    assert checked, f"no clean call of a {family} rule was traced"
    assert against_torch, f"no traced {family} call could be compared with torch autograd ({checked})"
