"""A fast statement's replay as one generated function: its checks, its forward, its result an output of the node.

`ReplayMode` hands the common call — grad mode on, positional arguments, the program's next statement a
REPLAY of this callable — to the statement's own `replay(run, st, args)`, generated from what the statement fixes.
For `torch.mul(h, w)` recorded with h value 3 and w leaf slot 0 first read there, traced clean:

    def make(MISS, K, L1, MASK, N1, RULE, V0, forward):   # once per form of statement: V0 = 3, L1 = N1 = 0, ...
        def replay(run, st, args):
            values, slot_of, slots = run.values, run.slot_of, run.slots
            if len(args) != 2:
                return MISS
            a0, a1 = args
            # a0: value V0 of this call; it needs a gradient, unchanged in place since it was made
            if not <...> or values.get(id(a0)) != V0:
                return MISS
            # a1: a leaf read for the first time (slot L1), of shape K[0], dtype K[1], on K[2]; ...
            if not <...> or id(a1) in slot_of or id(a1) in values or len(slots) != N1 or a1.shape != K[0] ...:
                return MISS
            slot_of[id(a1)] = L1             # bound once every argument fits: nothing to undo on a miss
            slots.append(a1)
            ...                              # the trie moves on
            ctx = new(Context)               # Context(RULE, (), MASK), its __init__ written out
            ...
            out = forward(ctx, a0, a1)       # the rule's forward as traced (step_code.py): its torch calls
            if out._is_view() or out is a0 or out is a1:
                return run.relink(...)       # the general linking (views, a returned argument)
            ...                              # value number, output nr of the open node, retagged as a tracer
            step = new(Step)                 # Step(RULE, ctx, [value], None, targets, local, (), st, ()), written out
        return replay

The form's code is compiled once (statements that differ only in their numbers, rule, forward and constants share
it: a path runs a few hot functions); each statement binds its own values (`make(...)` per statement).

One identity check per tensor, a type check per float, an equality per structural argument: `Run._fits`
interprets the same checks for calls that take the general path. A statement whose rule does not trace clean runs
its rule's forward here, its result checked against the statement's shape and dtype. It runs under plain_torch:
reading a tracer's attributes does not enter torchtrace.
"""
import linecache
import os
import weakref
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from torchtrace.autograd.node import _NEEDS, _UNSAVED, Context, _needs_flags
from torchtrace.compiler.ir import NUMBER, TENSOR
from torchtrace.compiler.segment import Segment, Step
from torchtrace.compiler.step_code import GENERATED_DIR
from torchtrace.compiler.tracing.straight_line import CodeWriter
from torchtrace.tracer import tracer

_FORMS: Dict[str, Callable[..., Callable]] = {}  # the source of a form -> its compiled factory


def statement_replay(st: Any, miss: object) -> Callable[[Any, Any, tuple], Any]:
    """The generated `replay(run, st, args)` of a fast statement (st is passed in: the function does not hold it):
    its result, or `miss` where the call does not fit (nothing has run then).

    What differs between statements of one form — value and slot numbers, the Context's mask, the rule, its traced
    forward, shapes and structural values (`K`) — is bound per statement; the code itself is compiled once per
    form (the chain's 100 multiplications share one), so a long path runs a few hot functions, not one per call."""
    writer = CodeWriter()
    bound: Dict[str, Any] = {"MASK": st.mask, "RULE": st.rule, "forward": st.traced_forward,
                             "FLAGS": _NEEDS.get(st.mask) or _needs_flags(st.mask)}
    n = len(st.checks)
    names = [f"a{i}" for i in range(n)]
    lines = ["    def replay(run, st, args):",
             '        """A statement\'s replay: its arguments checked, its forward, its result linked."""',
             "        values, slot_of, slots = run.values, run.slot_of, run.slots",
             f"        if len(args) != {n}:", "            return MISS"]
    if n:
        lines.append(f"        {', '.join(names)}{',' if n == 1 else ''} = args")
    body = _check_lines(st, names, writer, bound)
    body += ["run.at += 1  # the trie moves on", "run.path.append(st)",
             "ctx = new(Context)  # Context(RULE, (), MASK), its __init__ written out",
             "ctx._rule, ctx._edges, ctx._mask, ctx._saved, ctx._versions, ctx.needs_input_grad = (",
             "    RULE, (), MASK, (), UNSAVED, FLAGS)"]
    body += _forward_lines(st, names, writer)
    body += _output_lines(st, names, st.code.saves_result if st.traced_forward is not None else None, bound)
    lines += ["        " + line for line in body]
    bound["K"] = writer.constants
    parameters = sorted(bound)
    form = "\n".join([f"def make(MISS, {', '.join(parameters)}):", *lines, "    return replay"]) + "\n"
    factory = _FORMS.get(form)
    if factory is None:
        if len(_FORMS) > 4096:  # programs of very many forms: compile again rather than grow without end
            _FORMS.clear()
        filename = os.path.join(GENERATED_DIR, f"replay_form_{len(_FORMS)}.py")
        linecache.cache[filename] = (len(form), None, form.splitlines(True), filename)
        namespace = {"tracer": tracer, "T": torch.Tensor, "Segment": Segment, "Step": Step, "Context": Context,
                     "new": object.__new__, "UNSAVED": _UNSAVED,
                     "ref": weakref.ref}
        exec(compile(form, filename, "exec"), namespace)  # noqa: S102 (our own generated code)
        factory = _FORMS[form] = namespace["make"]
    replay = factory(miss, *(bound[name] for name in parameters))
    values = ", ".join(f"{name} = {'needs_input_grad of MASK' if name == 'FLAGS' else _shown(bound[name])}"
                       for name in parameters)
    replay.source = f"# {st.describe()}\n# bound: {values}\n{form}"  # shown by Compiled.replay_code
    return replay


