"""tt.draw: the recorded graph as a graphviz.Digraph (op nodes, shapes, named parameters, saved tensors,
values and gradients, modules as clusters), displayed inline by Jupyter and rendered by Graphviz's `dot`.

Each node is placed in the module it was recorded in (`node.module_path`, kept by the core); names
come from the model passed in, else from class names. Values and intermediate gradients come from
`node.notes` (see values.py). Every walk here is iterative: graphs of 100,000 nodes are drawn without
recursion. Rendering that many nodes with `dot` is slow; `depth=` collapses modules into one box each.
"""
import itertools
import os
import sys
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple, Union

import graphviz
import torch

from torchtrace.autograd.engine import topological_order
from torchtrace.autograd.node import AccumulateGrad, leaf_accumulator
from torchtrace.inspect.construction import zero_leaves
from torchtrace.inspect.names import Names, Params, Path, place_nodes
from torchtrace.inspect.recorded import output_list, require_tracers
from torchtrace.inspect.values import VALUE_LIMIT, Summary, norm_of, number, recording, summary, text, watch

__all__ = ["draw", "recording", "Drawing", "DotNotFound"]


COLOURS = {"parameter": "lightblue", "input": "lightgrey", "op": "white", "output": "palegreen",
           "saved": "orange", "module": "lavender"}
VANISHING, EXPLODING = 1e-7, 1e3  # gradient norms outside these bounds get a red border
WHOLE_UP_TO = 120  # depth="auto": a graph with more nodes is drawn with modules collapsed (as the player starts)
INSTALL_HINT = (
    "Graphviz's `dot` program was not found on PATH, so no image was rendered. Install Graphviz "
    "(Debian/Ubuntu: apt-get install graphviz; macOS: brew install graphviz; conda: conda install -c "
    "conda-forge graphviz; others: https://graphviz.org/download/), or render the DOT source elsewhere "
    "with `dot -Tsvg graph.gv -o graph.svg`."
)


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


# -------------------------------------------------------------------------------------------- drawing


def _shape(shape: Any) -> str:
    return "(" + ", ".join(str(s) for s in shape) + ")"


def _flagged(value: Optional[float]) -> bool:
    return value is not None and (value < VANISHING or value > EXPLODING)


def _record_field(field: str) -> str:
    """Text inside a graphviz record label: its special characters escaped."""
    for char in "\\{}|<>":
        field = field.replace(char, "\\" + char)
    return field


class _Builder:
    """Collects node and edge statements per cluster, then assembles the nested subgraphs."""

    def __init__(self, names: Names, place: Dict[Any, Path], depth: Optional[int], gradient_view: bool,
                 values: bool) -> None:
        self.names, self.place, self.depth, self.gradient_view = names, place, depth, gradient_view
        self.values = values
        self.statements: Dict[Path, List[str]] = {}  # node ids per module path
        self.attrs: Dict[str, Dict[str, str]] = {}
        self.edges: Dict[Tuple[Any, ...], Dict[str, str]] = {}
        self.boxes: Dict[Path, Dict[str, Any]] = {}
        self.ids: Dict[Any, str] = {}
        self.counter = itertools.count()
        self.drawn: Set[str] = set()  # what the legend may mention: colours, "flagged", "edge grads", ...
        self.by_construction: Set[int] = set()  # ids of leaves whose gradient is zero by construction

    def box_of(self, path: Path) -> Optional[Path]:
        if self.depth is not None and path and len(path) >= self.depth:
            return path[:self.depth]
        return None

    def add_node(self, path: Path, label: str, colour: str, **attrs: str) -> str:
        node_id = f"n{next(self.counter)}"
        self.attrs[node_id] = {"label": label, "fillcolor": colour, **attrs}
        self.statements.setdefault(path, []).append(node_id)
        return node_id

    def add_edge(self, key: Tuple[Any, ...], src: str, dst: str, **attrs: str) -> None:
        if src != dst:
            self.edges.setdefault(key, {"tail_name": src, "head_name": dst, **attrs})

    def box(self, box: Path, node: Any, grad: Optional[float], is_output: bool) -> str:
        """The collapsed module `box` that `node` disappears into (counted in its label)."""
        info = self.boxes.get(box)
        if info is None:
            node_id = self.add_node(box[:-1], "", COLOURS["module"], shape="box3d")
            info = self.boxes[box] = {"id": node_id, "ops": 0, "params": 0, "grad2": None}
            self.drawn.add("module")
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
                label += f"\n|grad| params {number(info['grad2'] ** 0.5)}"
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
        for path in sorted(paths, key=lambda p: (-len(p), p)):  # (siblings in order: the same picture every run)
            (clusters[path[:-1]] if len(path) > 1 else graph).subgraph(clusters[path])
        for attrs in self.edges.values():
            graph.edge(**attrs)


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
        for edge in node.edges:
            shapes.setdefault((edge.node, edge.output_nr), edge.shape)
        for nr, meta in enumerate(getattr(node, "output_meta", None) or ()):
            if meta is not None:
                shapes.setdefault((node, nr), meta[0])
    return shapes


