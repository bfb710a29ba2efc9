"""Passes over a lowered path (Ops over Values): names from the model, and where each value dies.

* `name`: a module's output is `h_<module path>` (`h_fc1`), the gradient of a parameter or input is
  `d_<its name>` (`d_fc1_weight`, `d_x`); other values are `t1, t2, ...` forward and `g1, g2, ...` backward.
  Parameters keep their dotted names, read as `params["fc1.weight"]`.
* `last_uses`: the index of the op after which each value is read no more (for `del` in the fast form).
* `reused_buffers`: the backward ops that may write their result into the memory of a gradient that dies there
  (`g3 = g1.mul(g2)` becomes `g1.mul_(g2)`, and g3 is g1 from then on), in the fast form.
"""
import keyword
import re
from typing import Dict, List

import torch

from torchtrace.compiler.ir import Listing, Op, Value

T = torch.Tensor
# elementwise arithmetic: a new tensor (never a view), and its in-place twin on the first operand
IN_PLACE = {f: "add_" for f in (torch.add, T.add, T.__add__)}
IN_PLACE.update({f: "sub_" for f in (torch.sub, T.sub, T.__sub__)})
IN_PLACE.update({f: "mul_" for f in (torch.mul, T.mul, T.__mul__)})
IN_PLACE.update({f: "div_" for f in (torch.div, T.div, T.__truediv__)})
_FRESH = {*IN_PLACE, torch.neg, T.neg, T.__neg__, torch.matmul, T.matmul, T.__matmul__, torch.mm, T.mm}

RESERVED = re.compile(r"^([tgf]\d+|grad\d+|params|saved|numbers|torch|forward|backward|_)$")


def identifier(text: str) -> str:
    """A Python name made of `text` that cannot clash with the names the generated code uses."""
    name = re.sub(r"\W", "_", text) or "_"
    name = "_" + name if name[0].isdigit() else name
    return name + "_in" if RESERVED.match(name) else name


def name(listing: Listing) -> None:
    taken = set()
    for v in listing.inputs:
        v.name = identifier(v.hint)
        taken.add(v.name)
    labels = set()
    for v in listing.params:  # a closure cell or global keeps its Python name; a parameter its dotted one
        label, count = v.hint, 1
        while label in labels:  # two leaves never share a label
            count += 1
            label = f"{v.hint}_{count}"
        labels.add(label)
        v.hint = label
        plain = label.isidentifier() and not keyword.iskeyword(label) and not RESERVED.match(label)
        v.name = label if plain and label not in taken else f'params["{label}"]'
        taken.add(v.name)
    for leaf, g in listing.gradients:
        if g is not None and g.kind == "g" and not g.hint:
            g.hint = identifier("d_" + leaf.hint.replace(".", "_"))
    counters = {"t": 0, "g": 0}
    for ops in (listing.forward, listing.backward):
        for op in ops:
            for v in op.targets:
                if v is None or v.kind not in counters or v.name in taken:
                    continue
                if v.hint and v.hint not in taken:
                    v.name = identifier(v.hint) if not v.hint.startswith("grad") else v.hint
                else:
                    counters[v.kind] += 1
                    v.name = f"{v.kind}{counters[v.kind]}"
                taken.add(v.name)
    for v in listing.grad_outputs:
        v.name = v.hint


def reads(op: Op, listing: Listing) -> List[Value]:
    found = []
    for a in (*op.args, *op.kwargs.values()):
        for t in (a if isinstance(a, (list, tuple)) else (a,)):
            v = listing.of.get(id(t))
            if v is not None:
                found.append(v)
    return found


def last_uses(ops: List[Op], listing: Listing, live_out: List[Value]) -> Dict[int, List[Value]]:
    """op index -> the values (defined in `ops`) read or defined there for the last time, not live after."""
    keep = {id(v) for v in live_out}
    last: Dict[int, int] = {}
    defined: Dict[int, Value] = {}
    for i, op in enumerate(ops):
        for v in op.targets:
            if v is not None:
                defined[id(v)] = v
                last.setdefault(id(v), i)
        for v in reads(op, listing):
            last[id(v)] = i
    out: Dict[int, List[Value]] = {}
    for key, v in defined.items():
        if key not in keep:
            out.setdefault(last[key], []).append(v)
    return out


def reused_buffers(ops: List[Op], listing: Listing, live_out: List[Value]) -> Dict[int, Value]:
    """op index -> the gradient whose memory the op's result takes over: the op is elementwise arithmetic whose
    first operand is a gradient made by arithmetic in this backward (its own memory) and read only by arithmetic
    (no view of it lives on), read for the last time here, with the shape and dtype of the result (so `a.op_(b)`
    computes what `a.op(b)` does, in a's memory); neither is returned (a returned gradient keeps its name)."""
    made_fresh = {id(v) for op in ops if op.func in _FRESH for v in op.targets if v is not None}
    viewed = {id(v) for op in ops if op.func not in _FRESH for v in reads(op, listing)}
    returned = {id(v) for v in live_out}
    dying = last_uses(ops, listing, live_out)
    out: Dict[int, Value] = {}
    for i, op in enumerate(ops):
        if op.func not in IN_PLACE or len(op.args) != 2 or len(op.targets) != 1 or op.kwargs:
            continue
        first = listing.of.get(id(op.args[0])) if isinstance(op.args[0], torch.Tensor) else None
        result = op.targets[0]
        if first is not None and result is not None and first.kind == "g" and id(first) in made_fresh \
                and id(first) not in viewed and id(result) not in returned and first.meta == result.meta \
                and any(v is first for v in dying.get(i, ())):
            out[i] = first
    return out
