"""How a user writes a torch callable, for messages, traces and drawings: 'torch.log', 'torch.Tensor.add', ..."""
import functools
from typing import Callable, Dict

import torch

_PUBLIC_MODULES = {"torch._C._nn": "torch.nn.functional", "torch._C._special": "torch.special",
                   "torch._C._linalg": "torch.linalg", "torch._C._fft": "torch.fft"}


@functools.lru_cache(maxsize=None)
def _tensor_attributes() -> Dict[int, str]:
    """id(value) -> attribute name on torch.Tensor: Tensor.__pow__ is a wrapper whose __name__ says 'pow'."""
    return {id(value): name for klass in (torch._C.TensorBase, torch.Tensor) for name, value in vars(klass).items()}


def _public_is(module: str, name: str, func: Callable) -> bool:
    """Is torch._C._nn.glu what torch.nn.functional calls glu? (F.glu is a Python wrapper of its own)."""
    namespace = {"torch.nn.functional": torch.nn.functional, "torch.special": torch.special,
                 "torch.linalg": torch.linalg, "torch.fft": torch.fft}[module]
    short = name.split("_", 1)[1] if module != "torch.nn.functional" and "_" in name else name
    found = getattr(namespace, short, None)
    return found is None or found is func


def callable_name(func: Callable) -> str:
    """'torch.log', 'torch.Tensor.log', 'torch.nn.functional.relu', 'torch.Tensor.T.__get__', ..."""
    if getattr(func, "__name__", "") == "__get__" and hasattr(func, "__self__"):
        return f"torch.Tensor.{func.__self__.__name__}.__get__"
    qualname = getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or repr(func)
    owner, _, name = qualname.rpartition(".")
    if owner == "_VariableFunctionsClass":
        return f"torch.{name}"
    if owner in ("TensorBase", "Tensor"):
        return f"torch.Tensor.{_tensor_attributes().get(id(func), name)}"
    raw_module = getattr(func, "__module__", None) or "torch"
    name = getattr(func, "__name__", name)
    public = _PUBLIC_MODULES.get(raw_module)
    module = public if public and _public_is(public, name, func) else raw_module
    for prefix in ("special_", "linalg_", "fft_"):
        if module.endswith(prefix[:-1]) and name.startswith(prefix):
            name = name[len(prefix):]
    return f"{module}.{name}"
