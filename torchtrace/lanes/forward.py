"""Recording lanes generated from rules: what dispatch.run_rule decides per call, decided once per rule.

For the common call (arguments by position, or keywords whose positions the readable path found before; the tensors
among them tracers, lists holding none; recording on, no autocast, no tool watching) what run_rule does depends only
on the rule and the number of arguments (a view whose base changed in place is caught up first, as there). `lane_source`
writes it out for that rule as one straight-line Python function, as PyTorch generates a VariableType kernel per op
from derivatives.yaml: an edge for each differentiable argument that requires a gradient, the op run once under the
subclass guard, for a table rule exactly what its needed formulas read saved (its `uses`), one Node, and the result
retagged as a tracer. Any call outside the common case goes to run_rule, unchanged. `python -m torchtrace ops
--show Mul` prints a rule's lane.
"""
import inspect
import linecache
import os
import sys
import weakref
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from torchtrace.autograd.arguments import KEYWORD_PLANS, planned_positions
from torchtrace.autograd.dispatch import _link_outputs, run_rule
from torchtrace.autograd.dispatch import torch_function as readable_torch_function
from torchtrace.autograd.function import INPLACE_FLAG, RULES
from torchtrace.autograd.inplace import catch_up
from torchtrace.autograd.kept_values import BUDGET, Kept
from torchtrace.autograd.kept_values import THREAD as KEPT
from torchtrace.autograd.node import (
    _NEEDS,
    _UNSAVED,
    AccumulateGrad,
    Context,
    Edge,
    Node,
    _needs_flags,
    _next_sequence_nr,
    _top_hooks,
)
from torchtrace.autograd.plain import plain_torch
from torchtrace.autograd.state import STATE

MOST_ARGUMENTS = 12  # calls with more positional arguments take the readable path (F.cross_entropy: 8)
LANES: Dict[type, list] = {}  # rule -> its lanes by number of arguments, each made on first use
_HERE = os.path.dirname(os.path.abspath(__file__))


def torch_function(cls: type, func: Callable, types: Any, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
    """tracer.__torch_function__ while the lanes are on: a rule's call by position takes its lane; every other call
    dispatch's entry."""
    rule = RULES.get(func)
    if rule is not None and rule._tt_trusted:  # a user's rule takes run_rule: its forward without grad mode, its views
        positional = args  # marked as a custom Function's (no lane generated, none kept for a class made in a loop)
        if kwargs:  # F.relu(x, inplace=False), as every torch.nn.functional call, passes its options as keywords: a
            plan = KEYWORD_PLANS.get((func, len(args), *kwargs))  # spelling whose keywords the readable path placed
            if plan is None or plan[1]:  # before all go to those positions (arguments.py)
                return readable_torch_function(cls, func, types, args, kwargs)
            positional = planned_positions(plan, args, kwargs)
        if len(positional) < MOST_ARGUMENTS:
            lanes = LANES.get(rule)
            if lanes is None:  # (setdefault: threads that get here at once share one list)
                lanes = LANES.setdefault(rule, [_FirstUse(rule, k) for k in range(MOST_ARGUMENTS)])
            return lanes[len(positional)](cls._tt_type, func, positional)
    return readable_torch_function(cls, func, types, args, kwargs)


class _FirstUse:
    """A lane slot before its first call: generates the lane (or chooses the readable path), then runs it."""

    def __init__(self, rule: type, n_args: int):
        self.rule, self.n_args = rule, n_args

    def __call__(self, tracer_type: type, func: Callable, args: tuple) -> Any:
        lane = LANES[self.rule][self.n_args] = make_lane(self.rule, self.n_args)
        return lane(tracer_type, func, args)


def make_lane(rule: type, n_args: int) -> Callable:
    """The compiled lane of `rule` called with n_args arguments (the readable path where none fits)."""
    source = lane_source(rule, n_args)
    if source is None:
        def readable(tracer_type: type, func: Callable, args: tuple) -> Any:
            return run_rule(tracer_type, rule, func, args, {})

        return readable
    name = f"{rule.__name__}_{n_args}"
    filename = os.path.join(_HERE, f"generated_{name}.py")  # inside the package: tools that skip its frames skip it
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)  # tracebacks show the lines
    namespace = _namespace(rule)
    exec(compile(source, filename, "exec"), namespace)
    return namespace[f"record_{name}"]


