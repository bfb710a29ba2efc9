"""PyTorch's own OpInfo samples for the later functionals (activations, distances, alpha dropout, losses), run on
tracers and compared with torch autograd: argument forms the hand-written tables may have missed."""
import warnings

import pytest
import torch
from torch.testing._internal.common_methods_invocations import op_db

import torchtrace as tt

NAMES = """prelu rrelu selu celu glu hardswish hardsigmoid logsigmoid softsign softshrink hardshrink tanhshrink
threshold alpha_dropout feature_alpha_dropout normalize cosine_similarity pairwise_distance cosine_embedding_loss
margin_ranking_loss triplet_margin_loss triplet_margin_with_distance_loss multi_margin_loss multilabel_margin_loss
multilabel_soft_margin_loss soft_margin_loss poisson_nll_loss gaussian_nll_loss hinge_embedding_loss ctc_loss""".split()
OPS = [op for op in op_db if op.name.removeprefix("nn.functional.") in NAMES and op.name.startswith("nn.functional.")]


def _tensors(value):
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in _tensors(item)]
    if isinstance(value, dict):
        return [t for item in value.values() for t in _tensors(item)]
    return []


def _substitute(value, mapping):
    if isinstance(value, torch.Tensor):
        return mapping.get(id(value), value)
    if isinstance(value, (list, tuple)):
        return type(value)(_substitute(item, mapping) for item in value)
    if isinstance(value, dict):
        return {k: _substitute(item, mapping) for k, item in value.items()}
    return value


def test_every_functional_of_the_issue_has_opinfo_samples():
    assert {op.name.removeprefix("nn.functional.") for op in OPS} == set(NAMES)


@pytest.mark.parametrize("op", OPS, ids=lambda op: f"{op.name}.{op.variant_test_name}".rstrip("."))
def test_opinfo_samples_match_torch(op):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        samples = list(op.sample_inputs("cpu", torch.float64, requires_grad=True))
    checked = 0
    for sample in samples:
        args = (sample.input, *sample.args)
        leaves = [t for t in _tensors(args) + _tensors(sample.kwargs) if t.requires_grad]
        if not leaves:
            continue

        def fn(*inputs):
            mapping = {id(leaf): x for leaf, x in zip(leaves, inputs)}
            if op.name.endswith("ctc_loss"):  # torch's CTC gradient is right only through a log_softmax
                mapping[id(sample.input)] = mapping[id(sample.input)].log_softmax(-1)
            torch.manual_seed(5)  # rrelu and alpha dropout draw the same numbers in both runs
            return op.op(*_substitute(args, mapping), **_substitute(sample.kwargs, mapping))

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert tt.check(fn, *(leaf.detach() for leaf in leaves), rtol=1e-5, atol=1e-6).ok
        checked += 1
    assert checked
