"""tt.precision(fn, *args, dtype=...): one run under torch.autocast and one in float32, on torchtrace's engine,
recorded as tt.diff records them (the doctor's recording: values of every op and gradients of every rule)."""
import contextlib
import difflib
import inspect
from typing import Any, Callable, Dict, Iterator, Optional, Tuple

import torch
from torch.nn.modules.module import register_module_forward_pre_hook

from torchtrace.argument_checks import positive
from torchtrace.autograd.grad_mode import no_grad
from torchtrace.autograd.plain import plain_torch
from torchtrace.doctor.recording import Pass, record_pass
from torchtrace.nested import flatten
from torchtrace.precision.report import PrecisionReport


def _device(args: tuple) -> str:
    return next((t.device.type for t in flatten(list(args))[0] if isinstance(t, torch.Tensor)), "cpu")


def under_autocast(fn: Callable, device: str, dtype: torch.dtype, scale: float) -> Callable:
    """fn run under torch.autocast(device, dtype), its scalar result multiplied by `scale` (the loss scaling) as
    GradScaler.scale multiplies it: by a float32 tensor (a float16 loss times 2**16 would be inf: 65504 is the
    largest float16)."""
    def run(*args: Any, **kwargs: Any) -> Any:
        with torch.autocast(device, dtype=dtype):
            loss = fn(*args, **kwargs)
        if scale == 1.0:
            return loss
        if not isinstance(loss, torch.Tensor):
            raise TypeError("tt.precision(fn, ..., scale=): fn must return the scalar loss itself")
        return loss * torch.tensor(scale, dtype=torch.float32, device=loss.device)
    return run


@contextlib.contextmanager
def buffers_kept() -> Iterator[None]:
    """The buffers of every module that runs inside (a train-mode BatchNorm's running statistics) are put back on the
    way out: the comparison runs the forward more than once, and the model's state moves by none of those runs."""
    saved: Dict[int, Tuple[torch.Tensor, torch.Tensor]] = {}

    def keep(module: torch.nn.Module, _: Any) -> None:
        with plain_torch():
            for buffer in module.buffers(recurse=False):
                if id(buffer) not in saved:
                    saved[id(buffer)] = (buffer, buffer.clone())

    handle = register_module_forward_pre_hook(keep)
    try:
        yield
    finally:
        handle.remove()
        with no_grad(), plain_torch():
            for buffer, value in saved.values():
                buffer.copy_(value)


def _refuse_misspelt_options(fn: Callable, kwargs: dict) -> None:
    """Keywords are fn's own (they are passed on to it), but one fn does not take that is close to tt.precision's own
    options (dtpye=, or torch.autocast's device_type=) was meant for tt.precision: say so before running anything."""
    try:
        parameters = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a callable whose signature cannot be read: its own error will tell
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return
    for key in kwargs:
        meant = "device" if key == "device_type" else next(iter(difflib.get_close_matches(
            key, ("dtype", "scale", "device"), n=1, cutoff=0.7)), None)
        if key not in parameters and meant is not None:
            raise TypeError(f"tt.precision: {key}= is neither an option of tt.precision nor a parameter of fn; did "
                            f"you mean {meant}=? (tt.precision's options are dtype, scale and device; other keywords "
                            "go to fn)")


def precision(fn: Callable, *args: Any, dtype: torch.dtype = torch.bfloat16, scale: float = 1.0,
              device: Optional[str] = None, **kwargs: Any) -> PrecisionReport:
    """Run fn(*args) and the backward of its scalar loss twice, in float32 and under torch.autocast(dtype) with the
    loss multiplied by `scale`; report, per op and per rule, the dtype it ran in and why, the shares that underflowed
    and overflowed, and the relative error against float32. The random state is the same for both runs; the
    modules' buffers are left as they were before the call (parameters and .grad are too)."""
    if not callable(fn):
        raise TypeError(f"tt.precision: fn must be a function (or a module) returning the scalar loss, not "
                        f"{type(fn).__name__}")
    if dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"tt.precision compares a low-precision run with float32: dtype must be torch.bfloat16 or "
                         f"torch.float16, not {dtype!r}" + ("" if isinstance(dtype, torch.dtype) else
                                                            f" (a {type(dtype).__name__})"))
    if device is not None:
        try:
            torch.device(device)
        except (RuntimeError, TypeError):
            raise ValueError(f"tt.precision: device must be a device type torch.autocast runs on ('cpu', 'cuda'), "
                             f"not {device!r}") from None
    scale = positive("tt.precision", "scale (what multiplies the loss, as a GradScaler does)", scale)
    _refuse_misspelt_options(fn, kwargs)
    low_fn = under_autocast(fn, device or _device(args), dtype, scale)
    state = torch.random.get_rng_state()
    with buffers_kept():  # each run starts from the buffers as they were, as from the same random state
        reference = record_pass(fn, args, kwargs, tool="tt.precision")
    torch.random.set_rng_state(state)
    with buffers_kept():
        low = record_pass(low_fn, args, kwargs, tool="tt.precision")

    def rerun() -> Pass:
        torch.random.set_rng_state(state)
        with buffers_kept():
            return record_pass(low_fn, args, kwargs, explore=True, tool="tt.precision")

    return PrecisionReport(low, reference, dtype, float(scale), rerun)
