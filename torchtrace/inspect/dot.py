"""tt.draw: the recorded graph as a graphviz.Digraph (op nodes, shapes, named parameters, saved tensors,
gradient norms, modules as clusters), displayed inline by Jupyter and rendered by Graphviz's `dot`.

Every walk here is iterative (the engine's `_topological_order` plus plain loops): graphs of 100,000
nodes are drawn without recursion. Rendering that many nodes with `dot` is slow; `depth=` collapses
modules into one box each.
"""
import contextlib
import itertools
import os
import weakref
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Set, Tuple, Union

import graphviz
import torch
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

from torchtrace.autograd.engine import topological_order
from torchtrace.autograd.node import AccumulateGrad, leaf_accumulator
from torchtrace.autograd.state import observing

_guard = torch._C.DisableTorchFunctionSubclass
Path = Tuple[str, ...]  # a module's place in the model: ("blocks", "0", "attn"); () is the top level
Params = Union[None, torch.nn.Module, Mapping[str, torch.Tensor], Iterable[Tuple[str, torch.Tensor]]]

COLOURS = {"parameter": "lightblue", "input": "lightgrey", "op": "white", "output": "palegreen",
           "saved": "orange", "module": "lavender"}
VANISHING, EXPLODING = 1e-7, 1e3  # gradient norms outside these bounds get a red border
INSTALL_HINT = (
    "Graphviz's `dot` program was not found on PATH, so no image was rendered. Install Graphviz "
    "(Debian/Ubuntu: apt-get install graphviz; macOS: brew install graphviz; conda: conda install -c "
    "conda-forge graphviz; others: https://graphviz.org/download/), or render the DOT source elsewhere "
    "with `dot -Tsvg graph.gv -o graph.svg`."
)

# node -> (|grad| of each of its outputs, {input key: |grad| sent along that input edge}); see recording
GRAD_NORMS: "weakref.WeakKeyDictionary[Any, Tuple[List[Optional[float]], Dict[Any, float]]]" = (
    weakref.WeakKeyDictionary()
)
# node -> the modules whose forward was running when it was recorded, outermost first (() outside any); see recording
SCOPES: "weakref.WeakKeyDictionary[Any, Tuple[torch.nn.Module, ...]]" = weakref.WeakKeyDictionary()


class DotNotFound(graphviz.ExecutableNotFound):
    """Raised by `Drawing.render` without Graphviz's `dot`; the DOT source was written all the same."""

    def __init__(self, source_path: Optional[str]) -> None:
        RuntimeError.__init__(self, f"{INSTALL_HINT}\nThe DOT source was written to {source_path}.")
        self.source_path = source_path


class Drawing(graphviz.Digraph):
    """The Digraph that tt.draw returns: Jupyter shows it as SVG; `.render(...)` writes SVG/PNG via `dot`.

    Without `dot`, `.render` keeps the DOT source file and raises DotNotFound saying how to install
    Graphviz, and Jupyter shows the DOT source with that message instead of a traceback.
    """

    def render(self, *args: Any, **kwargs: Any) -> str:
        try:
            return super().render(*args, **kwargs)
        except graphviz.ExecutableNotFound as missing:
            path = self.filepath if os.path.exists(self.filepath) else None
            raise DotNotFound(path) from missing

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None, **kwargs: Any) -> Dict[str, Any]:
        try:
            return super()._repr_mimebundle_(include, exclude, **kwargs)
        except graphviz.ExecutableNotFound:
            return {"text/plain": f"{INSTALL_HINT}\n\n{self.source}"}


def _norm(g: Any, shape: Optional[torch.Size] = None) -> Optional[float]:
    """The 2-norm of a gradient (summed to `shape` as the engine does), computed without recording."""
    if not isinstance(g, torch.Tensor):
        return None
    with _guard():
        g = g.detach()
        if shape is not None and g.shape != shape:
            g = g.sum_to_size(shape)
        return g.double().norm().item()


def _observe_backward(node: Any, grads_in: Sequence[Any], grads_out: Sequence[Any]) -> None:
    edges = {}
    for key, _, _, shape, _ in node.edges:
        try:
            g = grads_out[key] if type(key) is int else grads_out[key[0]][key[1]]
        except (IndexError, TypeError):
            continue
        if g is not None:
            edges[key] = _norm(g, shape)
    GRAD_NORMS[node] = ([_norm(g) for g in grads_in], edges)


