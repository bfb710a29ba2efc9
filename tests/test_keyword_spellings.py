"""Every keyword spelling torch accepts works on tracers: for each op with a rule and PyTorch OpInfo samples, the
call with its positional arguments spelled as keywords (input=, other=, x1=/x2=, dim=, ...), with out=None, and
with a Python number as the second operand, gives torch's value and torch's gradients wherever torch accepts it."""
import warnings

import pytest
import torch

import torchtrace as tt
from torchtrace.autograd.arguments import _signature_parameters
from torchtrace.autograd.function import RULES
from torchtrace.nested import flatten


def _ops_with_rules() -> dict:
    from torch.testing._internal.common_methods_invocations import op_db

    found: dict = {}
    for op in op_db:
        if op.supports_autograd and op.op in RULES and not op.name.startswith("__"):  # operators take no keywords
            found.setdefault(op.name + ("" if not op.variant_test_name else "." + op.variant_test_name), op)
    return found


OPS = _ops_with_rules()
# torch's ctc_loss gradient on raw log-probabilities is not the derivative of its value (torchtrace's is, as
# tests/nn checks by finite differences): the keyword spellings are compared with torchtrace's positional call.
TORCH_GRADIENT_IS_NOT_THE_DERIVATIVE = {"nn.functional.ctc_loss"}


def _spellings(op, sample):
    """(name, keywords) of each spelling of the sample's call that this test tries."""
    names = [name for name, _ in _signature_parameters(op.op)[0]]
    positional = [sample.input, *sample.args]
    if len(positional) > len(names):
        return []
    spelled = {**dict(zip(names, positional)), **sample.kwargs}
    found = [("keywords", spelled), ("out=None", {**spelled, "out": None})]
    if len(positional) > 1 and isinstance(positional[1], torch.Tensor):
        found.append(("number operand", {**spelled, names[1]: 2.5}))
    return found


def _leaves(kwargs, make):
    leaves, rebuild = flatten(kwargs)
    made = [make(x) if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in leaves]
    return rebuild(made), [m for m, x in zip(made, leaves) if m is not x]


def _run(op, kwargs, make, args=()):
    (args, kwargs), leaves = _leaves((list(args), kwargs), make)
    out = op.op(*args, **kwargs)
    outputs = [o for o in flatten(out)[0] if isinstance(o, torch.Tensor)]
    floating = [o for o in outputs if o.is_floating_point() and o.requires_grad]
    if floating:
        sum(o.sum() for o in floating).backward()
    return [o.detach().as_subclass(torch.Tensor) for o in outputs], [x.grad for x in leaves]


@pytest.mark.parametrize("name", sorted(OPS))
def test_keyword_spellings_as_torch(name):
    op = OPS[name]
    samples = list(op.sample_inputs("cpu", torch.float64, requires_grad=True))[:2]
    tried = 0
    for sample in samples:
        for spelling, kwargs in _spellings(op, sample):
            try:
                theirs = _run(op, kwargs, lambda x: x.detach().clone().requires_grad_(True))
            except Exception:
                continue  # torch does not accept this spelling
            if name in TORCH_GRADIENT_IS_NOT_THE_DERIVATIVE:
                theirs = _run(op, sample.kwargs, lambda x: tt.tracer(x.detach(), requires_grad=True),
                              args=[sample.input, *sample.args])
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    ours = _run(op, kwargs, lambda x: tt.tracer(x.detach(), requires_grad=True))
                except tt.UnsupportedOperationError:
                    continue  # a clear refusal (the op's rule does not take this argument combination)
            tried += 1
            for a, b in zip(ours[0], theirs[0]):
                torch.testing.assert_close(a, b, equal_nan=True, msg=lambda m: f"{spelling}: {m}")
            for a, b in zip(ours[1], theirs[1]):
                if a is None or b is None:  # torch leaves None where its output needs no gradient (norm, p=0)
                    assert (a if b is None else b) is None or not (a if b is None else b).any(), spelling
                else:
                    torch.testing.assert_close(a, b, equal_nan=True, msg=lambda m: f"{spelling} gradient: {m}")
    if not tried:
        pytest.skip("torch accepts none of these spellings for its samples")


def test_the_sweep_covers_the_spellings_users_write():
    assert {"add", "mul", "cdist", "sum", "chunk", "nn.functional.multilabel_soft_margin_loss"} <= set(OPS)


def test_a_number_base_passed_as_self_keyword():
    """torch.pow's overload pow(Number self, Tensor exponent) takes its base by the keyword `self`."""
    from helpers import check_op

    check_op(lambda e: torch.pow(self=2.0, exponent=e), torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64))