def _small_graph(order: List[Any], shapes: Dict[Tuple[Any, int], torch.Size]) -> bool:
    """Every tensor of the graph has at most VALUE_LIMIT elements: values are shown by default."""
    sizes = [torch.Size(s).numel() for s in shapes.values()]
    sizes += [n.variable.numel() for n in order if isinstance(n, AccumulateGrad)]
    return bool(sizes) and max(sizes) <= VALUE_LIMIT


def _uses(order: List[Any]) -> Dict[Any, int]:
    """How many gradients the most used output of each node receives (one per edge that points at it).

    Several gradients reaching one output are summed; the outputs of a multi-output op (split) each
    get their own.
    """
    per_output: Dict[Tuple[Any, int], int] = {}
    for node in order:
        for edge in node.edges:
            key = (edge.node, edge.output_nr)
            per_output[key] = per_output.get(key, 0) + 1
    uses: Dict[Any, int] = {}
    for (node, _), n in per_output.items():
        uses[node] = max(uses.get(node, 0), n)
    return uses


def _values_of(node: Any, nr: int, names: Names, outputs: Dict[Tuple[Any, int], torch.Tensor]
               ) -> Tuple[Optional[str], Summary, Summary, bool]:
    """(name, value, gradient, changed) of one output of a node, from what is known about it; None where unknown.
    A named or given result changed in place after its op (under no_grad) holds another value than the op made:
    `changed`, and its value is a copy noted when the op ran, or unknown."""
    if isinstance(node, AccumulateGrad):  # (its grad: what the last backward added, where .grad summed more)
        leaf, added = node.variable, (node.notes or {}).get("added")
        return names.tensors.get(id(leaf)), summary(leaf), summary(leaf.grad if added is None else added), False
    notes = node.notes or {}
    name, tensor = names.results.get((node, nr), (None, outputs.get((node, nr))))
    changed = tensor is not None and tensor._version != tensor._tt_version
    value = summary(tensor) if tensor is not None and not changed else notes.get("values", {}).get(nr)
    grad = notes.get("grads", {}).get(nr)
    if grad is None and name is not None:
        grad = summary(tensor.grad if tensor.retains_grad else None)  # a named tensor that called retain_grad()
    return name, value, grad, changed


