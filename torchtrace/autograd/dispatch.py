"""Every torch call on a tracer lands here: look up the rule, run forward on plain tensors, link a Node."""
import inspect
import itertools
import weakref
from typing import Any, Callable, Dict, Optional

import torch

from torchtrace.autograd.function import RULES, AccumulateGrad, Node, callable_name
from torchtrace.autograd.observers import ON_RECORD
from torchtrace.errors import UnsupportedOperationError

_guard = torch._C.DisableTorchFunctionSubclass
_grad_enabled = torch.is_grad_enabled
_sequence = (list, tuple)

TRACER: type = torch.Tensor  # replaced by torchtrace.tracer.tracer when that module loads
INPLACE: Dict[Callable, tuple] = {}  # in-place callable -> (rule, out-of-place twin)
NON_DIFFERENTIABLE: set = set()  # callables whose floating outputs never carry a gradient
MODULE_STACK: list = []  # the tt.nn modules running now; each recorded node remembers the innermost one


def torch_function(cls: type, func: Callable, types: Any, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
    """tracer.__torch_function__: the one entry point of every intercepted torch call."""
    rule = RULES.get(func)
    if rule is not None:
        return run_rule(rule, func, args, kwargs or {})
    return _run_without_rule(func, args, kwargs or {})


def run_rule(rule: type, func: Optional[Callable], args: tuple, kwargs: dict) -> Any:
    """Run `rule` (forward of func); record a Node when some tracer argument requires a gradient."""
    if kwargs:
        args, kwargs = _keywords_to_positions(func or rule.forward, args, kwargs)
    with _guard():
        inputs = _grad_inputs(rule, args, kwargs) if _grad_enabled() else None
        if not inputs:
            out = func(*args, **kwargs) if func is not None else rule.forward(Node(rule, None, []), *args, **kwargs)
            return _as_tracers(out)
        node = Node(rule, func, inputs)
        if MODULE_STACK:
            node.module = MODULE_STACK[-1]
        result = _link_outputs(rule.forward(node, *args, **kwargs), node)
    if ON_RECORD:
        for observe in ON_RECORD:
            observe(node, args, kwargs, result)
    return result


_POSITIONAL: Dict[Callable, tuple] = {}
_NUMPY_NAMES = (("axis", "dim"), ("keepdims", "keepdim"))


def _positional_parameters(func: Callable) -> tuple:
    """((name, default), ...) of parameters passable by position, and whether that signature is exact.

    Python functions (torch.nn.functional) have exact signatures; torch's builtins only the approximate
    ones of torch.overrides.get_testing_overrides(), which do not mark keyword-only parameters.
    """
    if func not in _POSITIONAL:
        exact = True
        try:
            signature = inspect.signature(func)
        except (TypeError, ValueError):
            exact, fallback = False, torch.overrides.get_testing_overrides().get(func)
            signature = inspect.signature(fallback) if fallback else None
        params = list(signature.parameters.values()) if signature else []
        if params and params[0].name == "ctx":
            params = params[1:]
        kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        positional = list(itertools.takewhile(lambda p: p.kind in kinds and p.name != "out", params))
        _POSITIONAL[func] = [(p.name, p.default) for p in positional], exact
    return _POSITIONAL[func]


def _keywords_to_positions(func: Callable, args: tuple, kwargs: dict) -> tuple:
    """torch.add(x, other=y) -> torch.add(x, y): rules see tensors in torch's positional order.

    Builtins move only tensor keywords (whose gradients must be routed); options such as alpha= stay
    keywords, which rules accept under torch's names.
    """
    if kwargs.get("out") is not None:
        raise RuntimeError(f"{getattr(func, '__name__', func)}(): out= is not supported on tracers (no gradient "
                           "can flow into a preallocated output); assign the result instead")
    for alias, name in _NUMPY_NAMES:  # x.sum(axis=0, keepdims=True) means x.sum(dim=0, keepdim=True)
        if alias in kwargs and name not in kwargs:
            kwargs = {name if k == alias else k: v for k, v in kwargs.items()}
    params, exact = _positional_parameters(func)
    names = [name for name, _ in params]
    movable = [k for k, v in kwargs.items() if k in names and (exact or isinstance(v, torch.Tensor))]
    last = max((names.index(k) for k in movable), default=-1)
    if last < len(args):
        return args, kwargs
    moved = params[len(args):last + 1]
    filled = [kwargs[name] if name in kwargs else default for name, default in moved]
    if any(value is inspect.Parameter.empty for value in filled):
        return args, kwargs
    rest = {k: v for k, v in kwargs.items() if k not in {name for name, _ in moved}}
    return tuple(args) + tuple(filled), rest


def _grad_inputs(rule: type, args: tuple, kwargs: dict) -> list:
    """(position, next node, output nr, shape, dtype) for every argument that requires a gradient."""
    found = []
    for i, arg in enumerate(args):
        if isinstance(arg, TRACER):
            if arg._tt_requires_grad:
                found.append(_edge(i, arg))
        elif type(arg) in _sequence:
            found.extend(_edge((i, j), e) for j, e in enumerate(arg) if isinstance(e, TRACER) and e._tt_requires_grad)
    for name, arg in kwargs.items():
        if isinstance(arg, TRACER) and arg._tt_requires_grad:
            found.append(_edge(rule.param_index(name), arg))
    return found


def _edge(key: Any, t: torch.Tensor) -> tuple:
    node = t._tt_node
    if node is None:
        acc = t._tt_acc() if t._tt_acc is not None else None
        return key, acc or leaf_accumulator(t), 0, t.shape, t.dtype
    if t._version != t._tt_version:
        raise RuntimeError(
            f"A tracer produced by {node.name} was modified in place (through itself or a view sharing its "
            "storage) outside the recorded graph, so its gradient would be wrong. Use out-of-place ops."
        )
    return key, node, t._tt_nr, t.shape, t.dtype


def leaf_accumulator(leaf: torch.Tensor) -> AccumulateGrad:
    """The leaf's AccumulateGrad node; the leaf holds it weakly, the graph strongly (as torch does)."""
    acc = leaf._tt_acc() if leaf._tt_acc is not None else None
    if acc is None:
        acc = AccumulateGrad(leaf)
        leaf._tt_acc = acc.weak_self
    return acc


def _link_outputs(out: Any, node: Node) -> Any:
    if isinstance(out, torch.Tensor):
        if node.saved:
            node.raw_outputs = (weakref.ref(out),)  # to re-link saved outputs for create_graph
        return link_output(out, node, 0)
    if not isinstance(out, _sequence) or not all(isinstance(o, torch.Tensor) for o in out):
        return out  # not a tensor result (e.g. x.type() returns a string): nothing to record
    outputs = tuple(out)
    node.n_outputs = len(outputs)
    node.out_meta = [(o.shape, o.dtype, o.device) for o in outputs]
    if node.saved:
        node.raw_outputs = tuple(weakref.ref(o) for o in outputs)
    linked = [link_output(o, node, nr) for nr, o in enumerate(outputs)]
    return linked if isinstance(out, list) else type(out)(linked)


def link_output(raw: torch.Tensor, node: Node, nr: int) -> torch.Tensor:
    """Wrap a plain forward result as a tracer whose grad_fn is `node` (integer results get no node)."""
    t = raw.as_subclass(TRACER)
    if raw.is_floating_point() or raw.is_complex():
        t._tt_node, t._tt_requires_grad = node, True
        if nr:
            t._tt_nr = nr
        version = raw._version
        if version:
            t._tt_version = version
    if raw._is_view():
        t._tt_view = True
    return t


def _as_tracers(out: Any) -> Any:
    """Results of ops that record nothing are still tracers (as torch's subclass convention)."""
    if isinstance(out, torch.Tensor):
        if isinstance(out, TRACER):
            return out
        t = out.as_subclass(TRACER)
        if out._is_view():
            t._tt_view = True
        return t
    if isinstance(out, _sequence):
        converted = [_as_tracers(o) for o in out]
        return converted if isinstance(out, list) else type(out)(converted)
    return out


def flat_arguments(args: tuple, kwargs: dict) -> list:
    """Positional and keyword arguments, and the items of list/tuple arguments (as torch.cat's)."""
    items = list(args) + list(kwargs.values())
    return items + [e for a in items if type(a) in _sequence for e in a]


def _needs_grad(args: tuple, kwargs: dict) -> bool:
    return any(isinstance(a, TRACER) and a._tt_requires_grad for a in flat_arguments(args, kwargs))


def _run_without_rule(func: Callable, args: tuple, kwargs: dict) -> Any:
    """No rule: in-place ops are recorded through their out-of-place twin; other ops must be non-differentiable."""
    recording = _grad_enabled() and _needs_grad(args, kwargs)
    if recording and func in INPLACE:
        return _record_inplace(*INPLACE[func], func, args, kwargs)
    with _guard():
        out = func(*args, **kwargs)
    if recording and func not in NON_DIFFERENTIABLE and _has_floating(out):
        name = callable_name(func)
        raise UnsupportedOperationError(
            f"torchtrace has no gradient rule for {name}, and one of its inputs requires a gradient. Write one "
            f"with tt.Function and connect it with tt.register({name}, YourFunction), or run this call under "
            "tt.no_grad()."
        )
    return _as_tracers(out)


def _has_floating(out: Any) -> bool:
    if isinstance(out, torch.Tensor):
        return out.is_floating_point() or out.is_complex()
    return isinstance(out, tuple) and any(_has_floating(o) for o in out)


def _record_inplace(rule: type, twin: Callable, func: Callable, args: tuple, kwargs: dict) -> torch.Tensor:
    """x.op_(...) = rebind x to op(x_before, ...): the graph gains a node, then the data changes in place."""
    target, name = args[0], callable_name(func)
    if not isinstance(target, TRACER):
        raise RuntimeError(f"{name} would write a tracer that requires grad into a plain torch.Tensor, which "
                           "cannot record it. Make the destination a tracer (e.g. tt.zeros(...)), or build the "
                           "result out of place (torch.stack / torch.cat / torch.where).")
    if target._tt_requires_grad and target._tt_node is None:
        raise RuntimeError(f"A leaf tracer that requires grad is used in the in-place operation {name}. Do it "
                           "under tt.no_grad() (as optimizers do), or use the out-of-place form.")
    if target._tt_view:
        raise RuntimeError(f"{name} changes a view of another tensor in place, which torchtrace cannot record "
                           "(the base tensor would not know). Write y[i] = y[i] + v instead of y[i] += v, or use "
                           "the out-of-place form.")
    with _guard():
        before = target.clone()
        before = link_output(before, target._tt_node, target._tt_nr) if target._tt_node else before.as_subclass(TRACER)
    result = run_rule(rule, twin, (before,) + tuple(args[1:]), kwargs)
    with _guard():
        func(*args, **kwargs)
        target._tt_node, target._tt_nr, target._tt_requires_grad = result._tt_node, result._tt_nr, True
        target._tt_version = target._version
    return target


def pair_inplace_methods() -> None:
    """Map every `torch.Tensor.op_` to the rule of `torch.Tensor.op`, so in-place calls are recorded."""
    for func, rule in list(RULES.items()):
        name = getattr(func, "__name__", "")
        twin = getattr(torch.Tensor, name + "_", None) if getattr(torch.Tensor, name, None) is func else None
        if twin is not None and twin not in RULES:
            INPLACE.setdefault(twin, (rule, func))