def _namespace(rule: type) -> Dict[str, Any]:
    table = _table(rule)
    return {"RULE": rule, "run_rule": run_rule, "grad_enabled": torch.is_grad_enabled,
            "any_autocast": torch._C._is_any_autocast_enabled, "INPLACE_FLAG": INPLACE_FLAG, "plain": plain_torch,
            "Tensor": torch.Tensor, "inference": torch.is_inference_mode_enabled,
            "containers": (list, tuple), "AccumulateGrad": AccumulateGrad, "Edge": Edge, "new_edge": tuple.__new__,
            "Context": Context, "Node": Node, "new_node": object.__new__, "STATE": STATE,
            "UNSAVED": _UNSAVED, "NEEDS": _NEEDS, "needs_flags": _needs_flags,
            "next_sequence_nr": _next_sequence_nr,
            "KEPT": KEPT, "BUDGET": BUDGET, "Kept": Kept,
            "weak": weakref.ref, "finish": finish,
            "refcount": sys.getrefcount, "ALONE": ALONE,
            "holds_tensor": holds_tensor, "catch_up": catch_up, "forward": rule.forward,
            "version_of": version_of, "saved_hooks_on": _top_hooks,
            **({} if table is None else {"op": table["op"], "check": table["check"], "Meta": table["Meta"],
                                         "OPTIONS": _options(table)})}


def finish(out: Any, node: Node, tracer_type: type, args: tuple) -> Any:
    """Link any result the lane does not retag itself, as run_rule does (a returned input, several outputs, a view,
    a result the rule saved)."""
    with plain_torch():
        if args and out is args[0] and isinstance(out, tracer_type):
            return out
        return _link_outputs(out, node, tracer_type, args)


def holds_tensor(items: Any) -> bool:
    return any(isinstance(item, torch.Tensor) for item in items)


def _table(rule: type) -> Optional[Dict[str, Any]]:
    """A table rule's data (rule_tables.table_rule): its formulas' `uses` on the class, the op, check and what each
    combination of needed gradients saves in its forward's closure. None for a hand-written rule."""
    if not hasattr(rule, "uses") or not hasattr(rule, "formulas"):
        return None
    closure = inspect.getclosurevars(rule.forward).nonlocals
    globals_ = rule.forward.__globals__
    if not {"op", "check", "keep", "keep_meta", "options", "n"} <= set(closure) or "Meta" not in globals_:
        return None
    return {**closure, "Meta": globals_["Meta"]}


def _options(table: Dict[str, Any]) -> Any:
    options = table["options"]
    return {k: v for k, v in options.items() if k != "inplace"} if isinstance(options, dict) else None


def _positional_parameters(rule: type) -> Optional[Tuple[List[inspect.Parameter], bool]]:
    """The parameters of rule's forward that take an argument by position (after ctx), and whether it takes any
    number more (*args: a loss's forward(ctx, *args, **kwargs) hands them to the torch function)."""
    try:
        parameters = list(inspect.signature(rule.forward).parameters.values())[1:]
    except (TypeError, ValueError):
        return None
    return ([p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)],
            any(p.kind is p.VAR_POSITIONAL for p in parameters))


