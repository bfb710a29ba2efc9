"""A clean trace written out as straight-line Python: `forward` and `backward`, one line per recorded torch call.

The call's floats are parameters (`f0`, `f1`, ...) and every number computed from them is written as the arithmetic
the rule did (`(1.0 - f0)`), never as a literal: the same code serves every value. Shapes, dims, dtypes and the
layout the rule read are literals, and each layout read is a check (`expect(x0.stride(), (4, 1))`) that refuses a
call the trace does not describe. `forward(x..., f...)` returns the rule's result and the values backward reads;
`backward(those..., g..., f...)` returns what the rule's backward returns.
"""
import os
from typing import Any, Callable, Dict, List, NamedTuple, Set

import torch

from torchtrace.compiler.tracing.judge import Trace, Verdict
from torchtrace.compiler.tracing.recorder import Number, Statement, TensorRef, attribute_name
from torchtrace.naming import callable_name

_GENERATED_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "generated")  # a filename in the package

EXPECT = '''def expect(value, recorded, what):
    """The layout the trace was recorded with; any other is refused, never computed on."""
    if type(value) is not type(recorded) or value != recorded:
        raise ValueError(f"{what} is {value!r}, the trace was recorded with {recorded!r}")
'''


class StraightLine(NamedTuple):
    """The generated source and its two functions (see the module's docstring)."""

    source: str
    forward: Callable
    backward: Callable
    inputs: List[str]
    saved: List[str]
    gradients: List[str]
    n_floats: int


def _resolve(name: str) -> Any:
    parts = name.split(".")
    if parts[0] != "torch":
        return None
    found: Any = torch
    for part in parts[1:]:
        found = getattr(found, part, None)
    return found


class CodeWriter:
    """Renders recorded statements as Python lines; objects with no readable spelling become constants `K[i]`."""

    def __init__(self) -> None:
        self.constants: List[Any] = []  # objects with no readable spelling, passed to the code as K[i]

    def constant(self, value: Any) -> str:
        self.constants.append(value)
        return f"K[{len(self.constants) - 1}]"

    def literal(self, value: Any) -> str:
        if isinstance(value, torch.device):
            text = f"torch.device({str(value)!r})"
        elif isinstance(value, slice):
            return f"slice({self.literal(value.start)}, {self.literal(value.stop)}, {self.literal(value.step)})"
        else:
            text = repr(value)
        try:
            same = eval(text, {"torch": torch}) == value  # noqa: S307 (our own rendering, read back)
            if not isinstance(same, bool):
                same = False
        except Exception:
            same = False
        return text if same else self.constant(value)

    def value(self, tree: Any) -> str:
        if isinstance(tree, TensorRef):
            return tree.name
        if isinstance(tree, Number):
            return tree.expression.render()
        if isinstance(tree, list):
            return "[" + ", ".join(self.value(item) for item in tree) + "]"
        if isinstance(tree, tuple) and hasattr(tree, "_asdict"):  # a named tuple a rule keeps (Meta(shape, ...))
            return f"{self.constant(type(tree))}({', '.join(self.value(item) for item in tree)})"
        if isinstance(tree, tuple) and not isinstance(tree, torch.Size):
            items = [self.value(item) for item in tree]
            return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
        if isinstance(tree, dict):
            return "{" + ", ".join(f"{k!r}: {self.value(v)}" for k, v in tree.items()) + "}"
        return self.literal(tree)

    def call(self, s: Statement) -> str:
        attribute = attribute_name(s.func)
        if attribute:
            return f"{self.value(s.args[0])}.{attribute}"
        arguments = [self.value(a) for a in s.args] + [f"{k}={self.value(v)}" for k, v in s.kwargs.items()]
        name = callable_name(s.func)
        if name.startswith("torch._ops."):  # an aten op: torch.ops.aten.x is how it is written
            name = "torch.ops." + name[len("torch._ops."):]
        if _resolve(name) is not None and _resolve(name) == s.func:
            owner, _, method = name.rpartition(".")
            if owner == "torch.Tensor" and s.args and isinstance(s.args[0], TensorRef):
                return f"{arguments[0]}.{method}({', '.join(arguments[1:])})"
            return f"{name}({', '.join(arguments)})"
        return f"{self.constant(s.func)}({', '.join(arguments)})  # {name}"

    def line(self, s: Statement) -> str:
        if s.kind == "read":
            return f"expect({self.call(s).split('  # ')[0]}, {self.value(s.value)}, {self.call(s).split('  # ')[0]!r})"
        if s.outputs is None:
            return self.call(s)
        return f"{_pattern(s.outputs, top=True)} = {self.call(s)}"


