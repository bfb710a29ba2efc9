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
    module = _PUBLIC_MODULES.get(getattr(func, "__module__", None), getattr(func, "__module__", None) or "torch")
    name = getattr(func, "__name__", name)
    for prefix in ("special_", "linalg_", "fft_"):
        if module.endswith(prefix[:-1]) and name.startswith(prefix):
            name = name[len(prefix):]
    return f"{module}.{name}"
