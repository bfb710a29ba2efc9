"""A path of the program lowered to code: the rules' own torch calls, forward and backward, as Ops over Values.

Each REPLAY statement's rule runs again on the tensors its recording call saw (plain aliases), under `Writer`,
a TorchFunctionMode that writes down every torch call the rule makes; then, in reverse, each rule's backward on
that Context, and what each edge receives (`edge_gradient`: unbroadcast and cast), summed where values meet.
So the code is the rules' code, op by op. The random generator and any tensor a rule changes in place (running
statistics) are put back afterwards.
"""
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch
from torch.overrides import TorchFunctionMode

from torchtrace.autograd.function import INPLACE_FLAG, Function
from torchtrace.autograd.node import Context, edge_gradient
from torchtrace.compiler.ir import EAGER, PASS, Listing, Op, Statement, Value, describe
from torchtrace.compiler.replay import is_inplace
from torchtrace.compiler.step_code import StepCode, step_code
from torchtrace.compiler.tracing.judge import call_values
from torchtrace.compiler.tracing.recorder import plain_numbers
from torchtrace.compiler.tracing.symbolic_float import SymbolicFloat, Var
from torchtrace.errors import UnsupportedOperationError
from torchtrace.naming import callable_name
from torchtrace.rule_math import rule_math

_WRITES = {torch.Tensor.__setitem__}  # writes into their first argument and return None


