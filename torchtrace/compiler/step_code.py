"""A recorded statement's backward as lines of the generated backward, or why it stays a call of its rule.

At record time the statement's rule is traced (`tracing.trace_rule`: forward then backward on copies of the recorded
arguments, its floats as symbols). A clean trace becomes `StepCode`: the backward's torch calls, each tensor they
read found where the rule's own forward left it in its Context (`_s[1]` for the second saved tensor, `_c.metas[0]`
for an attribute), and the call's floats as parameters read from the step on every call. The code runs on the
Context the rule's forward filled on this call, so its forward must have taken the same way as the traced one:
a forward that read what the statement's checks do not fix (strides, contiguity, device, requires_grad) keeps the
statement a call of its rule. Layout reads in the backward are checks (`expect`) of the generated code: one that
fails sends the whole backward down the step-by-step path (`LayoutDiffers`).
"""
import contextlib
import linecache
import os
from typing import Any, Callable, Dict, Iterator, List, NamedTuple, Optional, Tuple, Union

import torch

from torchtrace.compiler.ir import NUMBER
from torchtrace.compiler.tracing.judge import Trace, call_values, fixed_float_trace, trace_rule
from torchtrace.compiler.tracing.recorder import (
    DRAWS,
    UNKNOWN,
    Number,
    Statement,
    TensorRef,
    attribute_name,
    draws_random,
)
from torchtrace.compiler.tracing.straight_line import CodeWriter, names_in
from torchtrace.compiler.tracing.symbolic_float import Var

GENERATED_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "generated")  # file names in the package

# what a forward may read of its arguments and still take one way on every call of the statement: the statement's
# checks fix each tensor's shape, dtype and device (a leaf's when first bound; a result's follows from its op)
FIXED_BY_CHECKS = {"device", "is_cuda", "get_device",
                   "shape", "size", "dim", "ndim", "ndimension", "numel", "nelement", "dtype", "is_floating_point",
                   "is_complex", "element_size", "__len__", "layout", "is_sparse", "is_quantized", "is_meta",
                   "is_nested", "is_signed", "result_type"}


class LayoutDiffers(Exception):
    """A layout the generated backward was not traced for (raised by its `expect` lines)."""


def expect(value: Any, recorded: Any, what: str) -> None:
    """The layout a statement's trace was recorded with; another sends the backward down the step-by-step path."""
    if type(value) is not type(recorded) or value != recorded:
        raise LayoutDiffers(f"{what} is {value!r}, the trace was recorded with {recorded!r}")


class StepCode(NamedTuple):
    """A clean statement's backward: `reads` binds each tensor it reads from the Context (`_s` its saved tensors,
    `_c` the Context), `checked` are the saved indices whose versions eager checks, `statements` the traced torch
    calls, `gradients` the name of each output's incoming gradient, `result` what backward returns (a template),
    `n_floats` how many floats the call passes. `forward(ctx, *args)` is the rule's forward as traced (None where
    the call is not all positional, its result is not one tensor, or it draws random numbers): the same torch calls,
    the same Context."""

    reads: List[Tuple[str, str]]
    checked: Tuple[int, ...]
    statements: List[Statement]
    gradients: List[Optional[str]]
    result: Any
    n_floats: int
    forward: Optional[Callable]
    forward_source: str
    fixed_floats: Optional[tuple]  # the trace holds for these floats only (their values are literals in its code)
    saves_result: Tuple[int, ...]  # where the forward's Context keeps its result (saved index)
    saved_from: Tuple[Tuple[int, Optional[int]], ...]  # (saved index, argument index or None): each tensor the
    # Context keeps other than the result, the argument it is (None: made by the forward, or returned unchanged by an
    # op such as contiguous(): only a run can tell)
    result_metas: Dict[str, Tuple[torch.Size, torch.dtype]]  # shape and dtype of each tensor backward returns, as
    # traced: what the generated backward knows without reading them (segment_code._send)
    saves: bool  # the forward's Context keeps something (a step that keeps nothing has nothing to free)


_CACHE: Dict[tuple, Union[StepCode, str]] = {}  # (rule, key, mask, layout of the tensors) -> its code, or why not


