"""The generated backward of a compiled node: the statements' backwards as one straight-line Python function.

`Segment.backward` interprets: for each step, newest first, it looks up buffers, calls the rule, and sends each
edge its gradient (`edge_gradient`). For one sequence of statements all of that is decided by the program, so it is
written out once per sequence and run on every call that makes the same node:

    if _v12 is not None:                       # the step making value 12 got a gradient
        g0 = _v12; _v12 = None                  # its incoming gradient, by the name its trace gave it
        _c = S[11].ctx; _s = _c._saved           # a clean statement: its traced backward, on its own Context
        x1 = _s[0]                              # (only what the trace reads)
        ...
        t3 = torch.mul(g0, x1)                  # the rule's torch calls, as traced
        _g = t3                                 # what the rule returns for the edge to value 11
        _g = _g.sum_to_size(K[4])               # (only where the trace's shape of t3 is not value 11's)
        _v11 = _g if _v11 is None else _v11 + _g

The engine hands a node gradients of its outputs' shapes and dtypes, so the trace knows the shape and dtype of what
each traced backward returns: an edge's sum (and cast) is a line only where they differ from the input's. A statement
that is not clean is one line, `_o = S[k].rule.backward(S[k].ctx, *_gs)` (`_gs`: its gradients), whose gradients are
checked (`if _g.shape != K[4]: ...`).
Gradients meet in the interpreter's order, so the results are the same bits. `Compiled.backward_code` shows the source.
"""
import collections
import linecache
import math
import os
from typing import Any, Callable, List, Optional, Tuple

import torch

from torchtrace.autograd.node import contributions
from torchtrace.compiler.step_code import GENERATED_DIR, StepCode, expect
from torchtrace.compiler.tracing.recorder import TensorRef
from torchtrace.compiler.tracing.straight_line import CodeWriter


class SegmentCode:
    """One generated backward: its source, the function `(steps, grads, free) -> (edge gradients, steps that ran)`
    (`free(step)` frees a step's saved tensors; None under retain_graph), and
    what it was generated for (the steps' targets, the node's outputs and edge count), checked before each use."""

    __slots__ = ("source", "function", "targets", "outputs", "n_edges", "frees_inline")

    def __init__(self, source: str, function: Callable, targets: list, outputs: tuple, n_edges: int,
                 frees_inline: bool):
        self.source, self.function, self.targets, self.outputs, self.n_edges = (
            source, function, targets, outputs, n_edges)
        self.frees_inline = frees_inline  # each step frees its saved tensors as it runs (no layout checks)

    def fits(self, steps: list, outputs: list, n_edges: int) -> bool:
        return n_edges == self.n_edges and len(steps) == len(self.targets) and tuple(outputs) == self.outputs and \
            all(s.targets is t or s.targets == t for s, t in zip(steps, self.targets))


def generated_backward(steps: list, outputs: list, n_edges: int) -> SegmentCode:
    """The generated backward of a node made of `steps` (kept on the first step's statement, by statement sequence)."""
    key = tuple(s.statement for s in steps)
    cache = key[0].generated
    if cache is None:
        cache = key[0].generated = {}
    code = cache.get(key)
    if code is None or not code.fits(steps, outputs, n_edges):
        code = cache[key] = _generate(steps, outputs, n_edges)
    return code


def _zeros(meta: Optional[tuple]) -> Optional[torch.Tensor]:
    """What the engine passes for an output of a multi-output rule that no gradient reached."""
    return None if meta is None else torch.zeros(meta[0], dtype=meta[1], device=meta[2])


