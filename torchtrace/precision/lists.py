"""Why torch.autocast ran an op in the dtype it did: the op lists of CPU autocast, as data.

torch.autocast sorts ops into lists (PyTorch's "Autocast Op Reference", CPU section):
- the lower-precision list: ops that are fast and safe in the low dtype (matrix products, convolutions): their
  floating inputs are cast to the autocast dtype;
- the float32 list: ops whose results need float32's range or resolution (losses, reductions like prod,
  decompositions, 3-D pooling): their inputs are cast up to float32;
- the promote list (cat, stack, index_copy): inputs are cast to the widest input type.
Every other op is left alone ("promoted"): it runs in the type its inputs give it, as without autocast -- the
widest floating input type for an add of a float32 residual and a float16 branch, the input's own type for a
normalisation with float32 statistics -- so a low-precision tensor stays low until an op of the float32 list,
or a float32 operand, meets it.
"""
from typing import Any, Callable, Optional

from torchtrace.naming import callable_name

LOWER_PRECISION = frozenset((
    "conv1d", "conv2d", "conv3d", "bmm", "mm", "linalg_vecdot", "baddbmm", "addmm", "addbmm", "linear",
    "_convolution", "matmul", "conv_tbc", "mkldnn_rnn_layer", "conv_transpose1d", "conv_transpose2d",
    "conv_transpose3d", "prelu", "scaled_dot_product_attention", "_native_multi_head_attention",
))
FLOAT32 = frozenset((
    "avg_pool3d", "binary_cross_entropy", "grid_sampler", "polar", "prod", "quantile", "nanquantile", "stft",
    "cdist", "trace", "view_as_complex", "cholesky", "cholesky_inverse", "cholesky_solve", "inverse", "lu_solve",
    "orgqr", "ormqr", "pinverse", "max_pool3d", "max_unpool2d", "max_unpool3d", "adaptive_avg_pool3d",
    "reflection_pad1d", "reflection_pad2d", "replication_pad1d", "replication_pad2d", "replication_pad3d",
    "mse_loss", "cosine_embedding_loss", "nll_loss", "nll_loss2d", "hinge_embedding_loss", "poisson_nll_loss",
    "smooth_l1_loss", "cross_entropy_loss", "l1_loss", "huber_loss", "margin_ranking_loss", "soft_margin_loss",
    "triplet_margin_loss", "multi_margin_loss", "ctc_loss", "kl_div", "multilabel_margin_loss",
    "binary_cross_entropy_with_logits", "geqrf", "qr", "svd", "triangular_solve", "fractional_max_pool2d",
    "fractional_max_pool3d", "adaptive_max_pool3d", "multilabel_margin_loss_forward",
))
PROMOTE = frozenset(("stack", "cat", "index_copy"))

# The Python spelling of an op -> the name autocast's lists use for it.
ATEN_NAME = {"cross_entropy": "cross_entropy_loss", "__matmul__": "matmul", "__rmatmul__": "matmul",
             "adaptive_avg_pool3d": "adaptive_avg_pool3d", "concat": "cat", "concatenate": "cat"}

WHY_LOWER, WHY_FLOAT32, WHY_PROMOTED = "lower-precision list", "float32 list", "promoted"


def op_name(func: Optional[Callable]) -> str:
    """The name autocast's lists know `func` by: `torch.nn.functional.linear` and `Tensor.matmul` -> 'linear',
    'matmul'; `F.cross_entropy` -> 'cross_entropy_loss'."""
    if func is None:
        return ""
    name = callable_name(func).rsplit(".", 1)[-1]
    return ATEN_NAME.get(name, name)


def why(func: Any) -> str:
    """'lower-precision list', 'float32 list', or 'promoted' (the promote list's widest input type, and every op on
    no list: the type its inputs give it)."""
    name = op_name(func)
    if name in LOWER_PRECISION:
        return WHY_LOWER
    if name in FLOAT32:
        return WHY_FLOAT32
    return WHY_PROMOTED