class Writer(TorchFunctionMode):
    """Every torch call made inside (on plain tensors) becomes an Op of `ops`; its tensor results new Values."""

    def __init__(self, listing: Listing, kind: str):
        super().__init__()
        self.listing, self.kind = listing, kind
        self.ops: List[Op] = []
        self.keep: List[Any] = []

    def value(self, t: torch.Tensor, hint: str = "") -> Value:
        found = self.listing.of.get(id(t))
        if found is None:
            found = self.listing.of[id(t)] = Value(hint, self.kind, (t.shape, t.dtype))
            self.keep.append(t)
        return found

    def __torch_function__(self, func: Callable, types: Any, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
        kwargs = kwargs or {}
        owner = getattr(func, "__self__", None)
        if isinstance(owner, type) and issubclass(owner, Function):  # a rule calling another rule's apply
            with self:
                return owner.forward(Context(owner), *args, **kwargs)
        out = func(*plain_numbers(args), **plain_numbers(kwargs))  # torch's Python (F.hardtanh's bounds check)
        results = [out] if isinstance(out, torch.Tensor) else [o for o in out if isinstance(o, torch.Tensor)] \
            if isinstance(out, (list, tuple)) else []
        if func in _WRITES or results and is_inplace(func, args, kwargs):  # `t[i] = v`, `t.add_(1)`: a line of its
            self.ops.append(Op([], func, args, kwargs))  # own, which changes the tensor the later lines read
            return out
        if not results or any(r is a for r in results for a in args):
            return out  # a read (shape, item) or the argument itself handed back: no line
        targets = [self.value(o) if isinstance(o, torch.Tensor) else None
                   for o in (out if isinstance(out, (list, tuple)) else [out])]
        self.ops.append(Op(targets, func, args, kwargs, unpack=not isinstance(out, torch.Tensor)))
        return out


def _doc(rule: type) -> str:
    math = rule_math(rule)
    return f"{rule.__name__}: {math}" if math else rule.__name__


def lower(path: List[Statement], outputs: List[int], argument_order: Sequence[str] = ()) -> Listing:
    """The forward and backward code of `path`, whose call returned the values numbered `outputs`; the inputs in
    the function's own order of its arguments (`argument_order`, their names)."""
    listing = Listing()
    state = torch.get_rng_state()
    restore: List[Any] = []
    try:
        with torch._C.DisableTorchFunctionSubclass():
            contexts = _forward(path, listing, restore)
            read = {v.hint for v in listing.inputs}  # a tensor argument the path never reads is still an argument
            listing.inputs += [Value(name, "input") for name in argument_order if name not in read]
            order = {name: i for i, name in enumerate(argument_order)}
            listing.inputs.sort(key=lambda v: order.get(v.hint, len(order)))
            _backward(path, listing, contexts, outputs)
    finally:
        torch.set_rng_state(state)
        with torch.no_grad():
            for t, data in restore:
                if not torch.equal(t, data):
                    t.copy_(data)
    return listing


def _forward(path: List[Statement], listing: Listing, restore: list) -> Dict[int, Any]:
    values: Dict[int, Value] = {}  # value number -> its Value
    slots: Dict[int, Value] = {}
    contexts: Dict[int, Any] = {}  # statement index -> (ctx, the plain tensors at each edge, output Values)
    for index, st in enumerate(path):
        if st.kind == EAGER and st.func is torch.Tensor.__setitem__:
            raise UnsupportedOperationError(
                f"to_code: {st.describe()} writes into a tensor in place (`t[i] = v`), which the straight-line code "
                "of this path cannot show with its gradient — write it out of place to see it as code: "
                "t = t.index_put((i,), v), or torch.where(mask, v, t)")
        if st.kind == EAGER and st.rule is None:
            raise UnsupportedOperationError(
                f"to_code: {st.describe()} runs eagerly inside the compiled program (an in-place change, a "
                "Function.apply or a call that records several nodes), so straight-line code cannot show its "
                "gradient — write it out of place to see it as code")
        args, kwargs, results = st.example
        _, tensors = describe(args, kwargs)
        writer = Writer(listing, "t")
        for t, source in zip(tensors, st.sources):
            if source >= 0:
                listing.of[id(t)] = values[source]
                continue
            slot = ~source
            if slot not in slots:
                name, kind = st.slot_names.get(slot, ("", "param"))
                slots[slot] = Value(name or f"leaf{slot}", kind, None if name else (tuple(t.shape), t.dtype))
                (listing.inputs if slots[slot].kind == "input" else listing.params).append(slots[slot])
                restore.append((t, t.detach().clone()))
            listing.of[id(t)] = slots[slot]
            writer.keep.append(t)
        if st.kind == PASS:
            continue
        note = "" if st.kind != EAGER or not is_inplace(st.func, args, kwargs) else f"  ({callable_name(st.func)}" + (
            "(inplace=True)" if st.func in INPLACE_FLAG else "") + ": in place, recorded as its out-of-place twin)"
        listing.forward.append(Op([], None, comment=f"{st.rule.__name__}" + (f"  [{st.module}]" if st.module else "")
                                  + note))
        ctx = Context(st.rule, (), st.mask)
        where = f"{st.rule.__name__} at {st.line.split('  ')[0]}" if st.line else st.describe()
        if _numbers_are_parameters(st, args, kwargs):  # each float of the call a name of the code (f0, f1...)
            args, kwargs = _as_numbers((tuple(args), dict(kwargs)), listing, where)
        else:  # a number the rule branches on: an argument too, which the code checks it was written for
            listing.numbers += [(value, where, True) for value in call_values(args, kwargs)[1]]
        with writer:
            out = st.rule.forward(ctx, *args, **kwargs)
        listing.forward.extend(writer.ops)
        raw = [out] if isinstance(out, torch.Tensor) else [o for o in out if isinstance(o, torch.Tensor)]
        for n, r in enumerate(raw):
            v = writer.value(r)
            if ": " in st.module and n == 0:
                v.hint = "h_" + st.module.split(": ")[0].replace(".", "_")
            values[st.first_value + n] = v
        edge_tensors = [(edge, _at(args, kwargs, st.rule, edge.position), source) for edge, source in st.edges]
        contexts[index] = (ctx, edge_tensors, [values[st.first_value + n] for n in range(len(raw))], raw, writer)
    listing.values, listing.slots = values, slots
    return contexts


def _numbers_are_parameters(st: Statement, args: tuple, kwargs: dict) -> bool:
    """A statement whose rule was traced clean with its floats as symbols (step_code.py): its code takes them as
    numbers of the call. The others keep them as literals: a rule that branches on a float (pow's exponent, dropout's
    p) was written out for that value only, so the code takes it as a number too and refuses any other."""
    if not call_values(args, kwargs)[1]:
        return False
    code = st.code if st.code is not None else step_code(st.rule, st.key, st.mask, args, kwargs)
    return isinstance(code, StepCode) and code.fixed_floats is None


def _as_numbers(tree: Any, listing: Listing, where: str) -> Any:
    """The call's arguments with each float a SymbolicFloat named f<k> (k counting over the path), noted in
    listing.numbers with its value and the call that took it."""
    if type(tree) is float:
        listing.numbers.append((tree, where, False))
        return SymbolicFloat(tree, Var(len(listing.numbers) - 1))
    if isinstance(tree, list):
        return [_as_numbers(item, listing, where) for item in tree]
    if isinstance(tree, tuple) and not isinstance(tree, torch.Size):
        items = [_as_numbers(item, listing, where) for item in tree]
        return type(tree)(*items) if hasattr(type(tree), "_fields") else type(tree)(items)
    if isinstance(tree, dict):
        return {k: _as_numbers(v, listing, where) for k, v in tree.items()}
    return tree


def _at(args: tuple, kwargs: dict, rule: type, position: Any) -> torch.Tensor:
    index, item = (position, None) if type(position) is int else position
    value = args[index] if index < len(args) else next(v for k, v in kwargs.items() if rule.param_index(k) == index)
    return value if item is None else value[item]


def _backward(path: List[Statement], listing: Listing, contexts: Dict[int, Any], outputs: List[int]) -> None:
    values: Dict[int, Value] = listing.values
    writer = Writer(listing, "g")
    buffers: Dict[Any, torch.Tensor] = {}
    tensor_of = {}  # value number -> a plain tensor standing for it
    for index, (_, _, outs, raw, _) in contexts.items():
        for n, r in enumerate(raw):
            tensor_of[path[index].first_value + n] = r
    for i, number in enumerate(outputs):
        if number not in tensor_of:
            continue
        g = torch.ones_like(tensor_of[number])
        seed = writer.value(g, f"grad{i}")
        seed.kind = "grad_out"
        listing.grad_outputs.append(seed)
        listing.outputs.append(values[number])
        buffers[number] = g
    with torch.no_grad(), writer:
        for index in sorted(contexts, reverse=True):
            st = path[index]
            ctx, edge_tensors, outs, raw, _ = contexts[index]
            grads = [buffers.pop(st.first_value + n, None) for n in range(len(raw))]
            if all(g is None for g in grads):
                continue
            grads = [torch.zeros_like(r) if g is None else g for g, r in zip(grads, raw)] if len(grads) > 1 else grads
            writer.ops.append(Op([], None, comment=_doc(st.rule)))
            result = st.rule.backward(ctx, *grads)
            result = result if isinstance(result, tuple) else (result,)
            for edge, _, source in edge_tensors:
                g = edge_gradient(edge, result)
                if g is None:
                    continue
                key = source if source >= 0 else ("slot", ~source)
                buffers[key] = g if key not in buffers else torch.add(buffers[key], g)
    listing.backward = writer.ops
    slot_of = {id(v): slot for slot, v in listing.slots.items()}
    for leaf in (*listing.inputs, *listing.params):
        g = buffers.get(("slot", slot_of.get(id(leaf))))
        listing.gradients.append((leaf, None if g is None else writer.value(g)))
    used = {id(v) for op in listing.backward for v in _read_values(op, listing)}
    listing.saved = [v for v in _forward_values(listing) if id(v) in used]


def _read_values(op: Op, listing: Listing) -> List[Value]:
    found = []
    for a in (*op.args, *op.kwargs.values()):
        for t in (a if isinstance(a, (list, tuple)) else (a,)):
            if isinstance(t, torch.Tensor) and id(t) in listing.of:
                found.append(listing.of[id(t)])
    return found


def _forward_values(listing: Listing) -> List[Value]:
    seen, out = set(), []
    for op in listing.forward:
        for v in [*_read_values(op, listing), *(t for t in op.targets if t is not None)]:
            if id(v) not in seen and v.kind in ("t", "input", "param"):
                seen.add(id(v))
                out.append(v)
    return out
