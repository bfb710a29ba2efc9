"""The backward walk's lane: engine._walk for a plain backward (no create_graph, tt.grad capture or watching tool),
with the per-node questions asked once per node and a table rule's backward generated as straight-line code.

A node with hooks, retained gradients, grad_fn hooks, several outputs, autocast state or an untrusted rule takes the
readable step (engine._call_rule and its helpers) inside this same walk; every other node calls its step directly and
sends each edge its gradient as engine._send does.
"""
import linecache
import os
from heapq import heappop, heappush
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from torchtrace.autograd import engine
from torchtrace.autograd.engine import (
    Ownership,
    _as_tuple,
    _call_rule,
    _received,
    _Root,
    _send,
    _unbroadcast,
    accumulate,
    buffer_gradient,
)
from torchtrace.autograd.hooks import non_leaf_hooks
from torchtrace.autograd.node import AccumulateGrad, Contributions, Edge
from torchtrace.autograd.state import LANE_SWITCHES, LANES_ON, STATE
from torchtrace.lanes.forward import _table

_HERE = os.path.dirname(os.path.abspath(__file__))
STEPS: Dict[type, Callable] = {}  # torchtrace's rule -> what the walk calls for its backward (_make_step)


def walk(roots: List[Tuple[Any, int, Any]], retain_graph: bool, create_graph: bool, captured: Optional[dict],
         tracer_type: type) -> None:
    """engine._walk for a backward without create_graph, tt.grad's capture, observers or torch's anomaly mode
(engine._walk with any of them)."""
    if create_graph or captured is not None or STATE.on_backward or torch.is_anomaly_enabled():
        return engine._walk(roots, retain_graph, create_graph, captured, tracer_type)
    buffers: Dict[Any, List[Any]] = {}
    ready: List[Tuple[int, Any]] = []
    _send(_Root([Edge(i, node, nr, g.shape, g.dtype) for i, (node, nr, g) in enumerate(roots)]),
          tuple(g for _, _, g in roots), buffers, ready)
    ownership = Ownership([g for _, _, g in roots], enabled=True)
    previous = STATE.create_graph, STATE.walk
    STATE.create_graph, STATE.walk = False, (retain_graph, None, ownership.hand_out, None)
    try:
        with torch.set_grad_enabled(False), torch._C.DisableTorchFunction():
            while ready:
                node = heappop(ready)[1]
                grads = buffers.pop(node)
                if type(node) is AccumulateGrad:
                    accumulate(node, grads[0], False, None, ownership)
                    continue
                ctx = node.ctx
                step = STEPS.get(node.rule) or _make_step(node.rule)  # None: a user's rule
                if (step is None or node.hooks or node.retained or node.pre_hooks or node.post_hooks or node.autocast
                        or node.output_meta is not None or ctx._n_inputs is not None):
                    result = _readable_step(node, grads, ownership, tracer_type)
                else:
                    result = step(ctx, *grads)
                    if type(result) is not tuple:
                        result = _as_tuple(node, result)
                for edge in node.edges:  # engine._send, written out
                    position, target, nr, shape, dtype = edge
                    try:
                        g = result[position]
                    except (IndexError, TypeError):  # no entry for this input, or an item of a list argument
                        g = _received(node, edge, result)
                    if type(g) is not torch.Tensor:
                        if g is None:
                            continue
                        if type(g) is Contributions:  # a compiled node's: each added in turn, in eager's order
                            for each in g:
                                buffer_gradient(target, nr, each, buffers, ready)
                            continue
                        g = _received(node, edge, result)
                    if g.shape != shape:
                        g = _unbroadcast(node, g, shape)
                    if g.dtype != dtype:
                        g = g.to(dtype)
                    buf = buffers.get(target)
                    if buf is None:
                        buffers[target] = buf = [None] * target.n_outputs
                        heappush(ready, (-target.sequence_nr, target))
                    buf[nr] = g if buf[nr] is None else buf[nr] + g
                if not retain_graph and (ctx._saved or ctx._packed is not None):
                    ctx.release()
    finally:
        STATE.create_graph, STATE.walk = previous


def _readable_step(node: Any, grads: List[Any], ownership: Ownership, tracer_type: type) -> tuple:
    """The readable walk's step for a node that has hooks or anything else out of the ordinary."""
    if (node.hooks or node.retained) and not getattr(node.rule, "_tt_hooks_inside", False):
        non_leaf_hooks(node, grads, None, ownership.hand_out)
    return _call_rule(node, grads, False, tracer_type, ownership, ())


def _make_step(rule: type) -> Optional[Callable]:
    """What the walk calls for rule's backward: its generated step, its own backward, or None for a rule that is not
    one of torchtrace's (the readable step checks what its backward returns)."""
    if not getattr(rule, "_tt_trusted", False):  # (not kept: a class a user made in a loop must be freed)
        return None
    source = step_source(rule)
    if source is None:
        step = STEPS[rule] = rule.backward
        return step
    filename = os.path.join(_HERE, f"generated_{rule.__name__}_backward.py")
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace = {"KEEP": _table(rule)["keep"], **{f"grad_{i}": formula for i, formula in enumerate(rule.formulas)}}
    exec(compile(source, filename, "exec"), namespace)
    step = STEPS[rule] = namespace[f"backward_{rule.__name__}"]
    return step


def step_source(rule: type) -> Optional[str]:
    """A table rule's backward written out: each needed formula called on what forward saved; None for a
    hand-written rule (its own backward is already code)."""
    table = _table(rule)
    if table is None:
        return None
    n, options = table["n"], table["options"]
    names = ("x", "y") if n == 1 else ("a", "b", "z")
    reads_meta = any(u.endswith(".meta") for used in rule.uses for u in used)
    reads_values = any(not u.endswith(".meta") for used in rule.uses for u in used)
    lines = [f"def backward_{rule.__name__}(ctx, g):",
             f'    """{rule.__doc__}"""',
             "    needs = ctx.needs_input_grad"]
    nothing = ", ".join(["None"] * (n + 1))
    if reads_values:  # what this combination of needed gradients saved (KEEP[...] None: nothing)
        lines += [f"    {', '.join(names)} = ctx.saved_tensors if KEEP[needs[:{n}]] is not None else ({nothing})"]
    else:
        lines.append(f"    {', '.join(names)} = {nothing}")
    if reads_meta:  # what a formula reads of an input it did not save: its Meta
        for k in range(n):
            lines += [f"    if {names[k]} is None and getattr(ctx, 'metas', None) and ctx.metas[{k}] is not None:",
                      f"        {names[k]} = ctx.metas[{k}]"]
    if options == "as called" or (options is not None and not isinstance(options, dict)):
        extra, rest = "*ctx.args, **ctx.kwargs", ", *[None] * len(ctx.args)"
    elif isinstance(options, dict):
        extra, rest = "**ctx.options", ""
    else:
        extra, rest = "", ""
    values = ", ".join(names)
    call = f"{values}, {extra}" if extra else values
    grads = [f"grad_{i}(g, {call}) if needs[{i}] else None" for i in range(n)]
    lines.append(f"    return ({', '.join(grads)}{',' if n == 1 and not rest else ''}{rest})")
    return "\n".join(lines) + "\n"


def _use_walk_lane(on: bool) -> None:
    engine.WALK[0] = walk if on else engine._walk


LANE_SWITCHES.append(_use_walk_lane)
_use_walk_lane(LANES_ON[0])
