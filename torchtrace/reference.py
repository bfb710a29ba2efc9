"""tt.check's references: torch autograd on plain copies of everything the function touches, and central finite
differences where torch autograd is not a reference (a torch autograd Function runs its author's backward; an op
torch cannot differentiate)."""
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from torch.overrides import TorchFunctionMode

from torchtrace.autograd.plain import plain_torch
from torchtrace.nn.loss import with_dropped_weight
from torchtrace.nn.module import PlainInput
from torchtrace.tracer import tracer


def plain_copy(t: torch.Tensor, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """A plain tensor holding t's values (floating ones in `dtype` when given), sharing nothing with t."""
    with plain_torch():
        copy = t.detach().clone().as_subclass(torch.Tensor)
    return copy.to(dtype) if dtype is not None and copy.is_floating_point() else copy


class PlainCopies(TorchFunctionMode):
    """While active, every tracer a torch call meets is replaced by a plain copy made once per tracer (requiring
    grad where the tracer does): a ported model's parameters and the tracers a function closes over take part in
    torch autograd's run as ordinary tensors, and nothing of torchtrace's runs in it."""

    def __init__(self, dtype: Optional[torch.dtype] = None):
        super().__init__()
        self.dtype = dtype
        self.copies: Dict[int, Tuple[tracer, torch.Tensor]] = {}

    def _plain(self, x: Any) -> Any:
        if type(x) in (list, tuple):
            return type(x)(self._plain(item) for item in x)
        if isinstance(x, tuple) and hasattr(type(x), "_fields"):  # a named tuple (torch.Size and others stay)
            return type(x)(*(self._plain(item) for item in x))
        if isinstance(x, dict):
            return {k: self._plain(v) for k, v in x.items()}
        if not isinstance(x, tracer):
            return x
        if x._tt_node is not None and x._tt_node.rule is PlainInput:  # a plain leaf that entered a module
            return x._tt_node.edges[0].node.variable
        found = self.copies.get(id(x))
        if found is None:
            copy = plain_copy(x, self.dtype)
            if x._tt_requires_grad and copy.is_floating_point():
                copy.requires_grad_(True)
            found = self.copies[id(x)] = (x, copy)
        return found[1]

    def __torch_function__(self, func: Callable, types: Any, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
        return func(*self._plain(args), **self._plain(with_dropped_weight(func, kwargs or {})))

    def leaves(self) -> List[Tuple[tracer, torch.Tensor]]:
        """(tracer, its copy) for every leaf tracer requiring grad that the run met (parameters, captured leaves)."""
        return [(t, c) for t, c in self.copies.values() if t._tt_node is None and c.requires_grad]


def finite_differences(projected: Callable[[List[Any]], float], leaves: List[Any], eps: float = 1e-6
                       ) -> Dict[int, torch.Tensor]:
    """d projected(leaves) / d leaf k by central differences in float64, for every floating tensor leaf k.
    `projected` runs under PlainCopies(torch.float64): tracers the function closes over are float64 copies."""
    inputs = [plain_copy(x, torch.float64) if isinstance(x, torch.Tensor) else x for x in leaves]

    def at(values: List[Any]) -> float:
        with PlainCopies(torch.float64):
            return projected(values)

    grads = {}
    with torch.no_grad():
        for k, x in enumerate(inputs):
            if not (isinstance(x, torch.Tensor) and x.is_floating_point()):
                continue
            flat, numeric = x.view(-1), torch.zeros(x.numel(), dtype=torch.float64)
            for i in range(flat.numel()):
                original = flat[i].item()
                flat[i] = original + eps
                plus = at(inputs)
                flat[i] = original - eps
                minus = at(inputs)
                flat[i] = original
                numeric[i] = (plus - minus) / (2 * eps)
            grads[k] = numeric.view(x.shape)
    return grads
