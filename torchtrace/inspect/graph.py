"""tt.trace(model, *inputs): run once and return the recorded graph (nodes, edges, module paths, shapes)."""
import difflib
import json
from typing import Any, Callable, Dict, List, Tuple

import torch

from torchtrace.autograd.node import AccumulateGrad, Node
from torchtrace.autograd.state import observing
from torchtrace.inspect.scope import module_names, module_scope, path_name
from torchtrace.naming import callable_name
from torchtrace.nested import flatten


class Graph:
    """The ops one run recorded, in creation order. Leaves (parameters, inputs) are nodes too.

    Each node is a dict: id, kind ('op', 'parameter', 'input'), op (rule or leaf name), callable,
    module (dotted path of the module that ran it), shape, dtype. Edges go from producer to consumer.
    """

    def __init__(self, nodes: List[Dict[str, Any]], edges: List[Tuple[int, int]], output: Any, model: Any):
        self.nodes, self.edges, self.output, self.model = nodes, edges, output, model

    def signature(self) -> List[str]:
        """One comparable line per node: op, module and shape."""
        return [f"{n['op']} @{n['module'] or '-'} {n['shape']}" for n in self.nodes]

    def __str__(self) -> str:
        sources: Dict[int, List[int]] = {}
        for src, dst in self.edges:
            sources.setdefault(dst, []).append(src)
        lines = [f"Graph: {len(self.nodes)} nodes, {len(self.edges)} edges"]
        for n in self.nodes:
            inputs = ", ".join(f"#{i}" for i in sources.get(n["id"], []))
            lines.append(f"  #{n['id']:<4} {n['op']:<22} {n['module'] or '-':<20} {str(n['shape']):<18} "
                         f"{n['dtype']:<14} {'<- ' + inputs if inputs else ''}".rstrip())
        return "\n".join(lines)

    __repr__ = __str__

    def to_dict(self) -> Dict[str, Any]:
        """JSON-serialisable nodes and edges."""
        return {"nodes": [dict(n) for n in self.nodes], "edges": [list(e) for e in self.edges]}

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    def diff(self, other: "Graph") -> List[str]:
        """What changed between two runs ('- ' lines only here, '+ ' lines only there); empty if the same."""
        return [line for line in difflib.ndiff(self.signature(), other.signature()) if line[:2] in ("- ", "+ ")]

    def to_code(self) -> str:
        """Python source of this run's forward and its rules' backward, needing only torch (tt.compile's code)."""
        from torchtrace.compiler import to_code

        return to_code(self.model, *self.example_inputs[0], **self.example_inputs[1])

    def draw(self, **options: Any) -> Any:
        """The graph as a graphviz.Digraph (see tt.draw)."""
        from torchtrace.inspect.dot import draw

        return draw(self.output, params=self.model if isinstance(self.model, torch.nn.Module) else None, **options)


def _describe(value: Any) -> Tuple[Any, str]:
    tensors = [t for t in flatten(value if isinstance(value, (list, tuple)) else [value])[0]
               if isinstance(t, torch.Tensor)]
    shapes = [list(t.shape) for t in tensors]
    return (shapes[0] if len(shapes) == 1 else shapes), str(tensors[0].dtype) if tensors else ""


def trace(model: Callable, *example_inputs: Any, **kwargs: Any) -> Graph:
    """Run `model(*example_inputs, **kwargs)` once, recording every op; return the Graph."""
    if not callable(model):
        raise TypeError(f"tt.trace takes the model or function to run, then its example inputs (tt.trace(model, x)), "
                        f"not a {type(model).__name__}")
    names = module_names(model) if isinstance(model, torch.nn.Module) else {}
    params = {id(p): name for name, p in model.named_parameters()} if isinstance(model, torch.nn.Module) else {}
    recorded: List[Tuple[Node, Any]] = []

    def record(node: Node, args: tuple, kw: dict, result: Any) -> None:
        recorded.append((node, result))

    with module_scope(), observing(on_record=record):
        output = model(*example_inputs, **kwargs)
    nodes: List[Dict[str, Any]] = []
    index: Dict[int, int] = {}

    def add(key: Any, entry: Dict[str, Any]) -> int:
        index[id(key)] = entry["id"] = len(nodes)
        nodes.append(entry)
        return entry["id"]

    edges = []
    for node, result in recorded:
        shape, dtype = _describe(result)
        path = path_name(node.module_path, names)
        sources = []
        for _, nxt, _, in_shape, in_dtype in node.edges:
            if id(nxt) not in index and isinstance(nxt, AccumulateGrad):
                name = params.get(id(nxt.variable))
                add(nxt, {"kind": "parameter" if name else "input", "op": name or "input", "callable": "",
                          "module": "", "shape": list(in_shape), "dtype": str(in_dtype)})
            if id(nxt) in index:
                sources.append(index[id(nxt)])
        target = add(node, {"kind": "op", "op": node.rule.__name__, "module": path, "shape": shape, "dtype": dtype,
                            "callable": callable_name(node.func) if node.func else f"{node.rule.__name__}.apply"})
        edges += [(src, target) for src in sources]
    graph = Graph(nodes, edges, output, model)
    graph.example_inputs = (example_inputs, kwargs)
    return graph
