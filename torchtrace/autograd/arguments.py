"""Calls as torch's signatures read them: keywords that hold tensors moved to their positions, numpy's names."""
import inspect
import itertools
from typing import Any, Callable, Dict, Optional, Tuple

import torch

from torchtrace.autograd.plain import plain_torch

_POSITIONAL: Dict[Callable, tuple] = {}  # keyed by registered torch callables only: it owns no user object
# (torch callable, number of positional arguments, keyword names) -> (the (name, default) of each parameter that moves
# to a position, the keywords that stay): how a call to a Python function of torch's (exact signature) is normalised,
# which depends on those names only. dispatch.run_rule applies it without calling keywords_to_positions again.
KEYWORD_PLANS: Dict[tuple, Tuple[tuple, tuple]] = {}

_NUMPY_NAMES = (("axis", "dim"), ("keepdims", "keepdim"))
# torch's argument parser also takes these names for a builtin's `input` and `other` (torch.mul(x1=a, x2=b))
_PARSER_ALIASES = {"x": "input", "a": "input", "x1": "input", "x2": "other", "self": "input"}


def _signature_parameters(target: Callable) -> tuple:
    """((name, default), ...) of parameters passable by position, and whether that signature is exact.

    Python functions (torch.nn.functional, a Function's forward) have exact signatures; torch's builtins
    only the approximate ones of torch.overrides.get_testing_overrides(), which do not mark keyword-only
    parameters.
    """
    exact = True
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):
        exact, fallback = False, torch.overrides.get_testing_overrides().get(target)
        signature = inspect.signature(fallback) if fallback else None
    params = list(signature.parameters.values()) if signature else []
    if params and params[0].name == "ctx":
        params = params[1:]
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    positional = itertools.takewhile(lambda p: p.kind in kinds and p.name != "out", params)
    return [(p.name, p.default) for p in positional], exact


def _positional_parameters(func: Callable) -> tuple:
    """_signature_parameters of a registered torch callable, cached (the keys are torch's, no user object)."""
    found = _POSITIONAL.get(func)
    if found is None:
        found = _POSITIONAL[func] = _signature_parameters(func)
    return found


def _forward_parameters(rule: type) -> tuple:
    """_signature_parameters of a Function's forward, kept on the class (a class made in a loop can die)."""
    found = rule.__dict__.get("_tt_positional")
    if found is None:
        found = rule._tt_positional = _signature_parameters(rule.forward)
    return found


def _rule_parameters(rule: type) -> Tuple[frozenset, int, bool]:
    """The names its forward accepts as keywords, how many positional parameters it names, and whether it takes
    **kwargs (kept on the class)."""
    found = rule.__dict__.get("_tt_keywords")
    if found is None:
        try:
            parameters = list(inspect.signature(rule.forward).parameters.values())[1:]  # after ctx
        except (TypeError, ValueError):
            parameters = []
        kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        named = frozenset(p.name for p in parameters if p.kind is not inspect.Parameter.POSITIONAL_ONLY)
        found = rule._tt_keywords = (named, sum(p.kind in kinds for p in parameters),
                                     any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters))
    return found


def _must_move(rule: type, name: str, position: int) -> bool:
    """A keyword torch accepts that the rule's forward cannot take by that name (torch.mul(input=x, other=2.0) to
    Mul.forward(ctx, a, b)): it moves to its position. A forward with **kwargs passes other keywords on to torch."""
    named, n_positional, var_keyword = _rule_parameters(rule)
    return name not in named and (not var_keyword or position < n_positional)


