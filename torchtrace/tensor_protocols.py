"""What a tracer offers beyond the engine: pickling, copying, iteration, formatting, the real part, `c / x` as torch
records it, the original torchtrace's capitalised aliases. tracer.py mixes it in."""
from copy import deepcopy
from typing import Any, Optional

import torch

from torchtrace.autograd.plain import plain_torch
from torchtrace.errors import UnsupportedOperationError


class TensorProtocols:
    """Mixed into tt.tracer (before torch.Tensor)."""

    _tt_node: Any
    _tt_requires_grad: bool
    _tt_view: bool
    _tt_base: Any

    @property
    def real(self) -> "TensorProtocols":
        """A real tracer is its own real part (complex gradients are not supported)."""
        with plain_torch():
            if self.is_complex():
                raise UnsupportedOperationError("torch.Tensor.real: complex tracers are not supported — work with "
                                                "real tensors (e.g. separate real and imaginary parts)")
        return self

    @property
    def _base(self) -> Optional["TensorProtocols"]:
        """torch's view base: the tracer this view shares memory with (None for a tensor that is not a view)."""
        if self._tt_view and self._tt_base is None:
            raise UnsupportedOperationError("torch.Tensor._base: torchtrace does not know the base of this view — "
                                            "keep a reference to the tensor you took the view of")
        return self._tt_base

    def __format__(self, format_spec: str) -> str:
        """f"{loss:.4f}" formats a 0-dim tracer as its number, as torch formats a 0-dim tensor; others as str()."""
        with plain_torch():
            if self.dim() == 0:
                return self.item().__format__(format_spec)
        return object.__format__(self, format_spec)

    def numpy(self, *, force: bool = False) -> Any:
        """As torch: refused while the tracer requires grad (the array would drop its gradient); force=True copies
        a detached tensor."""
        if self._tt_requires_grad and not force:
            raise RuntimeError("Can't call numpy() on Tensor that requires grad. Use tensor.detach().numpy() instead.")
        with plain_torch():
            return torch.Tensor.numpy(self, force=force)

    def __iter__(self) -> Any:
        with plain_torch():
            if self.dim() == 0:
                raise TypeError("iteration over a 0-d tensor")
        return iter(self.unbind(0))

    def __rtruediv__(self, other: Any) -> Any:
        """c / x as torch's Tensor.__rdiv__ computes it: x.reciprocal() * c, two nodes as in torch's graph, so that in
        a second derivative the gradients meeting at 1/x are summed before the reciprocal's rule scales them (one
        fused node would multiply a zero gradient by an infinite -1/x^2 at x = 0 and give NaN where torch gives inf).
        A tensor on the left is divided by it with `div`, as Python would do without this method; anything else
        (a number, a numpy scalar) is what torch's multiplies by, NotImplemented where that is a TypeError."""
        if isinstance(other, torch.Tensor):
            return torch.Tensor.__truediv__(other, self)
        try:
            return self.reciprocal() * other
        except TypeError:
            return NotImplemented

    __rdiv__ = __rtruediv__

    def __reduce_ex__(self, protocol: int) -> Any:
        """A leaf as torch pickles one (a non-leaf too: a leaf with its requires_grad), with the user's attributes."""
        with plain_torch():
            plain = torch.Tensor.detach(self).as_subclass(torch.Tensor)
        return _rebuild, (type(self), plain, self._tt_requires_grad, own_attributes(self))

    def __deepcopy__(self, memo: dict) -> "TensorProtocols":
        """As torch's: memory shared between tensors of one deepcopy stays shared (views stay views of the copy),
        a leaf's .grad is copied, and so are the user's attributes; a parameter, as torch.nn.Parameter's, is a
        fresh clone with neither."""
        if self._tt_node is not None:  # as torch: a copy could neither share the graph nor silently leave it
            raise RuntimeError("Only tracers created explicitly by the user (graph leaves) support the deepcopy "
                               "protocol, as in torch: deepcopy its .detach() (a leaf), or copy the leaves and "
                               "compute it again")
        if id(self) in memo:
            return memo[id(self)]
        parameter = getattr(self, "_is_param", False)
        with plain_torch():
            plain = torch.Tensor.detach(self).as_subclass(torch.Tensor)
            memo.setdefault(id(memo), []).append(plain)  # (alive until the deepcopy ends: its id stays its own)
            copied = plain.clone() if parameter else torch.Tensor.__deepcopy__(plain, memo)  # (storages once, by memo)
            copy = copied.as_subclass(type(self))
        copy._tt_requires_grad = self._tt_requires_grad
        memo[id(self)] = copy
        if "_is_param" in self.__dict__:  # torch.nn.Parameter(t) made it a parameter, or detach() a non-parameter
            copy._is_param = self._is_param
        if not parameter:
            if self._tt_grad is not None:
                copy.grad = deepcopy(self._tt_grad, memo)
            copy.__dict__.update(deepcopy(own_attributes(self), memo))
        return copy

    # Capitalised aliases of the original torchtrace, recorded exactly like their torch counterparts.
    def Sum(self) -> "TensorProtocols":
        """Sum of all elements."""
        return self.sum()

    def View(self, *shape: Any) -> "TensorProtocols":
        return self.view(*shape)

    def Gather(self, index: torch.Tensor) -> "TensorProtocols":
        """For a 2-D tracer and a 1-D index of length N: picks self[i, index[i]], shape (N, 1)."""
        return self.gather(1, index.reshape(-1, 1))


def own_attributes(t: Any) -> dict:
    """The attributes a user set on a tracer (`p.no_decay = True`), not torchtrace's own graph fields."""
    return {k: v for k, v in t.__dict__.items() if not k.startswith("_tt_")}


def _rebuild(cls: type, data: torch.Tensor, requires_grad: bool, attributes: Optional[dict] = None) -> Any:
    """Unpickle: a leaf tracer (graph fields are never pickled) with the user's attributes."""
    t = data.as_subclass(cls)
    t.__dict__.update(attributes or {})
    return t.requires_grad_(True) if requires_grad else t
