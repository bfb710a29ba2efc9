"""Names the inspection tools give tensors and modules: parameter names from a model or a dict, module paths.

A module of the given model is named by its attribute path (`blocks.0.attn`); another one by its class
name, numbered (`Linear_0`), inside the module that ran around it.
"""
from typing import Any, Callable, Dict, Iterable, List, Mapping, Sequence, Tuple, Union

import torch

from torchtrace.autograd.node import AccumulateGrad

Path = Tuple[str, ...]  # a module's place in the model: ("blocks", "0", "attn"); () is the top level
Params = Union[None, torch.nn.Module, Mapping[str, torch.Tensor], Iterable[Tuple[str, torch.Tensor]]]


PARAMS_KINDS = "a torch.nn.Module, a dict name -> tensor, (name, tensor) pairs or a list of tensors"


def named_pairs(tool: str, params: Any, unnamed: Callable[[int, Any], str] = lambda i, _: f"param{i}"
                ) -> List[Tuple[Any, Any]]:
    """The (name, tensor) pairs of `params` given as a dict, (name, tensor) pairs or tensors (tensor i named
    unnamed(i, tensor): param0, param1, ...); None gives none. Anything else (a number, one tensor, a string) is a
    TypeError naming the tool."""
    if params is None:
        return []
    if isinstance(params, Mapping):
        return list(params.items())
    if isinstance(params, (str, bytes, torch.Tensor)) or not isinstance(params, Iterable):
        hint = " (one tensor: put it in a list, [w])" if isinstance(params, torch.Tensor) else ""
        raise TypeError(f"{tool}: params names the tensors: {PARAMS_KINDS}, not {type(params).__name__}{hint}")
    items = list(params)
    if items and all(isinstance(item, torch.Tensor) for item in items):
        return [(unnamed(i, t), t) for i, t in enumerate(items)]
    for item in items:
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], torch.Tensor)):
            raise TypeError(f"{tool}: params names the tensors: {PARAMS_KINDS}; one of its items is {item!r}")
    return items


class Names:
    """Tensor names (id(tensor) -> "conv.0.weight"), named intermediate tensors, and module paths."""

    def __init__(self, params: Params, tool: str = "params") -> None:
        self.tensors: Dict[int, str] = {}
        self.results: Dict[Tuple[Any, int], Tuple[str, torch.Tensor]] = {}  # (node, output nr) -> (name, tensor)
        self.modules: Dict[int, Path] = {}
        self.kinds: Dict[Path, str] = {}  # module path -> its class name, for cluster labels
        self._unknown: Dict[str, int] = {}
        if isinstance(params, torch.nn.Module):
            for name, module in params.named_modules(remove_duplicate=False):
                self.modules.setdefault(id(module), split_name(name))
                self.kinds.setdefault(split_name(name), type(module).__name__)
            pairs: Iterable[Tuple[str, torch.Tensor]] = params.named_parameters(remove_duplicate=False)
        else:
            pairs = named_pairs(tool, params)
        for name, tensor in pairs:
            node = getattr(tensor, "_tt_node", None)
            if node is not None:  # a named intermediate result (micrograd's `e = a * b`)
                self.results.setdefault((node, tensor._tt_nr), (name, tensor))
            else:
                self.tensors.setdefault(id(tensor), name)

    def adopt(self, variables: Mapping[str, Any], order: List[Any]) -> None:
        """Tensors of the graph (leaves of `order`, or results of its nodes) that the caller holds in variables, and
        that nothing named yet, take the variables' names (those starting with `_` are skipped: IPython's `_1`)."""
        nodes, leaves = set(order), {id(n.variable) for n in order if isinstance(n, AccumulateGrad)}
        for name, value in variables.items():
            if name.startswith("_") or not isinstance(value, torch.Tensor) or not hasattr(type(value), "_tt_node"):
                continue
            node = value._tt_node
            if node is None and id(value) in leaves:
                self.tensors.setdefault(id(value), name)
            elif node in nodes:
                self.results.setdefault((node, value._tt_nr), (name, value))

    def module_path(self, module: torch.nn.Module, outer: Sequence[torch.nn.Module] = ()) -> Path:
        """A module of the given model gets its attribute path; another one its class name (`Linear_0`,
        numbered) inside the innermost module of `outer` (the modules running around it, outermost first)."""
        path = self.modules.get(id(module))
        if path is None:
            base = self.module_path(outer[-1], outer[:-1]) if outer else ()
            kind = type(module).__name__
            self._unknown[kind] = self._unknown.get(kind, -1) + 1
            path = self.modules[id(module)] = (*base, f"{kind}_{self._unknown[kind]}")
            self.kinds[path] = kind
            for name, p in module.named_parameters(recurse=False):
                self.tensors.setdefault(id(p), ".".join((*path, name)))
        return path


def split_name(name: str) -> Path:
    return tuple(name.split(".")) if name else ()


def place_nodes(order: List[Any], names: Names) -> Dict[Any, Path]:
    """Every node's module: an op's from `node.module_path`, a parameter's from its name."""
    place: Dict[Any, Path] = {}
    for node in reversed(order):  # producers first, so modules are named before their parameters are placed
        if not isinstance(node, AccumulateGrad):
            stack = node.module_path
            place[node] = names.module_path(stack[-1], stack[:-1]) if stack else ()
    for node in order:
        if isinstance(node, AccumulateGrad):
            place[node] = split_name(names.tensors.get(id(node.variable), ""))[:-1]
    return place