def draw(
    output: Union[torch.Tensor, Sequence[torch.Tensor]],
    params: Params = None,
    depth: Union[int, None, str] = "auto",
    show_saved: bool = True,
    direction: str = "auto",
    values: Optional[bool] = None,
    rankdir: str = "TB",
) -> Drawing:
    """The graph that produced `output` as a graphviz.Digraph (a Drawing: shown inline in Jupyter).

    - Op nodes show the rule's name and the output shape; leaves show their name (from `params`: a
      torch.nn.Module, a dict name -> tensor, or (name, tensor) pairs; a named intermediate result
      names its op's output too), else "parameter"/"input", and their shape. Colours: blue
      parameters, grey inputs, white ops, green the output, orange saved tensors, lavender collapsed
      modules. A red border marks |grad| below 1e-7 or above 1e3; a grey dashed one a gradient that is zero
      by construction (a bias right before a batch norm: the normalisation removes any constant per channel).
    - values=True draws micrograd's "name | data | grad" boxes: each tensor's value and, after a
      backward, its gradient (tensors of more than 4 elements by their norm, `|grad| 0.336`). The
      default (None) does so when every tensor of the graph has at most 4 elements. Leaves and the
      output always have their values; an intermediate op has its value when its forward ran inside
      `tt.recording()` (or it is named in `params`), and its gradient for every backward that ran
      after `tt.draw` or `tt.recording()` hooked it (a plain `backward()` will do).
    - A tensor used several times receives one gradient per use, summed: its node says
      "⊕ sums N gradients" and has one arrow per use.
    - Modules are drawn as clusters labelled with the module path (`node.module_path`, named from
      the model in `params`, else by class name); `depth=k` collapses every module k levels deep into
      one box (its ops and parameters counted). The default, depth="auto", draws a graph of more than
      120 nodes with its modules collapsed, as deep as keeps it at about 120 boxes (the footer says so and
      how to open them); depth=None draws every op.
    - direction="forward": arrows follow the data, inputs -> output (the default before backward).
      direction="backward": arrows follow the gradient, output -> leaves (the default once a
      backward went through the graph); a backward run inside `tt.recording()` labels each arrow
      with the gradient it carried.
    - show_saved draws each tensor an op saved for backward (until backward frees them), dashed.
    - rankdir="LR" lays the graph out left to right (micrograd's draw_dot), "TB" (the default) top to bottom.
    - After a plain `backward()` through a tiny graph (micrograd's examples: at most 64 nodes, no tensor of
      more than 4 elements) every op has its gradient and the values its rules saved. In the values
      view, tensors the caller holds in variables (`e = a * b`) are named by them when `params` is None,
      so `tt.draw(L)` after `L.backward()` is micrograd's picture, every value and gradient in it.
    """
    if direction not in ("auto", "forward", "backward"):
        raise ValueError(f"direction must be 'auto', 'forward' or 'backward', not {direction!r}")
    if rankdir not in ("TB", "LR", "BT", "RL"):
        raise ValueError(f"rankdir must be 'TB', 'LR', 'BT' or 'RL', not {rankdir!r}")
    if depth is not None and depth != "auto" and (isinstance(depth, str) or depth < 1):
        raise ValueError(f"depth must be a positive module depth (1 = top-level modules), not {depth}")
    outputs = output_list("tt.draw", output)
    require_tracers("tt.draw", outputs)
    names = Names(params, "tt.draw")
    roots = _roots(outputs)
    order = topological_order(roots)
    for node in order:
        watch(node)  # so that a later backward leaves each node's gradient for the next drawing
    gradient_view = direction == "backward" or (direction == "auto" and _backward_ran(order))
    graph = Drawing(name="torchtrace", graph_attr={"rankdir": rankdir, "labelloc": "b", "fontsize": "10"},
                    node_attr={"shape": "box", "style": "filled,rounded", "fontsize": "10", "fontname": "Helvetica"},
                    edge_attr={"fontsize": "9", "fontname": "Helvetica"})
    if not roots:
        graph.node("empty", "nothing recorded: the output does not require grad", fillcolor="white")
        return graph
    shapes = _output_shapes(order, outputs)
    show_values = _small_graph(order, shapes) if values is None else values
    if show_values and params is None:
        names.adopt(sys._getframe(1).f_locals, order)
    place = place_nodes(order, names)
    auto = depth == "auto"
    depth = _auto_depth(order, place) if auto else depth
    builder = _Builder(names, place, depth, gradient_view, show_values)
    if gradient_view:
        builder.by_construction = set(zero_leaves(order))
    given = {(t._tt_node, t._tt_nr): t for t in outputs if getattr(t, "_tt_node", None) is not None}
    _add_nodes(builder, order, set(roots), shapes, given, show_saved)
    _add_edges(builder, order)
    builder.finish_boxes()
    builder.assemble(graph)
    collapsed = _collapsed_note(order, place, depth) if auto and depth is not None else ""
    graph.attr(label=_legend(builder) + collapsed)
    graph.collapsed_depth = depth if auto else None  # the depth "auto" chose (None: drawn whole)
    return graph


def _boxes_at(paths: List[Path], depth: int) -> int:
    """How many boxes a drawing collapsed `depth` levels deep has (ops outside such modules, and the modules)."""
    return sum(1 for p in paths if len(p) < depth) + len({p[:depth] for p in paths if len(p) >= depth})


