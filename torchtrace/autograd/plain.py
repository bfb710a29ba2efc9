"""plain_torch(): inside it, torch calls on tracers run as on plain tensors (no __torch_function__ re-entry).

Every module that calls torch on tracers without recording uses this one guard: `with plain_torch(): ...`.
"""
import torch

plain_torch = torch._C.DisableTorchFunctionSubclass
