"""A leaf's AccumulateGrad step: sum the gradient that reached it into its .grad (as torch does).

The first gradient becomes .grad itself when no one else can reach its memory (torch's AccumulateGrad
"steals" it too, saving a copy per parameter and step); later ones are added in place. `Ownership` decides,
without reference counts, which gradients are safe to keep.
"""
from typing import Any, Dict, List, Optional

import torch

from torchtrace.autograd.hooks import run_hooks
from torchtrace.autograd.node import AccumulateGrad
from torchtrace.autograd.plain import plain_torch

# Rules shipped with torchtrace: their backward returns new tensors or views of its gradient, and keeps neither.
OUR_RULES = ("torchtrace.ops.", "torchtrace.nn.", "torchtrace.autograd.")


class Ownership:
    """Which gradients a leaf may keep as its .grad without a copy (as torch's AccumulateGrad steals its buffer).

    A leaf keeps a gradient that no user code has seen: the engine knows the storages that reached user code
    during this backward (the root gradients, what hooks saw or returned, what a user's Function received or
    returned) and the storages leaves already keep. Handing a kept storage to user code later first gives its
    leaf a private copy, so an in-place accumulation into .grad never reaches anyone else.
    """

    def __init__(self, roots: List[Any], enabled: bool):
        self.enabled = enabled  # off while observers watch: they see every gradient
        self.handed_out = {_storage(g) for g in roots}
        self.kept: Dict[int, Any] = {}  # storage -> the leaf that keeps it as .grad

    def hand_out(self, g: Any) -> None:
        """g (or a tensor sharing its memory; or each tensor of a list of gradients) reaches user code."""
        if isinstance(g, (list, tuple)):
            for item in g:
                self.hand_out(item)
        elif isinstance(g, torch.Tensor):
            storage = _storage(g)
            self.handed_out.add(storage)
            leaf = self.kept.pop(storage, None)
            if leaf is not None:
                leaf.grad = _private_copy(leaf.grad)

    def take(self, g: Any, leaf: Any, create_graph: bool) -> Any:
        """g itself for the leaf's .grad when nobody else can reach its memory, else a private copy. A recorded
        gradient (create_graph) is never changed in place later, so only other leaves must not share it."""
        storage = _storage(g)
        free = storage not in self.handed_out and storage not in self.kept
        if create_graph:
            self.handed_out.add(storage)
            return g if free else _private_copy(g, create_graph)
        if not (free and self.enabled and type(g) is torch.Tensor and g.is_contiguous()
                and (g._base is None or g._base.numel() == g.numel())):
            return _private_copy(g)
        self.kept[storage] = leaf
        return g


def _private_copy(g: Any, create_graph: bool = False) -> Any:
    """A copy of g for a leaf's .grad: recorded in the graph with create_graph, else a plain contiguous tensor."""
    return g.clone() if create_graph else g.clone(memory_format=torch.contiguous_format).as_subclass(torch.Tensor)


def _storage(t: torch.Tensor) -> int:
    with plain_torch():
        return t.untyped_storage().data_ptr()


def accumulate(acc: AccumulateGrad, g: Any, create_graph: bool, captured: Optional[dict], ownership: Ownership) -> None:
    """Sum g into the leaf's .grad (a plain tensor leaf: torch's own .grad); every leaf owns its .grad."""
    leaf = acc.variable
    if not acc.torch_leaf and leaf._tt_hooks:
        g = run_hooks(leaf._tt_hooks, g, "a leaf", ownership.hand_out)
    if captured is not None:
        if (acc, 0) in captured:
            captured[(acc, 0)] = g
        return
    current = leaf.grad if acc.torch_leaf else leaf._tt_grad
    if current is None:
        current = ownership.take(g, leaf, create_graph)
    elif create_graph or type(current) is not torch.Tensor:
        current = current + g
    else:
        current.add_(g)  # in place, as torch: a reference to .grad held by the user sees the sum
    if acc.torch_leaf:
        leaf.grad = current
    else:
        leaf._tt_grad = current
        for fn in list(leaf._tt_post_hooks or ()):
            fn(leaf)