def _auto_depth(order: List[Any], place: Dict[Any, Path]) -> Optional[int]:
    """None for a graph of at most WHOLE_UP_TO nodes (or without modules): drawn whole. Else the deepest module
    depth whose drawing has at most WHOLE_UP_TO boxes; 1 (top-level modules) when none has."""
    paths = [place[n] for n in order]
    deepest = max((len(p) for p in paths), default=0)
    if len(order) <= WHOLE_UP_TO or not deepest:
        return None
    return next((d for d in range(deepest, 1, -1) if _boxes_at(paths, d) <= WHOLE_UP_TO), 1)


def _collapsed_note(order: List[Any], place: Dict[Any, Path], depth: int) -> str:
    """The footer's line on a graph drawn collapsed: why, and how to open it."""
    deeper = "" if depth >= max(len(place[n]) for n in order) else f", depth={depth + 1} opens one more level"
    return (f"\n{len(order)} nodes: modules {depth} level{'s' if depth > 1 else ''} deep drawn collapsed, one box "
            f"each (more than {WHOLE_UP_TO} nodes); tt.draw(..., depth=None) draws every op{deeper}")


def _backward_ran(order: List[Any]) -> bool:
    """Did a backward go through this graph? (It freed the saved tensors, or a hooked node saw its gradient.)

    A graph that saved nothing counts as back-propagated once its leaves have gradients; a fresh
    forward after earlier training steps (old .grad on the parameters, saved tensors held) does not.
    """
    ops = [n for n in order if not isinstance(n, AccumulateGrad)]
    if any(n.released or (n.notes or {}).get("grads") for n in ops):
        return True
    leaves_have_grads = any(n.variable.grad is not None for n in order if isinstance(n, AccumulateGrad))
    return leaves_have_grads and not any(n.saved for n in ops)


_MEANINGS = {"parameter": "blue: parameters", "input": "grey: inputs", "op": "white: ops", "output": "green: output",
             "saved": "orange: saved tensors", "module": "lavender: collapsed modules"}


def _legend(builder: _Builder) -> str:
    """The footer: it explains only what this drawing shows."""
    drawn = builder.drawn
    if builder.gradient_view:
        lines = ["gradient flow: arrows go from the output back to the leaves"
                 + (", labelled with the gradient each carried" if "edge grads" in drawn else "")]
    else:
        lines = ["forward view: arrows follow the data, from the inputs to the output"]
    colours = [meaning for kind, meaning in _MEANINGS.items() if kind in drawn]
    if "flagged" in drawn:
        colours.append(f"red border: |grad| < {VANISHING:g} or > {EXPLODING:g}")
    if "by construction" in drawn:
        colours.append("grey dashed border: gradient zero by construction (a bias right before a batch norm, which "
                       "removes it), not vanishing")
    lines.append("   ".join(colours))
    if "values" in drawn:
        lines.append("data: the tensor's value   grad: the gradient of the output with respect to it"
                     + ("   |x|: a norm, for tensors of more than 4 elements" if "norms" in drawn else ""))
    missing = [text for key, text in (("no data", "ops without data: recorded outside tt.recording()"),
                                      ("changed", "ops without data: their result changed in place after the op"),
                                      ("no grad", "ops without grad: their backward ran before tt.draw or "
                                                  "tt.recording() hooked them")) if key in drawn]
    if missing:
        lines.append("   ".join(missing))
    if "sums" in drawn:
        lines.append("⊕ sums N gradients: a tensor used N times receives one gradient per use, added up")
    if "summed .grad" in drawn:
        lines.append(".grad Σ: the leaf's .grad, which sums the gradients of every backward since it was last zeroed "
                     "(grad: the last backward's)")
    return "\n".join(lines)


def _label(builder: _Builder, header: str, shape: str, value: Summary, grad: Summary, uses: int) -> str:
    summed = f"⊕ sums {uses} gradients" if uses > 1 else ""
    if summed:
        builder.drawn.add("sums")
    if not builder.values:
        grad_norm = norm_of(grad)
        return "\n".join(part for part in (f"{header}\n{shape}", f"|grad| {number(grad_norm)}"
                                           if grad_norm is not None else "", summed) if part)
    builder.drawn.add("values")
    if any(isinstance(v, float) for v in (value, grad)):
        builder.drawn.add("norms")
    fields = [f"{header} {shape}" if shape != "()" else header, text(value, "data"), text(grad, "grad"), summed]
    return " | ".join(_record_field(field) for field in fields if field)