def lane_source(rule: type, n_args: int) -> Optional[str]:
    """The Python source of rule's lane for a call with n_args arguments; None where the call has no common case."""
    table = _table(rule)
    if table is not None:
        n, options = table["n"], table["options"]
        if n_args < n or (isinstance(options, dict) and n_args > n + len(options)):
            return None
        inputs, body = n, _table_body(rule, table, n_args)
    else:
        found = _positional_parameters(rule)
        if found is None or n_args == 0:
            return None
        parameters, more = found
        if (n_args > len(parameters) and not more) or any(p.default is p.empty for p in parameters[n_args:]):
            return None
        inputs, body = n_args, _function_body(n_args)
    names = [f"a{i}" for i in range(n_args)]
    lines = [f"def record_{rule.__name__}_{n_args}(T, func, args):",
             f'    """{rule.__name__} recorded, every decision taken (the general path: dispatch.run_rule)."""',
             "    if not grad_enabled() or any_autocast() or inference():",
             "        return run_rule(T, RULE, func, args, {})",
             *_inplace_flag_lines(rule, n_args),
             f"    {', '.join(names)}, = args",
             "    with plain():",
             "        edges, needs = [], 0"]
    for i in range(n_args):
        lines += _edge_lines(i) if i < inputs else _option_guard_lines(i)
    lines += ["        if not edges:  # nothing to record",
              "            return run_rule(T, RULE, func, args, {})",
              "        ctx = new_node(Context)  # Context.__init__, written out",
              "        ctx._rule, ctx._edges, ctx._mask, ctx._saved, ctx._versions, ctx.needs_input_grad = (",
              "            RULE, edges, needs, (), UNSAVED, NEEDS.get(needs) or needs_flags(needs))",
              "        node = new_node(Node)  # Node.__init__, written out (value_refs: set below)",
              "        node.rule, node.ctx, node.edges, node.func, node.module_path, node.sequence_nr = (",
              "            RULE, ctx, edges, func, STATE.module_stack, next_sequence_nr())",
              *body]
    return "\n".join(lines) + "\n"


def _inplace_flag_lines(rule: type, n_args: int) -> List[str]:
    """F.relu(x, True): a spelling of the rule whose `inplace` flag this call passes true goes to the readable path,
    which records the in-place write."""
    if not any(RULES.get(func) is rule and position < n_args for func, position in INPLACE_FLAG.items()):
        return []
    return ["    flag = INPLACE_FLAG.get(func)",
            f"    if flag is not None and flag < {n_args} and args[flag]:  # inplace=True: the readable path writes",
            "        return run_rule(T, RULE, func, args, {})"]


def _edge_lines(i: int) -> List[str]:
    a = f"a{i}"
    return [f"        if isinstance({a}, T):",
            f"            if {a}._tt_view and {a}._version != {a}._tt_version:  # a view whose base changed in place",
            f"                catch_up({a}, T, run_rule)  # since it was taken: a view of the base as it is now",
            f"            if {a}._tt_requires_grad:",
            f"                node = {a}._tt_node",
            "                if node is None:  # a leaf: its AccumulateGrad while the graph keeps it, else a new one",
            f"                    acc = {a}._tt_acc",
            "                    node = acc() if acc is not None else None",
            "                    if node is None:",
            f"                        node = AccumulateGrad({a})",
            f"                edges.append(new_edge(Edge, ({i}, node, {a}._tt_nr, {a}.shape, {a}.dtype)))",
            f"                needs |= {1 << i}",
            f"        elif isinstance({a}, Tensor) and {a}.requires_grad or isinstance({a}, containers) and "
            f"holds_tensor({a}):",
            "            return run_rule(T, RULE, func, args, {})  # a torch leaf, or a list of tensors"]


def _option_guard_lines(i: int) -> List[str]:
    a = f"a{i}"
    return [f"        if isinstance({a}, Tensor) or isinstance({a}, containers) and holds_tensor({a}):",
            "            return run_rule(T, RULE, func, args, {})"]


