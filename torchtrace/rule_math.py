"""A rule's math as every tool shows it: the first paragraph of its docstring, whole.

A rule's docstring opens with its math (`y = f(x)  ->  dx = g f'(x)`, continued on indented lines where it is long,
with the symbols it uses defined there); a blank line ends it. The player, the trace, the doctor, generated code and
the docs' formula page all show these lines, never only the first one.
"""
from typing import List


def rule_math_lines(rule: type) -> List[str]:
    """The lines of the first paragraph of `rule`'s docstring, stripped."""
    paragraph = (rule.__doc__ or "").strip().split("\n\n")[0]
    return [line.strip() for line in paragraph.splitlines() if line.strip()]


def rule_math(rule: type) -> str:
    """The rule's whole math on one line (its lines joined by a space)."""
    return " ".join(rule_math_lines(rule))
