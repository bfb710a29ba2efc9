"""An op recorded under torch.autocast as torch records it: its inputs cast first, its backward outside autocast.

torch.autocast casts a listed op's floating inputs before the op runs (autocast_lists.py: to the low dtype for the
lower-precision list, to float32 for the float32 list, to the widest for the promote list), and the op records its
backward on the cast copies: that backward computes in their dtype, outside autocast, and each cast's own backward
(ToCopyBackward) turns the gradient back into its input's dtype. `autocast_inputs` does the same for a rule: the rule
gets the cast copies (so it saves them; a copy of a value needing a gradient is itself recorded, so a backward with
create_graph=True differentiates through it), the node's edges keep the inputs' own dtypes (the walk casts each
gradient to its edge's dtype as it sends it), and the node's backward runs outside autocast.

Unlike torch, a float32 leaf is cast afresh for each use (torch casts it once per region, its cast cache): a leaf used
twice in a region gets its uses' gradients each cast to float32 and summed there, where torch sums them in the low
dtype and casts once (docs/precision.md says so).

Two cases keep the older way, the backward run under the forward's autocast state: an op that is on no list itself but
runs a listed one inside (einsum's bmm: autocast casts only that inner op's inputs, which the backward's own einsum
then does too), and autocast on a device other than the CPU, whose lists autocast_lists.py does not hold.
"""
from typing import Any, Callable, Optional, Tuple

import torch

from torchtrace.autocast_lists import COMPOSITES, FLOAT32, LOWER_PRECISION, PROMOTE, own_name
from torchtrace.autograd.plain import plain_torch
from torchtrace.autograd.state import STATE

AutocastState = Tuple[str, torch.dtype, bool]  # (device type, autocast dtype, backward runs under autocast)


def autocast_inputs(func: Optional[Callable], args: tuple, kwargs: dict) -> Tuple[tuple, dict,
                                                                                 Optional[AutocastState]]:
    """(args, kwargs) with the floating tensors torch.autocast casts for func cast (plain copies; the rest as given),
    and the node's autocast state; the arguments unchanged and None outside an autocast region of their device."""
    device = next((a.device.type for a in args if isinstance(a, torch.Tensor)), "cpu")
    if not torch.is_autocast_enabled(device):
        return args, kwargs, None
    low = torch.get_autocast_dtype(device)
    mode = kwargs.get("mode", args[2] if len(args) > 2 else None)  # F.pad's mode and pads decide its list
    pads = args[1] if len(args) > 1 and isinstance(args[1], (list, tuple)) else ()
    name = own_name(func, mode if isinstance(mode, str) else None, len(pads) // 2)
    if device != "cpu" or name in COMPOSITES:
        return args, kwargs, (device, low, True)
    target = low if name in LOWER_PRECISION else torch.float32 if name in FLOAT32 else _widest(
        low, (t for a in args for t in (a if type(a) in (list, tuple) else (a,))), device) if name in PROMOTE else None
    if target is None:  # on no list: as given
        return args, kwargs, (device, low, False)
    return (tuple(_cast(a, target, device) for a in args), {k: _cast(v, target, device) for k, v in kwargs.items()},
            (device, low, False))


def _widest(low: torch.dtype, tensors: Any, device: str) -> torch.dtype:
    """The promote list's dtype, as torch's autocast chooses it in order: the first floating input not of the autocast
    dtype decides: float32 if it is float32, an error (in torch too) for another low dtype; none: the autocast dtype."""
    other = next((t.dtype for t in tensors if _eligible(t, device) and t.dtype is not low), None)
    if other is None or other is torch.float32:
        return other or low
    raise RuntimeError(f"Unexpected floating ScalarType in at::autocast::prioritize: a {other} input to an op autocast "
                       f"promotes, in a {low} region (torch raises too): cast it to {low} or float32 first")


def _eligible(t: Any, device: str) -> bool:
    """What autocast casts: a floating tensor on the region's device, float64 never."""
    return isinstance(t, torch.Tensor) and t.is_floating_point() and t.device.type == device and \
        t.dtype is not torch.float64


def _cast(value: Any, dtype: torch.dtype, device: str) -> Any:
    """The copy autocast gives the op. Of a value that needs a gradient, the copy is recorded, as torch records its
    cast (ToCopyBackward): the rule saves it, and a backward with create_graph=True that reads it then differentiates
    through it to the value (the first backward reaches the value by the op's own edge, cast as it is sent)."""
    if type(value) in (list, tuple):  # torch.cat's list of tensors
        return type(value)(_cast(v, dtype, device) for v in value)
    if _eligible(value, device) and value.dtype is not dtype:
        if getattr(value, "_tt_requires_grad", False):  # part of this op's record: tools watching are not told
            watching, STATE.on_record = STATE.on_record, []
            try:
                with torch._C._EnableTorchFunction():  # (the dispatcher runs plain here)
                    return value.to(dtype)
            finally:
                STATE.on_record = watching
        with plain_torch():
            return value.to(dtype)
    return value