def step_code(rule: type, key: tuple, mask: int, args: tuple, kwargs: dict) -> Union[StepCode, str]:
    """The StepCode of a statement recorded with these (plain) arguments, or the reason it stays a rule call.

    A rule that branches on a float of the call (CrossEntropy's `label_smoothing == 0`, Addmm's `beta == 1`), or
    lets one escape (a norm's `p`), is traced again with its floats as the constants they were: that code holds
    while the floats are the same (`fixed_floats`, checked on every backward; another value calls the rule)."""
    tensors, floats = call_values(args, kwargs)
    if any(t.layout != torch.strided for t in tensors):
        return "a sparse tensor argument"
    if any(isinstance(k, type) and k is not slice for k in key) or len(floats) != sum(k is NUMBER for k in key):
        return "an argument the key holds by its type only (an object, a numpy float): read anew on every call"
    layout = tuple((t.shape, t.dtype, t.stride(), t.storage_offset(), t.device) for t in tensors)
    cache_key = (rule, key, mask, layout, tuple(floats))
    found = _CACHE.get(cache_key)
    if found is None:
        if len(_CACHE) > 4096:  # programs of many shapes: trace again rather than grow without end
            _CACHE.clear()
        with _random_streams_kept(tensors, getattr(rule, "draws_random", False)):
            verdict = trace_rule(rule, args, kwargs, mask)
            fixed = None if verdict.clean else fixed_float_trace(rule, args, kwargs, mask, verdict)
        found = _from_trace(verdict.trace, None) if verdict.clean else \
            _from_trace(fixed, tuple(floats)) if fixed is not None else verdict.reason
        if not isinstance(found, StepCode) and not verdict.clean:
            found = verdict.reason
        _CACHE[cache_key] = found
    return found


@contextlib.contextmanager
def _random_streams_kept(tensors: List[torch.Tensor], draws: bool) -> Iterator[None]:
    """A rule that draws random numbers (dropout; `draws`: one whose draws the recorder does not see, as
    fractional_max_pool2d's, made inside torch's own Python, or _standard_gamma's) draws them while traced: then
    torch's generators are set back to where they were, so the user's random stream goes on as in eager. A rule that
    draws nothing leaves them alone (another thread drawing meanwhile keeps its numbers; one drawing while a drawing
    rule is traced does not)."""
    before = DRAWS.count
    cpu = torch.get_rng_state()
    cuda = {d: torch.cuda.get_rng_state(d) for d in {t.device for t in tensors if t.device.type == "cuda"}}
    try:
        yield
    finally:
        if draws or DRAWS.count != before:
            torch.set_rng_state(cpu)
            for device, state in cuda.items():
                torch.cuda.set_rng_state(state, device)


def _from_trace(trace: Trace, fixed_floats: Optional[tuple]) -> Union[StepCode, str]:
    for s in trace.statements:
        what = attribute_name(s.func) or getattr(s.func, "__name__", "")
        if s.phase == "forward" and s.kind == "read" and what not in FIXED_BY_CHECKS:
            return f"its forward reads {what}, which the statement does not fix"
    backward = [s for s in trace.statements if s.phase == "backward" and not (  # fixed reads need no check
        s.kind == "read" and (attribute_name(s.func) or getattr(s.func, "__name__", "")) in FIXED_BY_CHECKS)]
    made = set().union(*(names_in(s.outputs) for s in backward if s.kind == "op"))
    read = set().union(*(names_in((s.args, s.kwargs)) for s in backward)) | names_in(trace.backward_result)
    needed = read - made - {g for g in trace.gradients if g is not None}
    where = _places(trace)
    missing = sorted(needed - set(where))
    if missing:
        return f"its backward reads {', '.join(missing)}, which its Context does not hold"
    checked = tuple(i for i, item in enumerate(trace.ctx_saved) if isinstance(item, TensorRef))
    reads = [(name, where[name]) for name in sorted(needed, key=lambda n: (n[0], int(n[1:])))]
    metas = {name: trace.metas[name] for name in names_in(trace.backward_result) if name in trace.metas}
    if fixed_floats is not None:  # the forward stays the rule's: it takes any float
        return StepCode(reads, checked, backward, list(trace.gradients), trace.backward_result, 0, None, "",
                        fixed_floats, (), (), metas, bool(trace.ctx_saved))
    source = _forward_source(trace)
    saves_result = tuple(i for i, item in enumerate(trace.ctx_saved) if item == trace.forward_result)
    arguments = [item if isinstance(item, TensorRef) else None for item in trace.args]
    saved_from = tuple((i, arguments.index(item) if item in arguments else None) for i, item in
                       enumerate(trace.ctx_saved) if isinstance(item, TensorRef) and i not in saves_result)
    return StepCode(reads, checked, backward, list(trace.gradients), trace.backward_result, len(trace.floats),
                    _compiled_forward(trace.rule, source) if source else None, source[0] if source else "", None,
                    saves_result, saved_from, metas, bool(trace.ctx_saved))


