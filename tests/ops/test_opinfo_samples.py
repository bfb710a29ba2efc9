"""PyTorch's own OpInfo samples of the shape, construction, indexing, difference and distance ops, run on
tracers and compared with torch autograd: the argument forms torch's test suite knows, beyond our tables."""
import warnings

import pytest
import torch

import torchtrace as tt

OPS = [
    # construction.py
    "tril", "triu", "diag", "diag_embed", "diagflat", "block_diag", "rot90", "repeat_interleave", "kron",
    "meshgrid", "cartesian_prod", "combinations", "atleast_1d", "atleast_2d", "atleast_3d", "broadcast_tensors",
    # shape.py and view_copies.py
    "roll", "broadcast_to", "narrow", "narrow_copy", "unsafe_chunk", "unsafe_split", "view_copy", "permute_copy",
    "expand_copy", "diagonal_copy", "squeeze_copy", "unsqueeze_copy", "t_copy", "transpose_copy", "unbind_copy",
    "split_with_sizes_copy", "unfold_copy", "alias_copy",
    # indexing.py
    "index_copy", "index_fill", "index_reduce", "masked_scatter", "put", "take", "scatter_reduce", "fill", "zero_",
    # differences.py and distances.py
    "diff", "gradient", "trapezoid", "trapz", "cumulative_trapezoid", "cross", "linalg.cross",
    "cdist", "nn.functional.pdist", "cov", "corrcoef", "renorm",
]


def _op_infos():
    from torch.testing._internal.common_methods_invocations import op_db

    return [op for op in op_db if op.name in OPS]


OP_INFOS = _op_infos()


def _swap_tensors(tree, tensors):
    """tree with each tensor that requires grad replaced by the next of `tensors` (other leaves kept)."""
    if isinstance(tree, torch.Tensor):
        return next(tensors) if tree.requires_grad else tree.detach()
    if type(tree) in (list, tuple):
        return type(tree)(_swap_tensors(item, tensors) for item in tree)
    if isinstance(tree, dict):
        return {k: _swap_tensors(v, tensors) for k, v in tree.items()}
    return tree


def _leaves(tree):
    if isinstance(tree, torch.Tensor):
        return [tree.detach()] if tree.requires_grad else []
    if type(tree) in (list, tuple):
        return [leaf for item in tree for leaf in _leaves(item)]
    if isinstance(tree, dict):
        return [leaf for v in tree.values() for leaf in _leaves(v)]
    return []


@pytest.mark.parametrize("op", OP_INFOS, ids=lambda op: f"{op.name}.{op.variant_test_name}".rstrip("."))
def test_opinfo_samples_match_torch(op):
    samples = list(op.sample_inputs("cpu", torch.float64, requires_grad=True))
    variants = [fn for fn in (op.op, op.method_variant) if fn is not None]
    assert samples and variants
    for sample in samples:
        tree = (sample.input, sample.args, sample.kwargs)
        leaves = _leaves(tree)
        for variant in variants:
            def fn(*tensors, variant=variant, tree=tree):
                inputs, args, kwargs = _swap_tensors(tree, iter(tensors))
                return variant(inputs, *args, **kwargs)

            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # index_reduce is beta, cross without dim deprecated
                tt.check(fn, *leaves, rtol=1e-5, atol=1e-5)  # cov: float32 aweights next to float64 samples