def _holds_tensor(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    return isinstance(value, (list, tuple)) and any(isinstance(e, torch.Tensor) for e in value)


def keywords_to_positions(func: Optional[Callable], rule: type, args: tuple, kwargs: dict) -> tuple:
    """torch.add(x, other=y) -> torch.add(x, y): rules see tensors in torch's positional order.

    Builtins move only keywords holding tensors (a tensor, or a list of tensors as torch.cat's
    `tensors=`), whose gradients must be routed; options such as alpha= stay keywords, which rules
    accept under torch's names.
    """
    key = (func, len(args), *kwargs)
    if "out" in kwargs and kwargs["out"] is None:  # out=None is torch's default: no preallocated output
        kwargs = {k: v for k, v in kwargs.items() if k != "out"}
    for alias, name in _NUMPY_NAMES:  # x.sum(axis=0, keepdims=True) means x.sum(dim=0, keepdim=True)
        if alias in kwargs and name not in kwargs:
            kwargs = {name if k == alias else k: v for k, v in kwargs.items()}
    as_written = key[2:] == tuple(kwargs)  # no keyword dropped or renamed
    params, exact = _positional_parameters(func) if func is not None else _forward_parameters(rule)
    if not params and func is not None:  # a builtin torch.overrides does not describe: the rule's own names
        params, exact = _forward_parameters(rule)[0], False
    names = [name for name, _ in params]
    if not exact and any(k not in names for k in kwargs):
        kwargs = _parser_names(kwargs, names, _rule_parameters(rule)[0])
    movable = [k for k, v in kwargs.items()
               if k in names and (exact or _holds_tensor(v) or _must_move(rule, k, names.index(k)))]
    last = max((names.index(k) for k in movable), default=-1)
    moved = params[len(args):last + 1]
    filled = [kwargs[name] if name in kwargs else default for name, default in moved]
    if any(value is inspect.Parameter.empty for value in filled):
        moved, filled = [], []
    rest = {k: v for k, v in kwargs.items() if k not in {name for name, _ in moved}}
    if exact and func is not None and as_written and "out" not in kwargs:
        KEYWORD_PLANS[key] = (tuple(moved), tuple(rest))  # the keyword names decide it all
    return tuple(args) + tuple(filled), rest


def planned_positions(plan: Tuple[tuple, tuple], args: tuple, kwargs: dict) -> tuple:
    """The positional arguments of a call whose keyword spelling has a plan: the parameters it moves, each the call's
    keyword or its default, after the call's own positional ones (the keywords that stay, plan[1], are not in it)."""
    return (*args, *[kwargs.get(name, default) for name, default in plan[0]])


def to_positions(func: Optional[Callable], rule: type, args: tuple, kwargs: dict) -> Tuple[tuple, dict]:
    """keywords_to_positions, by its plan where this spelling of the call has one (no signature read again)."""
    plan = KEYWORD_PLANS.get((func, len(args), *kwargs))
    if plan is None:
        return keywords_to_positions(func, rule, args, kwargs)
    return planned_positions(plan, args, kwargs), {k: kwargs[k] for k in plan[1]}


def _parser_names(kwargs: dict, names: list, accepted: frozenset) -> dict:
    """Keywords of a builtin under the names of its approximate signature: torch's parser calls the first two
    tensors `input` and `other` (also x / a / x1 and x2) where torch.overrides may say `self`, or `x` and `y`.
    `input` / `other` stay as they are where the rule's forward takes them by those names (torch.where)."""
    renamed = {}
    for key, value in kwargs.items():
        if key not in names:
            key = _PARSER_ALIASES.get(key, key)
            position = {"input": 0, "other": 1}.get(key)
            if key not in names and key not in accepted and position is not None and position < len(names):
                key = names[position]
        renamed[key] = value
    return renamed


def wants_gradient(value: Any) -> bool:
    """Does a tensor that requires a gradient sit anywhere in this argument (lists, tuples, dicts)?"""
    if isinstance(value, torch.Tensor):
        with plain_torch():
            return bool(getattr(value, "_tt_requires_grad", False) or value.requires_grad)
    if isinstance(value, (list, tuple)):
        return any(wants_gradient(v) for v in value)
    return isinstance(value, dict) and any(wants_gradient(v) for v in value.values())