@contextlib.contextmanager
def recording() -> Iterator[None]:
    """Inside the block, remember which module made each node and the gradient norms of each backward.

        with recording():
            loss = model(x)
            loss.backward()
        tt.draw(loss, model)   # exact module clusters; op nodes and edges show |grad|

    Without it, tt.draw still places nodes in modules (from the layers' labels and parameters, a best
    guess for ops written in a container's forward) and shows the leaves' |grad|. Module scopes come
    from torch's global module forward hooks, gradients from the engine's ON_BACKWARD observer; both
    are kept weakly per node (SCOPES, GRAD_NORMS), and a later backward overwrites the norms.
    """
    stack: List[torch.nn.Module] = []
    current: List[Tuple[torch.nn.Module, ...]] = [()]

    def enter(module: torch.nn.Module, args: Any) -> None:
        stack.append(module)
        current[0] = tuple(stack)

    def leave(module: torch.nn.Module, args: Any, result: Any) -> None:
        if stack and stack[-1] is module:
            stack.pop()
            current[0] = tuple(stack)

    def on_record(node: Any, args: Any, kwargs: Any, result: Any) -> None:
        SCOPES[node] = current[0]

    handles = [register_module_forward_pre_hook(enter), register_module_forward_hook(leave, always_call=True)]
    try:
        with observing(on_record=on_record, on_backward=_observe_backward):
            yield
    finally:
        for handle in handles:
            handle.remove()


# ----------------------------------------------------------------------------------------------- names


class _Names:
    """Parameter names (id(tensor) -> "conv.0.weight") and module paths (module -> ("conv", "0"))."""

    def __init__(self, params: Params) -> None:
        self.tensors: Dict[int, str] = {}
        self.modules: Dict[int, Path] = {}
        self.kinds: Dict[Path, str] = {}  # module path -> its class name, for cluster labels
        self._unknown: Dict[str, int] = {}
        if isinstance(params, torch.nn.Module):
            for name, module in params.named_modules(remove_duplicate=False):
                self.modules.setdefault(id(module), _split(name))
                self.kinds.setdefault(_split(name), type(module).__name__)
            pairs: Iterable[Tuple[str, torch.Tensor]] = params.named_parameters(remove_duplicate=False)
        elif isinstance(params, Mapping):
            pairs = params.items()
        else:
            pairs = params or ()
        for name, tensor in pairs:
            self.tensors.setdefault(id(tensor), name)

    def module_path(self, module: torch.nn.Module, outer: Sequence[torch.nn.Module] = ()) -> Path:
        """A module of the given model gets its attribute path; another one a made-up name (`Linear_0`)
        inside the innermost known module of `outer` (the modules running around it, outermost first)."""
        path = self.modules.get(id(module))
        if path is None:
            base = next((self.module_path(m, outer[:i]) for i, m in reversed(list(enumerate(outer)))), ())
            kind = type(module).__name__
            self._unknown[kind] = self._unknown.get(kind, -1) + 1
            path = self.modules[id(module)] = (*base, f"{kind}_{self._unknown[kind]}")
            self.kinds[path] = kind
            for name, p in module.named_parameters(recurse=False):
                self.tensors.setdefault(id(p), ".".join((*path, name)))
        return path


def _split(name: str) -> Path:
    return tuple(name.split(".")) if name else ()


def _common(paths: Iterable[Path]) -> Path:
    paths = list(paths)
    if not paths:
        return ()
    first = paths[0]
    if all(p == first for p in paths):
        return first
    length = min(len(p) for p in paths)
    for p in paths[1:]:
        length = next((i for i in range(length) if p[i] != first[i]), length)
    return first[:length]


# ------------------------------------------------------------------------------------ module placement


