"""Why a normalisation made a NaN: a group of values that are all equal has variance 0, and with eps 0 the
layer computes (x - mean) / sqrt(0) = 0 * inf = NaN. Found from the values: which row (LayerNorm), channel
(BatchNorm), sample and channel (InstanceNorm) or sample and group (GroupNorm) is constant, and the eps.
"""
from typing import Optional, Sequence, Tuple

import torch

from torchtrace.autograd.plain import plain_torch
from torchtrace.doctor.causes import AtOp, Explained, add_cause

EPS_ADVICE = "use a positive eps (torch's default 1e-5; nn.LayerNorm(d, eps=1e-5)), never 0"


def _constant(x: torch.Tensor, dims: Sequence[int]) -> torch.Tensor:
    """Per group (the dims not in `dims`): are all its values equal? (exactly: then the variance is exactly 0)"""
    with plain_torch():
        x = x.detach().as_subclass(torch.Tensor)
        return (x == x.amax(dim=tuple(dims), keepdim=True)).all(dim=tuple(dims)) if x.numel() else \
            torch.zeros(0, dtype=torch.bool)


def _first(mask: torch.Tensor) -> Tuple[Tuple[int, ...], int]:
    with plain_torch():
        where = torch.nonzero(mask)
        return tuple(int(i) for i in where[0]), int(where.shape[0])


def _said(index: Tuple[int, ...]) -> str:
    return str(index[0]) if len(index) == 1 else str(index)


def _explain(group: str, mask: torch.Tensor, eps: float, x: torch.Tensor, scale: str = "variance") -> \
        Optional[Explained]:
    if eps > 0 or not bool(mask.any()):
        return None
    index, n = _first(mask)
    with plain_torch():
        value = float(x.detach().as_subclass(torch.Tensor)[index].flatten()[0]) if group != "channel" else None
    every = f": every value there is {value:g}" if value is not None else ""
    return (f"{scale} 0 and eps {eps:g} in {group} {_said(index)} ({n} of {mask.numel()} {group}s are constant"
            f"{every}), so x - mean = 0 and 1/sqrt({scale} + eps) = inf: 0 * inf = NaN", EPS_ADVICE)


def _layer_norm(at: AtOp) -> Optional[Explained]:
    x, shape, eps = at.named.get("input"), at.named.get("normalized_shape"), at.named.get("eps", 1e-5)
    if not isinstance(x, torch.Tensor) or shape is None:
        return None
    dims = range(x.dim() - len(tuple(shape)), x.dim())
    return _explain("row", _constant(x, dims), float(eps), x)


def _batch_norm(at: AtOp) -> Optional[Explained]:
    x, eps = at.named.get("input"), float(at.named.get("eps", 1e-5))
    batch_stats = at.named.get("training", at.named.get("use_input_stats", True))
    running_var = at.named.get("running_var")
    if not isinstance(x, torch.Tensor):
        return None
    if not batch_stats and isinstance(running_var, torch.Tensor):
        with plain_torch():
            zero = running_var.detach().as_subclass(torch.Tensor) == 0
        return _explain("channel", zero, eps, x, "running variance")
    if at.rule == "InstanceNormFunction":
        return _explain("sample and channel", _constant(x, range(2, x.dim())), eps, x)
    with plain_torch():
        per_channel = x.as_subclass(torch.Tensor).movedim(1, 0).reshape(x.shape[1], -1)
    return _explain("channel", _constant(per_channel, (1,)), eps, x)


def _group_norm(at: AtOp) -> Optional[Explained]:
    x, groups, eps = at.named.get("input"), at.named.get("num_groups"), float(at.named.get("eps", 1e-5))
    if not isinstance(x, torch.Tensor) or not isinstance(groups, int):
        return None
    with plain_torch():
        grouped = x.as_subclass(torch.Tensor).reshape(x.shape[0], groups, -1)
    return _explain("sample and group", _constant(grouped, (2,)), eps, grouped)


for _rule, _cause in (("LayerNormFunction", _layer_norm), ("BatchNormFunction", _batch_norm),
                      ("InstanceNormFunction", _batch_norm), ("TorchBatchNorm", _batch_norm),
                      ("GroupNormFunction", _group_norm)):
    add_cause("forward", _cause, rule=_rule)