_INPUT_NAMES = {1: ("x",), 2: ("a", "b")}  # what table formulas call their inputs
def _keep_lines(value: str, tracer: str) -> List[str]:
    """The result's value kept for the player (kept_values.kept_output, written out): `value`, a plain alias of it
    that holds no node, while the thread's kept results fit the budget; beyond it a weak reference to `tracer`."""
    return ["        version, count, nbytes = out._version, KEPT.count, out.nbytes  # (read while out is plain)",
            "        if count[0] + nbytes <= BUDGET[0]:  # kept for the player, within the budget",
            "            count[0] += nbytes",
            f"            node.value_refs = (Kept(({value}, version, nbytes, count)),)",
            "        else:",
            f"            node.value_refs = (weak({tracer}),)"]


_RETAG = [*_keep_lines("out.detach()", "out"),
          "        out.__class__ = T  # a fresh result becomes the tracer itself",
          "        out._tt_node, out._tt_requires_grad, out._tt_version = node, True, version",
          "        return out"]


def _not_plain_result(n_args: int) -> str:
    returned_input = "".join(f" or out is a{i}" for i in range(n_args))
    return f"type(out) is not Tensor{returned_input} or not out.is_floating_point() or out._is_view()"


def _function_body(n_args: int) -> List[str]:
    """A hand-written rule: its own forward runs (it saves what its backward reads). Its result is linked here only
    when nothing but this frame holds it (one reference count read: not an argument handed back, not saved, not
    marked non-differentiable, not kept anywhere by the rule); any other goes to `finish`, as run_rule links it."""
    call = ", ".join(f"a{i}" for i in range(n_args))
    return [f"        out = forward(ctx, {call})",
            "        if type(out) is not Tensor or refcount(out) != ALONE or not out.is_floating_point() or "
            "out._is_view():",
            "            return finish(out, node, T, args)",
            *_RETAG]


def _references_of_a_local() -> int:
    """sys.getrefcount of an object only a local variable holds, read as the lanes read it (the count includes the
    call's own argument; interpreters that borrow references on their stack count fewer): a result whose count is
    higher is held elsewhere too."""
    out = object()
    return sys.getrefcount(out)


ALONE = _references_of_a_local()


def _table_body(rule: type, table: Dict[str, Any], n_args: int) -> List[str]:
    """A table rule: the op, its options, and the saves its needed formulas read (uses), written out."""
    n, options = table["n"], table["options"]
    inputs = [f"a{i}" for i in range(n)]
    lines = [f"        check({', '.join(inputs)})"] if table["check"] is not None else []
    if isinstance(options, dict):
        given = ", ".join(f"{name!r}: a{n + j}" for j, name in enumerate(list(options)[:n_args - n])
                          if name != "inplace")
        lines += [f"        ctx.options = {{**OPTIONS{', ' + given if given else ''}}}",
                  f"        out = op({', '.join(inputs)}, **ctx.options)"]
    else:
        if options is not None:  # AS_CALLED: the formulas get the other arguments as called (call_options, whose
            rest = "".join(f"a{i}, " for i in range(n, n_args))  # freezing leaves them as they are: none is a tensor)
            lines.append(f"        ctx.args, ctx.kwargs = ({rest}), {{}}")
        lines.append(f"        out = op({', '.join(f'a{i}' for i in range(n_args))})")
    patterns = [needs for needs in table["keep"] if any(needs)]
    saved_output = set()
    for k, needs in enumerate(patterns):
        mask = sum(1 << i for i, need in enumerate(needs) if need)
        reads = ", ".join(dict.fromkeys(u for i, used in enumerate(rule.uses) if needs[i] for u in used)) or "nothing"
        needed = ", ".join(name for name, need in zip(_INPUT_NAMES[n], needs) if need)
        indent = "        " if len(patterns) == 1 else "            "
        statements = []
        saving, metas = table["keep"][needs], table["keep_meta"][needs]
        if saving is not None:
            statements += _save_lines(indent, [v if save else None for v, save in zip([*inputs, "out"], saving)],
                                      mask)
            if saving[n]:
                saved_output.add(mask)
        if metas is not None:
            items = ", ".join(f"Meta({v}.shape, {v}.dtype, {v}.device)" if meta else "None"
                              for v, meta in zip(inputs, metas))
            statements.append(f"{indent}ctx.metas = [{items}]")
        if len(patterns) == 1:
            lines += [f"        # the formula reads {reads}", *statements]
        else:
            keyword = "if" if k == 0 else "elif"
            lines += [f"        {keyword} needs == {mask}:  # gradients of {needed}: the formulas read {reads}",
                      *(statements or [f"{indent}pass"])]
    plain = _not_plain_result(n_args)
    if not saved_output:
        return [*lines, f"        if {plain}:", "            return finish(out, node, T, args)", *_RETAG]
    if len(saved_output) == len(patterns):
        return [*lines, f"        if {plain}:", "            return finish(out, node, T, args)",
                *_SAVED_RESULT(n)]
    masks = " or ".join(f"needs == {m}" for m in sorted(saved_output))
    return [*lines, f"        if {plain} or {masks}:  # (a saved result is linked as run_rule links it)",
            "            return finish(out, node, T, args)", *_RETAG]