def _place_nodes(order: List[Any], names: _Names) -> Dict[Any, Path]:
    """The module path of every node.

    Exact for nodes recorded inside `recording()`. Otherwise a best guess, since only a layer's output
    node carries `node.module`: a node labelled by a layer, or taking parameters directly, belongs to
    that layer; any other node to the deepest module shared by the layers that produced its inputs
    and those that consume its output (a layer's output has left the layer); and a node that leaves a
    module and feeds back into it (a residual add inside a block) to that module.
    """
    forward = order[::-1]  # producers before consumers
    for node in forward:  # name the modules first, so their parameters are known before the leaves are placed
        if SCOPES.get(node):
            names.module_path(SCOPES[node][-1], SCOPES[node][:-1])
        elif getattr(node, "module", None) is not None:
            names.module_path(node.module)
    place: Dict[Any, Path] = {}
    layers: Set[Any] = set()  # nodes placed as a layer's output: the data leaves the layer after them
    guessed: List[Any] = []
    consumers: Dict[Any, List[Any]] = {}

    def outside(node: Any) -> Path:
        return place[node][:-1] if node in layers else place[node]

    for node in forward:
        producers = [nxt for _, nxt, *_ in node.edges if not isinstance(nxt, AccumulateGrad)]
        for nxt in producers:
            consumers.setdefault(nxt, []).append(node)
        owned = [_split(names.tensors[id(nxt.variable)])[:-1] for _, nxt, *_ in node.edges
                 if isinstance(nxt, AccumulateGrad) and id(nxt.variable) in names.tensors]
        if isinstance(node, AccumulateGrad):
            place[node] = _split(names.tensors.get(id(node.variable), ""))[:-1]
        elif node in SCOPES:
            place[node] = names.module_path(SCOPES[node][-1]) if SCOPES[node] else ()
        elif node.module is not None or owned:
            place[node] = names.module_path(node.module) if node.module is not None else _common(owned)
            layers.add(node)
        else:
            place[node] = _common([outside(p) for p in producers])
            guessed.append(node)
    for node in reversed(guessed):  # consumers first: where does the data go next?
        if node in consumers:
            place[node] = _deeper(place[node], _common([outside(c) for c in consumers[node]]))
    for node in guessed:
        best = place[node]
        exits = {outside(nxt) for _, nxt, *_ in node.edges if not isinstance(nxt, AccumulateGrad)}
        for a, b in itertools.product(exits, {outside(c) for c in consumers.get(node, ())}):
            common = _common([a, b])
            if len(common) > len(best) and common[:len(best)] == best:
                best = common
        place[node] = best
    return place


def _deeper(a: Path, b: Path) -> Path:
    """The deeper of two nested paths; their common module when they are not nested."""
    if b[:len(a)] == a:
        return b
    return a if a[:len(b)] == b else _common([a, b])


# -------------------------------------------------------------------------------------------- drawing


def _shape(shape: Any) -> str:
    return "(" + ", ".join(str(s) for s in shape) + ")"


def _fmt(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.2e}"


def _flagged(value: Optional[float]) -> bool:
    return value is not None and (value < VANISHING or value > EXPLODING)


class _Builder:
    """Collects node and edge statements per cluster, then assembles the nested subgraphs."""

    def __init__(self, names: _Names, place: Dict[Any, Path], depth: Optional[int], gradient_view: bool) -> None:
        self.names, self.place, self.depth, self.gradient_view = names, place, depth, gradient_view
        self.statements: Dict[Path, List[str]] = {}  # node ids per module path
        self.attrs: Dict[str, Dict[str, str]] = {}
        self.edges: Dict[Tuple[str, str], Dict[str, str]] = {}
        self.boxes: Dict[Path, Dict[str, Any]] = {}
        self.ids: Dict[Any, str] = {}
        self.counter = itertools.count()

    def box_of(self, path: Path) -> Optional[Path]:
        if self.depth is not None and path and len(path) >= self.depth:
            return path[:self.depth]
        return None

    def add_node(self, path: Path, label: str, colour: str, **attrs: str) -> str:
        node_id = f"n{next(self.counter)}"
        self.attrs[node_id] = {"label": label, "fillcolor": colour, **attrs}
        self.statements.setdefault(path, []).append(node_id)
        return node_id

    def add_edge(self, src: str, dst: str, **attrs: str) -> None:
        if src != dst:
            self.edges.setdefault((src, dst), attrs)

    def box(self, box: Path, node: Any, grad: Optional[float], is_output: bool) -> str:
        """The collapsed module `box` that `node` disappears into (counted in its label)."""
        info = self.boxes.get(box)
        if info is None:
            node_id = self.add_node(box[:-1], "", COLOURS["module"], shape="box3d")
            info = self.boxes[box] = {"id": node_id, "ops": 0, "params": 0, "grad2": None}
        if isinstance(node, AccumulateGrad):
            info["params"] += 1
            if grad is not None:
                info["grad2"] = (info["grad2"] or 0.0) + grad * grad
        else:
            info["ops"] += 1
        if is_output:
            self.attrs[info["id"]]["fillcolor"] = COLOURS["output"]
        return info["id"]

    def finish_boxes(self) -> None:
        for box, info in self.boxes.items():
            kind = self.names.kinds.get(box, "")
            label = f"{'.'.join(box)}{f' ({kind})' if kind else ''}\n{info['ops']} ops, {info['params']} parameters"
            if info["grad2"] is not None:
                label += f"\n|grad| params {_fmt(info['grad2'] ** 0.5)}"
            self.attrs[info["id"]]["label"] = label

    def assemble(self, graph: graphviz.Digraph) -> None:
        """Nested `cluster_*` subgraphs, deepest first (graphviz copies a subgraph's body when attached)."""
        paths = set(self.statements)
        for path in list(paths):
            paths.update(path[:i] for i in range(1, len(path)))
        paths.discard(())
        clusters = {}
        for i, path in enumerate(sorted(paths)):
            kind = self.names.kinds.get(path, "")
            clusters[path] = graphviz.Digraph(name=f"cluster_{i}", graph_attr={
                "label": ".".join(path) + (f" ({kind})" if kind else ""), "style": "rounded,dashed",
                "color": "grey40", "fontcolor": "grey30"})
        for path, items in self.statements.items():
            target = clusters[path] if path else graph
            for node_id in items:
                target.node(node_id, **self.attrs[node_id])
        for path in sorted(paths, key=len, reverse=True):
            (clusters[path[:-1]] if len(path) > 1 else graph).subgraph(clusters[path])
        for (src, dst), attrs in self.edges.items():
            graph.edge(src, dst, **attrs)