def _generate(steps: list, outputs: list, n_edges: int, frees: bool = True) -> SegmentCode:
    writer = CodeWriter()
    lines = ["def backward(S, G, free):",
             f'    """The backward of {len(steps)} compiled statements, newest first."""']
    lines += [f"    _v{value} = G[{nr}]" for nr, value in enumerate(outputs)]
    sends = collections.Counter(where for step in steps for *_, local, where in step.targets if not local)
    gathered = frozenset(e for e, n in sends.items() if n > 1)  # edges that several statements send to
    lines += [f"    _e{e} = []" if e in gathered else f"    _e{e} = None" for e in range(n_edges)]  # what each edge
    # sends: the gradients of several statements newest first (the engine adds them in turn), else one or None
    lines.append("    _ran = []")
    for k in reversed(range(len(steps))):
        step = steps[k]
        reached = " or ".join(f"_v{v} is not None" for v in step.outputs)
        code = step.statement.code
        lines.append(f"    if {reached}:  # {step.rule.__name__}" + (
            "" if isinstance(code, StepCode) else " (its rule: " + (code or "not traced") + ")"))
        lines += ["        " + line for line in _step_lines(k, step, code, writer, gathered)]
        if frees:  # its saved tensors, as the engine frees a node's after it ran (unless retain_graph)
            lines += ["        " + line for line in _free_lines(k, code)]
    edges = ", ".join(f"contributions(_e{e})" if e in gathered else f"_e{e}" for e in range(n_edges))
    lines.append(f"    return ({edges}{',' if n_edges == 1 else ''}), _ran")
    source = "\n".join(lines) + "\n"
    if frees and "expect(" in source:  # a layout check may send the call to the interpreter: nothing freed before
        return _generate(steps, outputs, n_edges, frees=False)
    filename = os.path.join(GENERATED_DIR, f"backward_{id(steps[0].statement):x}_{len(steps)}.py")
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)  # tracebacks show the lines
    namespace = {"K": writer.constants, "torch": torch, "expect": expect, "_zeros": _zeros,
                 "_same_floats": _same_floats, "contributions": contributions}
    exec(compile(source, filename, "exec"), namespace)  # noqa: S102 (our own generated code)
    return SegmentCode(source, namespace["backward"], [s.targets for s in steps], tuple(outputs), n_edges, frees)


def _free_lines(k: int, code: Any) -> List[str]:
    """`free(S[k])` (segment._free), written out for a traced step: one whose forward saves nothing has nothing to
    free (it can run again, as an eager node that saved nothing can); one whose grad_fn was shown frees through the
    call, which releases that node's Context too."""
    if not isinstance(code, StepCode):
        return ["if free is not None:", f"    free(S[{k}])"]
    if not code.saves:
        return []
    return ["if free is not None:", f"    _st = S[{k}]", "    if _st.shown_ref is None and _st.ctx is not None:",
            "        _st.released, _st.ctx = True, None", "    else:", "        free(_st)"]


def _step_lines(k: int, step: Any, code: Any, writer: CodeWriter, gathered: frozenset) -> List[str]:
    if len(step.outputs) == 1:
        gradients = [f"_v{step.outputs[0]}"]
    else:  # as the engine: zeros for the outputs no gradient reached
        gradients = [f"(_v{v} if _v{v} is not None else _zeros(S[{k}].metas[{i}]))"
                     for i, v in enumerate(step.outputs)]
    reset = "; ".join(f"_v{v} = None" for v in step.outputs)
    if not isinstance(code, StepCode):
        lines = [f"_gs = [{', '.join(gradients)}]", reset, *_rule_lines(k, step, writer, gathered)]
    elif code.fixed_floats is None:  # the traced lines read each gradient by its name
        lines = [f"{name} = {g}" for name, g in zip(code.gradients, gradients) if name is not None]
        lines += [reset, *_traced_lines(k, step, code, writer, gathered)]
    else:  # traced with the floats it had: while they are the same
        names = [f"{name} = _gs[{i}]" for i, name in enumerate(code.gradients) if name is not None]
        lines = [f"_gs = [{', '.join(gradients)}]", reset,
                 f"if _same_floats(S[{k}].floats, {writer.constant(code.fixed_floats)}):",
                 *("    " + line for line in names + _traced_lines(k, step, code, writer, gathered)),
                 "else:", *("    " + line for line in _rule_lines(k, step, writer, gathered))]
    lines.append(f"_ran.append({k})")
    return lines


