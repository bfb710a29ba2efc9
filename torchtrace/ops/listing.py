"""The registry, listed: which torch callables torchtrace differentiates, by family, with each rule's math line.

This is the one source of every count and list the project shows: `python -m torchtrace ops`, `tt.supported_ops()`,
the docs site's formula page and the lessons all read it. A callable counts when a user can type its name
(`torch.exp`, `torch.Tensor.__add__`; not an internal spelling such as `torch._C._nn.linear`) and its rule
differentiates it (a rule marked `refused`, which only explains why there is no gradient, does not count).
"""
import re
from collections import defaultdict
from typing import Callable, Dict, List

from torchtrace.autograd.function import RULES
from torchtrace.naming import callable_name
from torchtrace.rule_math import rule_math

# a derivative statement: d<name> = / d<name>/d<name> = / ∂... / grad ... (after the math line's "->")
_DERIVATIVE = re.compile(r"->.*(\bd\w*(\[[^\]]*\]|\([^)]*\))?(/d\w+)?\s*=|∂|\bgrad\w*\b)")
_PRIVATE_NAME = re.compile(r"(?<![\w.|)\]}'])_[a-z]\w*")  # _class_coefficients (not the subscript of ||x||_p)


def is_public(name: str) -> bool:
    """`torch.exp`, `torch.Tensor.__add__`: public; `torch._C._nn.glu`, `torch._ops.aten.slice`: private spellings."""
    return not any(part.startswith("_") and not (part.startswith("__") and part.endswith("__"))
                   for part in name.split("."))


def is_refusal(rule: type) -> bool:
    """A rule registered only to refuse its op with a reason (ops/refused.py)."""
    return bool(getattr(rule, "refused", False))


def supported_ops() -> List[Callable]:
    """Every torch callable, under a public name, whose gradient torchtrace computes (function, method and
    operator forms: torch.mul, torch.Tensor.mul and torch.Tensor.__rmul__ are three)."""
    return [func for func, rule in RULES.items() if not is_refusal(rule) and is_public(callable_name(func))]


def families() -> Dict[str, List[str]]:
    """The names of `supported_ops()`, grouped by the file that holds their rule (`arithmetic`, `conv`, ...)."""
    grouped: Dict[str, List[str]] = defaultdict(list)
    for func in supported_ops():
        grouped[RULES[func].__module__.rsplit(".", 1)[-1]].append(callable_name(func))
    return {family: sorted(names) for family, names in sorted(grouped.items())}


def rules() -> List[type]:
    """Every registered rule (refusals included), each once, in a stable order."""
    return sorted(set(RULES.values()), key=lambda rule: (rule.__module__, rule.__name__))


def math_line(rule: type) -> str:
    """The rule's whole math (the first paragraph of its docstring, on one line), as the player and the docs show it."""
    return rule_math(rule)


def math_line_problem(rule: type) -> str:
    """Why a rule's math line does not state its derivative ('' when it does).

    The convention: `y = f(x)  ->  dx = ...` -- after `->` a derivative (`dx =`, `dz/da =`, `∂`, or `grad`),
    in plain notation (no private helper names such as `_helper`). A refusal states why there is none.
    """
    line = math_line(rule)
    if is_refusal(rule):
        return "" if line.startswith("refused:") else "a refusal's math line starts with 'refused:' and the reason"
    if not _DERIVATIVE.search(line):
        return "no derivative after '->' (write e.g. 'y = f(x)  ->  dx = g f'(x)')"
    private = _PRIVATE_NAME.findall(line)
    return f"names private helpers {private}" if private else ""