def _roots(outputs: Sequence[Any]) -> List[Any]:
    roots = []
    for t in outputs:
        if getattr(t, "_tt_requires_grad", False):
            roots.append(t._tt_node if t._tt_node is not None else leaf_accumulator(t))
    return list(dict.fromkeys(roots))


def _output_shapes(order: List[Any], outputs: Sequence[Any]) -> Dict[Tuple[Any, int], torch.Size]:
    """(node, output nr) -> shape, read off the edges of the nodes that consume it (nodes keep no output)."""
    shapes: Dict[Tuple[Any, int], torch.Size] = {}
    for t in outputs:
        if getattr(t, "_tt_node", None) is not None:
            shapes[(t._tt_node, t._tt_nr)] = t.shape
    for node in order:
        for _, nxt, nr, shape, _ in node.edges:
            shapes.setdefault((nxt, nr), shape)
        for nr, meta in enumerate(getattr(node, "out_meta", None) or ()):
            shapes.setdefault((node, nr), meta[0])
    return shapes


def _op_label(node: Any, shapes: Dict[Tuple[Any, int], torch.Size]) -> str:
    outs = [_shape(shapes[(node, nr)]) for nr in range(node.n_outputs) if (node, nr) in shapes]
    return f"{node.rule.__name__}\n{' '.join(outs)}"


def _leaf(node: AccumulateGrad, names: _Names) -> Tuple[str, str, Optional[float]]:
    """(label, colour, |grad|) of a leaf: its parameter name when known, else "input"."""
    leaf = node.variable
    name = names.tensors.get(id(leaf))
    kind = "parameter" if name is not None or isinstance(leaf, torch.nn.Parameter) else "input"
    grad = _norm(leaf.grad)
    return f"{name or kind}\n{_shape(leaf.shape)}", COLOURS[kind], grad


def draw(
    output: Union[torch.Tensor, Sequence[torch.Tensor]],
    params: Params = None,
    depth: Optional[int] = None,
    show_saved: bool = True,
    direction: str = "auto",
) -> Drawing:
    """The graph that produced `output` as a graphviz.Digraph (a Drawing: shown inline in Jupyter).

    - Op nodes show the rule's name and the output shape; leaves show their parameter name (from
      `params`: a torch.nn.Module, a dict name -> tensor, or (name, tensor) pairs; parameters of
      tt.nn layers are named after the layer even without it), else "input", and their shape.
      Colours: blue parameters, grey inputs, white ops, green the output, orange saved tensors,
      lavender collapsed modules. A red border marks |grad| below 1e-7 or above 1e3.
    - Modules are drawn as clusters (`cluster_*` subgraphs, labelled with the module path);
      `depth=k` collapses every module k levels deep into one box (its ops and parameters counted).
    - direction="forward": arrows follow the data, inputs -> output (the default before backward).
      direction="backward": arrows follow the gradient, output -> leaves, and show |grad| (the default
      once a backward went through the graph). Leaves show their .grad; a backward run inside
      `recording()` also labels the op nodes and the edges with the gradient that flowed through them.
    - show_saved draws each tensor an op saved for backward (until backward frees them), dashed.
    """
    if direction not in ("auto", "forward", "backward"):
        raise ValueError(f"direction must be 'auto', 'forward' or 'backward', not {direction!r}")
    if depth is not None and depth < 1:
        raise ValueError(f"depth must be a positive module depth (1 = top-level modules), not {depth}")
    outputs = [output] if isinstance(output, torch.Tensor) else list(output)
    names = _Names(params)
    roots = _roots(outputs)
    order = topological_order(roots)
    gradient_view = direction == "backward" or (direction == "auto" and _backward_ran(order))
    graph = Drawing(name="torchtrace", graph_attr={"rankdir": "TB", "labelloc": "b", "fontsize": "10"},
                    node_attr={"shape": "box", "style": "filled,rounded", "fontsize": "10", "fontname": "Helvetica"},
                    edge_attr={"fontsize": "9", "fontname": "Helvetica"})
    graph.attr(label=_legend(gradient_view))
    if not roots:
        graph.node("empty", "nothing recorded: the output does not require grad", fillcolor="white")
        return graph
    builder = _Builder(names, _place_nodes(order, names), depth, gradient_view)
    _add_nodes(builder, order, set(roots), _output_shapes(order, outputs), show_saved)
    _add_edges(builder, order)
    builder.finish_boxes()
    builder.assemble(graph)
    return graph


