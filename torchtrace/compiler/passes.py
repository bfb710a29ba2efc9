"""Passes over a lowered path (Ops over Values): names from the model, and where each value dies.

* `name`: a module's output is `h_<module path>` (`h_fc1`), the gradient of a parameter or input is
  `d_<its name>` (`d_fc1_weight`, `d_x`); other values are `t1, t2, ...` forward and `g1, g2, ...` backward.
  Parameters keep their dotted names, read as `params["fc1.weight"]`.
* `last_uses`: the index of the op after which each value is read no more (for `del` in the fast form).
"""
import keyword
import re
from typing import Dict, List

from torchtrace.compiler.ir import Listing, Op, Value

RESERVED = re.compile(r"^([tg]\d+|grad\d+|params|saved|torch|forward|backward|_)$")


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
