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
    "linalg_inv", "linalg_inv_ex", "linalg_solve", "linalg_cholesky", "linalg_cholesky_ex", "linalg_svd",
    "linalg_svdvals", "linalg_qr", "linalg_eig", "linalg_eigh", "linalg_eigvals", "linalg_eigvalsh", "linalg_cond",
    "linalg_matrix_rank", "linalg_lstsq", "linalg_householder_product", "linalg_tensorinv", "linalg_tensorsolve",
    "fft_fft", "fft_ifft", "fft_fft2", "fft_ifft2", "fft_fftn", "fft_ifftn", "fft_rfft", "fft_irfft", "fft_rfft2",
    "fft_irfft2", "fft_rfftn", "fft_irfftn", "fft_hfft", "fft_ihfft",
))
PROMOTE = frozenset(("stack", "cat", "index_copy"))

# The Python spelling of an op -> the name autocast's lists use for it.
ALIASES = {"cross_entropy": "cross_entropy_loss", "__matmul__": "matmul", "__rmatmul__": "matmul", "concat": "cat",
           "concatenate": "cat", "linalg_matmul": "matmul", "grid_sample": "grid_sampler"}
# An op on no list that runs a listed one inside (einsum's bmm) -> that one's name, which decides the dtype: autocast
# casts the inputs of that inner op only, not the op's own.
COMPOSITES = {"einsum": "bmm", "tensordot": "mm", "inner": "mm", "chain_matmul": "mm", "linalg_multi_dot": "mm",
              "linalg_matrix_power": "matmul"}
NAMESPACES = (("torch.linalg.", "linalg_"), ("torch.fft.", "fft_"))  # torch.linalg.inv is ATen's linalg_inv

WHY_LOWER, WHY_FLOAT32, WHY_PROMOTED = "lower-precision list", "float32 list", "promoted"


def op_name(func: Optional[Callable], pad_mode: Optional[str] = None, pad_dims: int = 0) -> str:
    """The name autocast's lists know `func` by: `torch.nn.functional.linear` and `Tensor.matmul` -> 'linear',
    'matmul'; `F.cross_entropy` -> 'cross_entropy_loss'; `torch.linalg.inv` -> 'linalg_inv'; F.pad in `pad_mode`
    'reflect' over `pad_dims` dimensions -> 'reflection_pad2d' (its constant and circular modes are on no list);
    a composite, the name of the listed op it runs inside (einsum -> 'bmm')."""
    name = own_name(func, pad_mode, pad_dims)
    return COMPOSITES.get(name, name)


def own_name(func: Optional[Callable], pad_mode: Optional[str] = None, pad_dims: int = 0) -> str:
    """op_name without the composites' inner op: the name autocast casts func's own inputs by."""
    if func is None:
        return ""
    qualified = callable_name(func)
    name = next((prefix + qualified[len(space):] for space, prefix in NAMESPACES if qualified.startswith(space)),
                qualified.rsplit(".", 1)[-1])
    if name == "pad" and pad_mode in ("reflect", "replicate"):
        name = f"{'reflection' if pad_mode == 'reflect' else 'replication'}_pad{pad_dims}d"
    return ALIASES.get(name, name)


def why(func: Any, pad_mode: Optional[str] = None, pad_dims: int = 0) -> str:
    """'lower-precision list', 'float32 list', or 'promoted' (the promote list's widest input type, and every op on
    no list: the type its inputs give it). F.pad's reason depends on its mode and dimensions (op_name)."""
    name = op_name(func, pad_mode, pad_dims)
    if name in LOWER_PRECISION:
        return WHY_LOWER
    if name in FLOAT32:
        return WHY_FLOAT32
    return WHY_PROMOTED