def _backward_ran(order: List[Any]) -> bool:
    """Did a backward go through this graph? (It freed the saved tensors, or `recording()` saw it.)

    A graph that saved nothing counts as back-propagated once its leaves have gradients; a fresh
    forward after earlier training steps (old .grad on the parameters, saved tensors held) does not.
    """
    ops = [n for n in order if not isinstance(n, AccumulateGrad)]
    if any(n.released or n in GRAD_NORMS for n in ops):
        return True
    leaves_have_grads = any(n.variable.grad is not None for n in order if isinstance(n, AccumulateGrad))
    return leaves_have_grads and not any(n.saved for n in ops)


def _legend(gradient_view: bool) -> str:
    arrows = ("gradient flow: arrows go from the output back to the leaves, labelled |grad|" if gradient_view
              else "forward view: arrows follow the data, from the inputs to the output")
    return (f"{arrows}\nblue: parameters   grey: inputs   white: ops   green: output   orange: saved tensors   "
            "lavender: collapsed modules   red border: |grad| < 1e-7 or > 1e3")


def _add_nodes(builder: _Builder, order: List[Any], roots: Set[Any], shapes: Dict[Tuple[Any, int], torch.Size],
               show_saved: bool) -> None:
    for node in order:
        path = builder.place[node]
        if isinstance(node, AccumulateGrad):
            label, colour, grad = _leaf(node, builder.names)
        else:
            outs = GRAD_NORMS.get(node, ([], {}))[0]
            grad = _total_norm(outs)
            label, colour = _op_label(node, shapes), COLOURS["output" if node in roots else "op"]
        box = builder.box_of(path)
        if box is not None:
            builder.ids[node] = builder.box(box, node, grad, node in roots)
            continue
        attrs = {"color": "red", "penwidth": "2"} if _flagged(grad) else {}
        if grad is not None:
            label += f"\n|grad| {_fmt(grad)}"
        if node in roots and isinstance(node, AccumulateGrad):
            colour = COLOURS["output"]
        builder.ids[node] = builder.add_node(path, label, colour, **attrs)
        if show_saved and not isinstance(node, AccumulateGrad):
            _add_saved(builder, node, path)


def _total_norm(outs: List[Optional[float]]) -> Optional[float]:
    known = [g for g in outs if g is not None]
    return sum(g * g for g in known) ** 0.5 if known else None


def _add_saved(builder: _Builder, node: Any, path: Path) -> None:
    for tensor in node.saved:
        if isinstance(tensor, torch.Tensor):
            name = builder.names.tensors.get(id(tensor))
            label = f"saved{' ' + name if name else ''}\n{_shape(tensor.shape)}"
            saved_id = builder.add_node(path, label, COLOURS["saved"], fontsize="8")
            builder.add_edge(saved_id, builder.ids[node], style="dashed", arrowhead="none", color="darkorange")


def _add_edges(builder: _Builder, order: List[Any]) -> None:
    box_ids = {info["id"] for info in builder.boxes.values()}
    for node in order:
        grads = GRAD_NORMS.get(node, ([], {}))[1]
        for key, nxt, _, shape, _ in node.edges:
            src, dst = builder.ids[nxt], builder.ids[node]
            attrs: Dict[str, str] = {}
            if builder.gradient_view:
                src, dst = dst, src
                if key in grads:
                    attrs["label"] = _fmt(grads[key])
            elif nxt.n_outputs > 1 or src in box_ids or dst in box_ids:
                attrs["label"] = _shape(shape)  # which output of a multi-output op, what leaves a box
            builder.add_edge(src, dst, **attrs)