def _pattern(tree: Any, top: bool = False) -> str:
    if isinstance(tree, TensorRef):
        return tree.name
    if tree is None:
        return "_"
    items = [_pattern(item) for item in tree]
    if not items:
        return "_"
    inner = ", ".join(items) + ("," if len(items) == 1 else "")
    return inner if top else f"({inner})"


def names_in(tree: Any) -> Set[str]:
    if isinstance(tree, TensorRef):
        return {tree.name}
    if isinstance(tree, (list, tuple)) and not isinstance(tree, torch.Size):
        return {n for item in tree for n in names_in(item)}
    if isinstance(tree, dict):
        return {n for item in tree.values() for n in names_in(item)}
    return set()


def _defined_in_order(trace: Trace, phase: str) -> List[str]:
    names: List[str] = []
    for s in trace.statements:
        if s.phase == phase and s.kind == "op":
            names += sorted(names_in(s.outputs) - set(names), key=lambda n: int(n[1:]))
    return names


def straight_line(trace_or_verdict: Any) -> StraightLine:
    """Write a clean trace (or a clean verdict's) as Python and compile it."""
    trace = trace_or_verdict.trace if isinstance(trace_or_verdict, Verdict) else trace_or_verdict
    if isinstance(trace_or_verdict, Verdict) and not trace_or_verdict.clean:
        raise ValueError(f"{trace.rule.__name__ if trace else trace_or_verdict.rule.__name__}: not clean "
                         f"({trace_or_verdict.reason}): there is no straight-line code for it")
    writer = CodeWriter()
    floats = [f"f{i}" for i in range(len(trace.floats))]
    inputs = sorted(names_in((trace.args, trace.kwargs)), key=lambda n: int(n[1:]))
    forward_lines = [writer.line(s) for s in trace.statements if s.phase == "forward"]
    backward_statements = [s for s in trace.statements if s.phase == "backward"]
    backward_lines = [writer.line(s) for s in backward_statements]
    read_later = set().union(*(names_in((s.args, s.kwargs)) for s in backward_statements)) | names_in(
        trace.backward_result)
    defined_before = set(inputs) | set(_defined_in_order(trace, "forward"))
    made_in_backward = _defined_in_order(trace, "backward")
    saved = sorted((read_later & defined_before) - set(made_in_backward),
                   key=lambda n: (n[0] != "x", int(n[1:])))
    gradients = [g for g in trace.gradients if g is not None]
    math = (trace.rule.__doc__ or "").strip().splitlines()[0] if trace.rule.__doc__ else trace.rule.__name__
    forward_result = writer.value(trace.forward_result)
    backward_result = writer.value(trace.backward_result)
    needs = [i for i in range(trace.mask.bit_length()) if trace.mask >> i & 1]
    body = [f"# {trace.rule.__name__}, traced: {math}",
            f"# valid for this layout (the expect lines) with gradients needed for the arguments at {needs}",
            "import torch", "", "", EXPECT, "",
            f"def forward({', '.join(inputs + floats)}):",
            f'    """{trace.rule.__name__}.forward, one line per torch call; returns the result and what backward '
            'reads."""',
            *(f"    {line}" for line in forward_lines),
            f"    return {forward_result}, ({', '.join(saved)}{',' if len(saved) == 1 else ''})", "", "",
            f"def backward({', '.join(saved + gradients + floats)}):",
            f'    """{trace.rule.__name__}.backward, one line per torch call."""',
            *(f"    {line}" for line in backward_lines),
            f"    return {backward_result}", ""]
    source = "\n".join(body)
    namespace: Dict[str, Any] = {"K": writer.constants}
    filename = os.path.join(_GENERATED_DIR, f"{trace.rule.__name__}.py")
    exec(compile(source, filename, "exec"), namespace)  # noqa: S102 (our own generated code)
    return StraightLine(source, namespace["forward"], namespace["backward"], inputs, saved, gradients, len(floats))

