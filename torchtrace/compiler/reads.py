"""Which torch calls let Python see tensor values, decided by what they return rather than by a list of APIs.

A call that returns tensors is replayed as a line of code. A call that returns anything else hands Python
a value: either metadata (shape, dtype, ...: fixed by the guards on the inputs) or something computed from
the data (`torch.equal`, `x.item()`, `1.0 in x`, `f"{x:.1f}"`, `np.asarray(x)`). Metadata calls are the
short, closed list below; every other non-tensor result is a data read, so a read through an API nobody
listed is still caught: it becomes a guard when its value can be written as a constant, a refusal when not.

A tensor result whose shape follows from values (`x[mask]`, `torch.nonzero`, `torch.where(c)`) is found by
running the call on the meta device, which knows shapes only: where the meta kernel cannot say, the
shape is a guard too.
"""
from typing import Any, Callable, Dict, List

import torch

from torchtrace.autograd.plain import plain_torch

T = torch.Tensor
# calls whose non-tensor result depends only on shape, dtype, device, layout or requires_grad
METADATA = {getattr(owner, name) for owner, names in (
    (T, "size dim numel nelement ndimension stride is_contiguous is_floating_point is_complex is_signed element_size "
        "__len__ storage_offset get_device is_conj is_neg is_inference dim_order __hash__ untyped_storage"),
    (torch, "is_floating_point is_complex numel is_same_size result_type is_conj is_neg is_inference can_cast "
            "promote_types")) for name in names.split() if hasattr(owner, name)}
# the types of value a guard can compare (the generated code writes the value as a constant)
_READABLE = (bool, int, float, complex, str, type(None))


def is_metadata(func: Callable) -> bool:
    """Does func's non-tensor result depend only on metadata (a property read such as x.shape counts)?"""
    return func in METADATA or (getattr(func, "__name__", "") == "__get__" and hasattr(func, "__self__"))


def writable(value: Any) -> bool:
    """Can a data read's value be compared in generated code (numbers, strings, and lists/tuples of them)?"""
    if isinstance(value, (list, tuple)):
        return all(writable(v) for v in value)
    return isinstance(value, _READABLE)


def _to_meta(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        with plain_torch():
            return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="meta")
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(_to_meta(v) for v in value)
    return value


_SEEN: Dict[Any, bool] = {}  # (func, metadata of the arguments) -> the answer: meta kernels cost ~1 ms a call


def _describe(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        with plain_torch():
            return value.shape, value.stride(), value.dtype, value.device
    if isinstance(value, (list, tuple)):
        return type(value), tuple(_describe(v) for v in value)
    return type(value), value


def shape_follows_values(func: Callable, args: tuple, kwargs: dict, results: List[torch.Tensor]) -> bool:
    """Could a call on tensors of the same shapes give results of other shapes (x[mask], nonzero, unique)?
    (The answer is remembered for the same callable and argument metadata.)"""
    try:
        key = (func, _describe(args), tuple((k, _describe(v)) for k, v in kwargs.items()),
               tuple(t.shape for t in results))
        hash(key)
    except TypeError:  # an unhashable argument: ask the meta device every time
        return _meta_disagrees(func, args, kwargs, results)
    found = _SEEN.get(key)
    if found is None:
        found = _SEEN[key] = _meta_disagrees(func, args, kwargs, results)
        if len(_SEEN) > 65536:
            _SEEN.clear()
    return found


def _meta_disagrees(func: Callable, args: tuple, kwargs: dict, results: List[torch.Tensor]) -> bool:
    """The meta device runs the call on shapes alone; a call it cannot run, or whose shapes it gets
    otherwise, is taken to depend on values.
    """
    if not any(isinstance(a, torch.Tensor) for a in (*args, *kwargs.values())) and not any(
            isinstance(a, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in a) for a in args):
        return False  # a factory: its shape comes from Python values, which are constants or guards
    if any(isinstance(v, torch.device) for v in kwargs.values()) or "out" in kwargs:
        return False
    try:
        with torch._C.DisableTorchFunction():
            out = func(*_to_meta(args), **{k: _to_meta(v) for k, v in kwargs.items()})
    except Exception:  # no meta kernel, or one that needs values: the shape is a guard
        return True
    found = [out] if isinstance(out, torch.Tensor) else [o for o in out if isinstance(o, torch.Tensor)] \
        if isinstance(out, (list, tuple)) else []
    return len(found) != len(results) or any(a.shape != b.shape for a, b in zip(found, results))
