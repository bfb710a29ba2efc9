"""Containers and shape layers: torch's own classes, with tracer parameters (tt.nn.Module).

They hold no gradient rule of their own: their layers' rules (and Flatten's / Unflatten's view
rules) record the graph. A Sequential of torchtrace layers prints as the original torchtrace did:
`Sequence(` / `    (0):Linear layer (8 X 256)` / `    (1):ReLU()` / `)`.
"""
from typing import Optional

import torch

from torchtrace.nn.module import Module, original_or_torch_repr, sequence_repr


class Sequential(Module, torch.nn.Sequential):
    """Runs its layers one after the other (torch.nn.Sequential); prints as the original `Sequence(...)`."""

    def original_repr(self) -> Optional[str]:
        return sequence_repr(self)

    __repr__ = original_or_torch_repr


class ModuleList(Module, torch.nn.ModuleList):
    """A list of sub-modules whose parameters are registered (torch.nn.ModuleList)."""


class ModuleDict(Module, torch.nn.ModuleDict):
    """A dict of sub-modules whose parameters are registered (torch.nn.ModuleDict)."""


class Identity(Module, torch.nn.Identity):
    """y = x (torch.nn.Identity)."""


class Flatten(Module, torch.nn.Flatten):
    """x.flatten(start_dim, end_dim) (torch.nn.Flatten)."""


class Unflatten(Module, torch.nn.Unflatten):
    """x.unflatten(dim, sizes) (torch.nn.Unflatten)."""