def _same_floats(these: tuple, traced: tuple) -> bool:
    """The same floats, bit for bit (a zero's sign too)."""
    return len(these) == len(traced) and all(
        a == b and math.copysign(1.0, a) == math.copysign(1.0, b) for a, b in zip(these, traced))


def _rule_lines(k: int, step: Any, writer: CodeWriter, gathered: frozenset) -> List[str]:
    lines = [f"_o = S[{k}].rule.backward(S[{k}].ctx, *_gs)", "if type(_o) is not tuple:", "    _o = (_o,)"]
    for position, shape, dtype, local, where in step.targets:
        at = f"[{position}]" if type(position) is int else f"[{position[0]}][{position[1]}]"
        lines += [f"_g = _o{at}", *_send(shape, dtype, local, where, writer, gathered, checked=True)]
    return lines


def _traced_lines(k: int, step: Any, code: StepCode, writer: CodeWriter, gathered: frozenset) -> List[str]:
    """The traced backward on the step's Context (its gradients already bound to their names)."""
    paths = [path for _, path in code.reads]
    lines = [f"_c = S[{k}].ctx"] if code.checked or paths else []
    if code.checked or any(path.startswith("_s") for path in paths):
        lines.append("_s = _c._saved")
    if code.checked:  # eager's check that no saved tensor changed in place since forward (Context.saved_tensors)
        changed = " or ".join(f"_s[{i}]._version != _w[{i}]" for i in code.checked)
        lines += ["_w = _c._versions", f"if {changed}:", "    _c._refuse()"]
    lines += [f"{name} = {path}" for name, path in code.reads]
    if code.n_floats:
        lines.append(f"{', '.join(f'f{i}' for i in range(code.n_floats))}, = S[{k}].floats")
    lines += [writer.line(s) for s in code.statements]
    result = code.result if not isinstance(code.result, TensorRef) and isinstance(code.result, (tuple, list)) \
        else (code.result,)
    for position, shape, dtype, local, where in step.targets:
        item = result[position] if type(position) is int else result[position[0]][position[1]]
        if item is None:  # the traced backward returns no gradient there, on every call
            continue
        known = code.result_metas.get(item.name) if isinstance(item, TensorRef) else None
        lines += [f"_g = {writer.value(item)}",
                  *_send(shape, dtype, local, where, writer, gathered, checked=False, known=known)]
    return lines


def _send(shape: torch.Size, dtype: torch.dtype, local: bool, where: int, writer: CodeWriter, gathered: frozenset,
          checked: bool, known: Optional[Tuple[torch.Size, torch.dtype]] = None) -> List[str]:
    """edge_gradient, written out: summed to the input's shape, cast to its dtype, added where it goes. Where the
    trace `known` the gradient's shape and dtype (the engine hands every node gradients of its outputs' shapes and
    dtypes, so the traced backward's results have the traced ones), only the sum and the cast it needs are lines."""
    shape_k, dtype_k = writer.constant(shape), writer.constant(dtype)
    if known is None:
        body = [f"if _g.shape != {shape_k}:", f"    _g = _g.sum_to_size({shape_k})",
                f"if _g.dtype != {dtype_k}:", f"    _g = _g.to({dtype_k})"]
    else:
        body = ([f"_g = _g.sum_to_size({shape_k})"] if known[0] != shape else []) + (
            [f"_g = _g.to({dtype_k})"] if known[1] != dtype else [])
    body.append(f"_v{where} = _g if _v{where} is None else _v{where} + _g" if local else
                f"_e{where}.append(_g)" if where in gathered else f"_e{where} = _g")
    return ["if _g is not None:", *("    " + line for line in body)] if checked else body
