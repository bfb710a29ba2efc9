"""The shapes a tangent rule takes, so most table entries are one line.

- `diagonal`: an elementwise op has a diagonal Jacobian, J = J^T, so its tangent is its own backward applied
  once to the tangent (no second derivative: the vector-Jacobian product of a diagonal J IS J ẋ).
- `pointwise`: a table rule (ops/rule_tables.py) of several inputs: ẏ = Σ_i ∂y/∂x_i ẋ_i, each term its own
  gradient formula applied to ẋ_i, for the same reason.
- `linear`: the op is linear in its floating arguments (views, copies, gathers, sums, pads): ẏ = op(ẋ, ...),
  derivatives.yaml's `auto_linear`. Fill values (a Python number written into the result) become 0.
- `product`: multilinear in `factors`: ẏ = Σ_i op(..., ẋ_i, ...) with the other factors at their values.
- `decomposed`: the op written with other torch ops, whose tangents a nested dual pass carries (as torch
  derives forward-mode formulas from decompositions).
"""
from typing import Any, Callable, Iterable, Optional, Sequence, Union

import torch

from torchtrace.autograd.plain import plain_torch
from torchtrace.forward.call import Call, NoTangent

Positions = Sequence[Union[int, str]]


def _first(grads: Any) -> Any:
    return grads[0] if isinstance(grads, (tuple, list)) else grads


def diagonal(call: Call) -> torch.Tensor:
    """ẏ = f'(x) ẋ: the rule's backward applied to ẋ (J = J^T for an elementwise op)."""
    call.only(0)
    return _first(call.rule.backward(call.ctx, call.dot(0)))


def pointwise(call: Call) -> torch.Tensor:
    """ẏ = Σ_i ∂y/∂x_i ẋ_i with the table rule's gradient formulas, broadcast to y's shape."""
    formulas = call.rule.formulas
    n = len(formulas)
    call.only(*range(n))
    values = [*call.args[:n], call.out]
    options = getattr(call.ctx, "options", None) or {}
    total = None
    for i, formula in enumerate(formulas):
        dot = call.dot(i)
        if dot is not None:
            term = formula(dot, *values, **options)
            total = term if total is None else total + term
    return total.expand(call.out.shape)


def _is_float_tensor(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.is_floating_point()


def _swap(value: Any, dot: Any, zero: bool) -> Any:
    """A floating tensor becomes its tangent (zeros without one); a fill value (`zero`) becomes 0."""
    if isinstance(value, (list, tuple)) and any(_is_float_tensor(v) for v in value):
        dots = dot if dot is not None else [None] * len(value)
        return type(value)(_swap(v, d, False) for v, d in zip(value, dots))
    if _is_float_tensor(value):
        return dot if dot is not None else torch.zeros_like(value)
    if zero and isinstance(value, (bool, int, float)):
        return 0
    return value


def linear(positions: Optional[Iterable[int]] = None, fills: Positions = ()) -> Callable[[Call], Any]:
    """ẏ = op(ẋ, ...): every floating argument (or those at `positions`) replaced by its tangent."""
    chosen = None if positions is None else tuple(positions)

    def rule(call: Call) -> Any:
        if chosen is not None:
            call.only(*chosen)
        args = [_swap(a, call.dot(i), i in fills) if chosen is None or i in chosen else a
                for i, a in enumerate(call.args)]
        kwargs = {k: _swap(v, call.kwdots.get(k), k in fills) if chosen is None else v
                  for k, v in call.kwargs.items()}
        return call.run(*args, **kwargs)

    rule.__doc__ = "ẏ = op(ẋ, ...) (the op is linear)"
    return rule


def product(factors: Sequence[int], offset: Optional[int] = None) -> Callable[[Call], Any]:
    """ẏ = Σ_i op(x_1, .., ẋ_i, .., x_n) over the `factors`; an `offset` argument (addmm's input, beta * input)
    enters linearly, in one more term with every factor's tangent zero."""

    def rule(call: Call) -> Any:
        call.only(*factors, *(() if offset is None else (offset,)))
        total = None
        for i in factors:
            if call.dot(i) is not None:
                args = list(call.args)
                args[i] = call.dot(i)
                if offset is not None and offset < len(args) and isinstance(args[offset], torch.Tensor):
                    args[offset] = torch.zeros_like(args[offset])
                term = call.run(*args, **call.kwargs)
                total = term if total is None else total + term
        if offset is not None and call.dot(offset) is not None:
            args = list(call.args)
            args[factors[0]] = torch.zeros_like(args[factors[0]])
            args[offset] = call.dot(offset)
            term = call.run(*args, **call.kwargs)
            total = term if total is None else total + term
        return total

    return rule


def decomposed(fn: Callable[..., Any]) -> Callable[[Call], Any]:
    """The tangent of `fn(*args, **kwargs)`, a composition of ops with tangent rules, by a nested dual pass."""

    def rule(call: Call) -> Any:
        from torchtrace.factories import as_tracer
        from torchtrace.forward.dual import DualPass, NoTangentError

        inner = DualPass()
        inner.strict = True

        def leaf(value: Any, dot: Any) -> Any:
            if isinstance(value, (list, tuple)):
                dots = dot if dot is not None else [None] * len(value)
                return type(value)(leaf(v, d) for v, d in zip(value, dots))
            if not _is_float_tensor(value):
                return value
            with plain_torch():
                fresh = as_tracer(value.detach().as_subclass(torch.Tensor), requires_grad=dot is not None)
            if dot is not None:
                inner.seed(fresh, dot)
            return fresh

        args = [leaf(a, call.dot(i)) for i, a in enumerate(call.args)]
        kwargs = {k: leaf(v, call.kwdots.get(k)) for k, v in call.kwargs.items()}
        try:
            with inner.running():
                out = fn(*args, **kwargs)
        except NoTangentError:
            raise NoTangent from None
        if isinstance(out, torch.Tensor):
            return inner.tangent_of(out)
        return tuple(inner.tangent_of(o) for o in out)

    rule.recorded = True  # runs with recording on (a nested pass), not under plain_torch()
    return rule


def refuse(call: Call) -> Any:
    """No tangent rule for this case: transpose the op's backward."""
    raise NoTangent