def _save_lines(indent: str, values: List[Optional[str]], mask: int) -> List[str]:
    """Context.save_for_backward written out for these values: the tuple, each one's version counter (an input
    that needs a gradient is a tracer: its counter read directly; another may be a number, which has none), and the
    saved_tensors_hooks in force. A tensor without a version counter (made under inference_mode) raises there."""
    def version(i: int, v: Optional[str]) -> str:
        if v is None:
            return "None"
        return f"{v}._version" if v == "out" or (i < len(values) - 1 and mask >> i & 1) else f"version_of({v})"
    saved = ", ".join(v or "None" for v in values)
    versions = ", ".join(version(i, v) for i, v in enumerate(values))
    return [f"{indent}try:",
            f"{indent}    ctx._saved, ctx._versions = ({saved}), [{versions}]",
            f"{indent}except RuntimeError:  # an inference tensor: save_for_backward says why it cannot be saved",
            f"{indent}    ctx.save_for_backward({saved})",
            f"{indent}if saved_hooks_on(False) is not None:  # torch's saved_tensors_hooks in force",
            f"{indent}    ctx.save_for_backward({saved})"]


def version_of(value: Any) -> Optional[int]:
    """The version counter of a saved value (None for a number)."""
    return getattr(value, "_version", None)


def _SAVED_RESULT(n: int) -> List[str]:
    """The result is saved: the tracer is a second Python object over it (a tracer saved by its own node would
    keep that node alive through itself), and create_graph re-links the saved one (saved_outputs)."""
    return ["        t = out.detach()  # the saved result stays plain; the tracer: a detached alias",
            "        t.__class__ = T",
            *_keep_lines("out", "t"),
            f"        node.saved_outputs = (({n}, 0),)",
            "        t._tt_node, t._tt_requires_grad, t._tt_version = node, True, version",
            "        return t"]


def show(name: str) -> str:
    """The generated lane of the rule named `name` (as `python -m torchtrace ops --show Mul` prints it), for its first
    registered callable called with its required arguments."""
    targets = [func for func, rule in RULES.items() if rule.__name__ == name]
    if not targets:
        raise KeyError(f"no rule named {name!r}: `python -m torchtrace ops` lists the ops, rule names are as in "
                       "grad_fn names without 'Backward' (MulBackward -> Mul)")
    rule, table = RULES[targets[0]], _table(RULES[targets[0]])
    parameters, more = _positional_parameters(rule) or ([], False)  # forward(ctx, *args): a loss's rule, called with
    n_args = table["n"] if table is not None else len(rule.parameter_names()) if more else sum(  # all its torch
        p.default is p.empty for p in parameters)  # function's parameters, as torch hands them on: mse_loss's six
    source = lane_source(rule, n_args)
    return source if source is not None else f"{name} has no lane for {n_args} arguments: it runs dispatch.run_rule\n"