def _forward_source(trace: Trace) -> Optional[Tuple[str, list]]:
    """(source, constants) of the traced forward: `forward(ctx, *args)` makes the rule's torch calls and leaves the
    Context as the rule's forward leaves it (saved tensors, their versions, attributes)."""
    random = any(s.kind == "op" and draws_random(s.func) for s in trace.statements if s.phase == "forward")
    if trace.kwargs or not isinstance(trace.forward_result, TensorRef) or random:
        return None
    parameters = []
    for i, item in enumerate(trace.args):
        if isinstance(item, TensorRef):
            parameters.append(item.name)
        elif isinstance(item, Number) and isinstance(item.expression, Var):
            parameters.append(item.expression.render())
        elif isinstance(item, (list, tuple, dict, Number)) and not isinstance(item, torch.Size):
            return None  # a list of tensors, or a float computed from others: the general path
        else:
            parameters.append(f"_p{i}")  # fixed by the statement's key
    everything = (trace.ctx_saved, trace.ctx_attributes, trace.forward_result)
    if UNKNOWN in _tensor_refs(everything) or not all(name.isidentifier() for name in trace.ctx_attributes):
        return None
    writer = CodeWriter()
    lines = [f"def forward(ctx, {', '.join(parameters)}):",
             f'    """{trace.rule.__name__}.forward as traced: its torch calls, its Context."""']
    lines += [f"    {writer.line(s)}" for s in trace.statements if s.phase == "forward" and s.kind == "op"]
    if trace.ctx_saved:
        saved = [writer.value(item) for item in trace.ctx_saved]
        versions = [f"{v}._version" if isinstance(item, TensorRef) else "None"
                    for v, item in zip(saved, trace.ctx_saved)]
        comma = "," if len(saved) == 1 else ""
        lines += [f"    ctx._saved = ({', '.join(saved)}{comma})", f"    ctx._versions = [{', '.join(versions)}]"]
    lines += [f"    ctx.{name} = {writer.value(value)}" for name, value in trace.ctx_attributes.items()]
    lines.append(f"    return {writer.value(trace.forward_result)}")
    return "\n".join(lines) + "\n", writer.constants


def _compiled_forward(rule: type, source: Tuple[str, list]) -> Callable:
    text, constants = source
    filename = os.path.join(GENERATED_DIR, f"forward_{rule.__name__}_{len(_CACHE)}.py")
    linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)
    namespace = {"K": constants, "torch": torch}
    exec(compile(text, filename, "exec"), namespace)  # noqa: S102 (our own generated code)
    return namespace["forward"]


def _tensor_refs(tree: Any) -> List[TensorRef]:
    if isinstance(tree, TensorRef):
        return [tree]
    if isinstance(tree, (list, tuple)) and not isinstance(tree, (Number, torch.Size)):
        return [t for item in tree for t in _tensor_refs(item)]
    if isinstance(tree, dict):
        return [t for item in tree.values() for t in _tensor_refs(item)]
    return []


def _places(trace: Trace) -> Dict[str, str]:
    """name -> where the Context holds it: saved tensors first, then attributes (first place found)."""
    places: Dict[str, str] = {}
    _walk(trace.ctx_saved, "_s", places)
    for name, value in trace.ctx_attributes.items():
        if name.isidentifier():
            _walk(value, f"_c.{name}", places)
    return places


def _walk(tree: Any, path: str, places: Dict[str, str]) -> None:
    if isinstance(tree, TensorRef):
        if tree != UNKNOWN:
            places.setdefault(tree.name, path)
    elif isinstance(tree, (list, tuple)) and not isinstance(tree, torch.Size):
        for i, item in enumerate(tree):
            _walk(item, f"{path}[{i}]", places)
    elif isinstance(tree, dict):
        for k, item in tree.items():
            if isinstance(k, (str, int)):
                _walk(item, f"{path}[{k!r}]", places)