def _shown(value: Any) -> str:
    name = getattr(value, "__name__", None)
    return name if name is not None and callable(value) else repr(value)


def _check_lines(st: Any, names: List[str], writer: CodeWriter, bound: Dict[str, Any]) -> List[str]:
    """Each argument fits its check; new leaf slots are bound after all of them did."""
    lines: List[str] = []
    bindings: List[str] = []
    first_seen: dict = {}  # new leaf slot -> the argument that binds it
    for i, (name, (entry, source, needs)) in enumerate(zip(names, st.checks)):
        if entry is TENSOR:
            lines += _tensor_lines(i, source, needs, st, writer, first_seen, len(bindings) // 2, bound)
            if source < 0 and first_seen.get(~source) == name:
                bindings += [f"slot_of[id({name})] = L{i}", f"slots.append({name})"]
        elif entry is NUMBER:
            lines += [f"# {name}: a float (read on every call)", f"if type({name}) is not float:", "    return MISS"]
        else:
            kind, value = writer.constant(entry[0]), writer.constant(entry[1])
            lines += [f"# {name}: {value} as recorded", f"if type({name}) is not {kind} or {name} != {value}:",
                      "    return MISS"]
    return lines + bindings


def _tensor_lines(i: int, source: int, needs: bool, st: Any, writer: CodeWriter, first_seen: dict,
                  bound_before: int, bound: Dict[str, Any]) -> List[str]:
    name = f"a{i}"
    # a tracer: its requires_grad as recorded, not changed in place since it was made (eager's version check)
    state = (f"(({name}._tt_requires_grad == {needs} and ({name}._tt_node is None or "
             f"{name}._version == {name}._tt_version)) if isinstance({name}, tracer) else "
             f"(isinstance({name}, T) and {name}.requires_grad == {needs}))")
    needing = "needs a gradient" if needs else "needs no gradient"
    if source >= 0:  # value j of this call
        bound[f"V{i}"] = source
        said = f"value V{i} of this call"
        where = f"values.get(id({name})) != V{i}"
    elif ~source not in st.new_slots:  # a leaf slot bound earlier in the call
        bound[f"L{i}"] = ~source
        said = f"the leaf of slot L{i}, bound earlier in this call"
        where = f"slot_of.get(id({name})) != L{i}"
    elif ~source in first_seen:  # read twice by this statement: the same object both times
        said = f"the same leaf as {first_seen[~source]}"
        where = f"{name} is not {first_seen[~source]}"
    else:  # first read here: a new object (one slot per object), the next slot, the recorded shape, dtype, device
        slot = ~source
        bound[f"L{i}"], bound[f"N{i}"] = slot, slot - bound_before  # (slots bound before it here are not yet in)
        others = "".join(f" or {name} is {other}" for other in first_seen.values())
        first_seen[slot] = name
        shape, dtype, device = (writer.constant(v) for v in st.new_slots[slot])
        said = f"a leaf read for the first time (slot L{i}), of shape {shape}, dtype {dtype}, on {device}"
        where = (f"id({name}) in slot_of or id({name}) in values or len(slots) != N{i}{others} or "
                 f"{name}.shape != {shape} or {name}.dtype != {dtype} or {name}.device != {device}")
    return [f"# {name}: {said}; it {needing}, unchanged in place since it was made",
            f"if not {state} or {where}:", "    return MISS"]


def _forward_lines(st: Any, names: List[str], writer: CodeWriter) -> List[str]:
    arguments = ", ".join(names)
    general = "run.relink(st, ctx, args, out)"  # any result: views, an argument, other shapes
    held = "".join(f" or out is {name}" for name, (entry, _, _) in zip(names, st.checks) if entry is TENSOR)
    if st.traced_forward is not None:  # its shape and dtype are the statement's (the checks fix them)
        return ["try:", f"    out = forward(ctx, {arguments})  # its rule's forward, as traced",
                "except Exception:  # what the traced code cannot take (an inference tensor has no version):",
                "    ctx = Context(RULE, (), MASK)  # the rule says it as eager does, or runs it",
                f"    out = RULE.forward(ctx, {arguments})",
                f"    return {general}",
                f"if out._is_view(){held}:", f"    return {general}"]
    one_floating = len(st.results) == 1 and st.results[0][1].is_floating_point
    lines = [f"out = RULE.forward(ctx, {arguments})"]
    if not one_floating:
        return lines + [f"return {general}"]
    shape, dtype = (writer.constant(v) for v in st.results[0])
    return lines + [f"if type(out) is not T or out.shape != {shape} or out.dtype != {dtype}"
                    f" or out._is_view(){held}:", f"    return {general}",
                    "saving = [i for i, s in enumerate(ctx._saved) if s is out]"]


def _output_lines(st: Any, names: List[str], saving: Optional[Tuple[int, ...]], bound: Dict[str, Any]) -> List[str]:
    """The result becomes output nr of the open node; `saving`: where the Context keeps it (read from the Context
    where None). The node's edges to outside tensors this statement reads first are made for this call: where they
    land as they did, the statement's plan holds (else `Run._plan` makes one for this call)."""
    floats = ", ".join(names[i] for i in st.numbers)
    opening = ""
    for k, (source, position, where) in enumerate(st.plan[2]):
        bound[f"E{k}"], bound[f"W{k}"] = source, where
        opening += f" or segment.edge_to(E{k}, {names[position]}) != W{k}"
    as_alias = ["kept = tuple((i, nr) for i in saving)",
                "out = T.detach(out)  # the Context keeps it plain: the caller gets a tracer alias (not a view, as",
                "out.__class__ = tracer  # torch's result)"]
    as_itself = ["kept = ()", "out.__class__ = tracer  # no one else holds it: it becomes the tracer itself"]
    if saving is None:
        retag = ["if saving:", *("    " + line for line in as_alias), "else:",
                 *("    " + line for line in as_itself)]
    else:
        pairs = "".join(f"({i}, nr), " for i in saving)
        retag = [f"kept = ({pairs.rstrip()})", *as_alias[1:]] if saving else as_itself
    return [
        "segment = run._segment  # (Run.segment, read without its property: the open segment holds its node)",
        "if segment is None or segment.sealed:",
        "    segment = run.segment = Segment(run.n_values)",
        "value = run.n_values",
        "run.n_values = value + 1",
        "node, outputs = segment._node, segment.outputs",
        "nr = len(outputs)",
        "outputs.append(value)",
        "segment.nr_of[value] = nr",
        "node.n_outputs = nr + 1",
        *retag,
        "out._tt_node, out._tt_requires_grad, out._tt_nr, out._tt_version = node, True, nr, out._version",
        "values[id(out)] = value",
        "run.keep.append(out)",
        "targets, local, _, first = st.plan",
        f"if first != segment.first_value{opening}:  # (the edges this statement opens, made for this call)",
        "    targets, local, _, _ = run._plan(st, segment, args, {}, RULE)",
        "step = new(Step)  # Step(RULE, ctx, [value], None, targets, local, kept, st, floats), written out",
        "step.rule, step.ctx, step.outputs, step.metas, step.targets, step.local, step.saved_outputs = (",
        "    RULE, ctx, [value], None, targets, local, kept)",
        f"step.statement, step.floats = st, ({floats}{',' if floats else ''})",
        "step.released, step.saved_inputs, step.node, step.shown_ref = False, (), None, None",
        "segment.steps.append(step)",
        "segment.producer[value] = step",
        *_plain_saved_lines(st, names),
        "return out"]


def _plain_saved_lines(st: Any, names: List[str]) -> List[str]:
    """Segment.plain_saved_inputs written out, where the trace says what the Context keeps: a saved argument that is
    a leaf slot is never a tracer of this node, one that is a value of this call may be; a tensor the forward made
    is checked too (an op such as contiguous() may have returned its argument itself)."""
    if st.traced_forward is None:
        return ["if ctx._saved:", "    segment.plain_saved_inputs(step)"]
    lines: List[str] = []
    for index, k in st.code.saved_from:
        if k is not None and (st.checks[k][0] is not TENSOR or st.checks[k][1] < 0):
            continue
        name = names[k] if k is not None else f"ctx._saved[{index}]"
        lines += [f"_t = {name}",
                  f"if getattr(_t, '_tt_node', None) is node:  # saved {index}: a tracer of this node, kept as a plain "
                  "alias (no cycle node -> Context -> tracer -> node): Segment.plain_saved_input written out",
                  "    _s = ctx._saved",
                  f"    ctx._saved = (*_s[:{index}], T.detach(_t), *_s[{index + 1}:])",
                  f"    step.saved_inputs = (*step.saved_inputs, ({index}, ref(_t), _t._tt_nr))"]
    return lines