def _add_nodes(builder: _Builder, order: List[Any], roots: Set[Any], shapes: Dict[Tuple[Any, int], torch.Size],
               given: Dict[Tuple[Any, int], torch.Tensor], show_saved: bool) -> None:
    uses = _uses(order)
    for node in order:
        path = builder.place[node]
        leaf = isinstance(node, AccumulateGrad)
        name, value, grad, changed = _values_of(node, 0, builder.names, given)
        if leaf:
            kind = "parameter" if name is not None or isinstance(node.variable, torch.nn.Parameter) else "input"
            header, shape = name or kind, _shape(node.variable.shape)
        else:
            kind = "op"
            header = node.rule.__name__ + (f" → {name}" if name else "")
            shape = " ".join(_shape(shapes[(node, nr)]) for nr in range(node.n_outputs) if (node, nr) in shapes)
            if builder.values and value is None:
                builder.drawn.add("changed" if changed else "no data")
            if builder.values and builder.gradient_view and grad is None:
                builder.drawn.add("no grad")
        kind = "output" if node in roots else kind
        grad_norm = norm_of(grad)
        box = builder.box_of(path)
        if box is not None:
            builder.ids[node] = builder.box(box, node, grad_norm, node in roots)
            continue
        builder.drawn.add(kind)
        attrs = {"shape": "Mrecord"} if builder.values else {}
        if leaf and id(node.variable) in builder.by_construction:
            attrs.update(color="grey40", penwidth="2", style="filled,rounded,dashed")
            builder.drawn.add("by construction")
        elif _flagged(grad_norm):
            attrs.update(color="red", penwidth="2")
            builder.drawn.add("flagged")
        label = _label(builder, header, shape, value, grad, uses.get(node, 0))
        if leaf and builder.values and (node.notes or {}).get("added") is not None:  # .grad sums earlier backwards
            label += " | " + _record_field(text(summary(node.variable.grad), ".grad") + " Σ")
            builder.drawn.add("summed .grad")
        builder.ids[node] = builder.add_node(path, label, COLOURS[kind], **attrs)
        if show_saved and not leaf:
            _add_saved(builder, node, path)


def _add_saved(builder: _Builder, node: Any, path: Path) -> None:
    for i, tensor in enumerate(node.saved):
        if isinstance(tensor, torch.Tensor):
            name = builder.names.tensors.get(id(tensor))
            label = f"saved{' ' + name if name else ''}\n{_shape(tensor.shape)}"
            saved_id = builder.add_node(path, label, COLOURS["saved"], fontsize="8")
            builder.drawn.add("saved")
            builder.add_edge((saved_id,), saved_id, builder.ids[node], style="dashed", arrowhead="none",
                             color="darkorange")


def _edge_text(value: Summary) -> str:
    """The gradient an arrow carried: its values, or `|grad| x` for a large tensor."""
    return text(value, "grad").removeprefix("grad ")


def _add_edges(builder: _Builder, order: List[Any]) -> None:
    box_ids = {info["id"] for info in builder.boxes.values()}
    for node in order:
        carried = (node.notes or {}).get("edge_grads", {})
        for i, edge in enumerate(node.edges):
            src, dst = builder.ids[edge.node], builder.ids[node]
            boxed = src in box_ids or dst in box_ids
            key = (src, dst) if boxed else (src, dst, i)  # one arrow per use; one per pair of boxes
            attrs: Dict[str, str] = {}
            if builder.gradient_view:
                src, dst = dst, src
                if edge.position in carried and carried[edge.position] is not None:
                    attrs["label"] = _edge_text(carried[edge.position])
                    builder.drawn.add("edge grads")
            elif edge.node.n_outputs > 1 or boxed:
                attrs["label"] = _shape(edge.shape)  # which output of a multi-output op, what leaves a box
            builder.add_edge(key, src, dst, **attrs)
