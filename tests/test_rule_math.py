"""Every rule's math is shown whole: the player, generated code, the doctor and the ops page show the first paragraph
of the rule's docstring (torchtrace.rule_math), and that paragraph is a whole formula that defines its symbols.

"Whole" is checked as a reader would: brackets balance, the text does not stop on an operator or a comma, and every
short symbol used after `->` (`a_nc`, `w_t`, `U`) is the op's own (written before `->`), defined on the shown lines
(`a_nc = ...`, `w = the class weights`, the factors of a definition `A = U diag(s) V^T`), a derivative of one of
them (`dx`), the incoming gradient (`g`, `gW`, `g_mean`), an index, or one of the conventional symbols below.
"""
import re
from typing import List, Set

import torch
import torch.nn.functional as F

import torchtrace as tt
from torchtrace.autograd.function import RULES
from torchtrace.doctor.where import math_line as doctor_math
from torchtrace.ops.listing import is_refusal, math_line, rules
from torchtrace.rule_math import rule_math

_CLOSING = {"(": ")", "[": "]", "{": "}"}
_TRAILING = re.compile(r"([,;:+*/=-]|->|\b(?:the|and|or|of|with))\s*$")
_WORDS = set("a an as at be by do if in is it of on or to no and the for not per up nn".split())
_INDICES = set("i j k l m n c t q p r s b o h".split())
# transpose and conjugate transpose, the identity, e, pi, ln, the upstream gradient as a matrix (G) or of a loss (dL),
# torch.nn.functional (F)
_CONVENTIONAL = set("T H I e pi ln G dL F".split())
_SYMBOL = re.compile(r"(?<![\w.'])([A-Za-z]{1,2})(?:_(\{[^}]*\}|\w+))?(?![\w(/])")
_DEFINED_AS = re.compile(r"(?<![\w.])([A-Za-z]\w*?)(?:_(?:\{[^}]*\}|\w+))?(?:\[[^\]]*\])?\s*"
                         r"(?:=|~|:|\bthe\b|\ba\b|\bis\b|\bare\b|\btheir\b|\bits\b)")
_DEFINITION = re.compile(r"([A-Za-z]{1,2})(?:_\w+)?\s*=((?:(?!->)[^,;])*)")


def bracket_problem(math: str) -> str:
    expected: List[str] = []
    for ch in math:
        if ch in _CLOSING:
            expected.append(_CLOSING[ch])
        elif ch in ")]}" and (not expected or expected.pop() != ch):
            return f"an unmatched {ch!r}"
    return f"{len(expected)} bracket(s) never closed" if expected else ""


def defined_symbols(math: str) -> Set[str]:
    """The op's own symbols (before each `->`), the names given a meaning, and the factors of their definitions."""
    found = {m.group(1) for part in math.split("->")[:-1] for m in _SYMBOL.finditer(part)}
    for m in _DEFINITION.finditer(math):
        if m.group(1) in found:  # A = U diag(s) V^T: the factors of a known symbol
            found |= {k.group(1) for k in _SYMBOL.finditer(m.group(2))}
    return found | {m.group(1) for m in _DEFINED_AS.finditer(math)}


def undefined_symbols(math: str) -> List[str]:
    if "->" not in math:
        return []
    known = defined_symbols(math) | _CONVENTIONAL | _INDICES
    undefined = set()
    for m in _SYMBOL.finditer(math.split("->", 1)[1]):
        symbol = m.group(1)
        word = symbol in _WORDS and m.group(2) is None  # "a", "in", "or" (a_nc is a symbol)
        gradient = symbol.startswith("g") or (symbol.startswith("d") and symbol[1:] in known | {""})
        if not (word or gradient or symbol in known):
            undefined.add(m.group(0))
    return sorted(undefined)


def problems(math: str, refusal: bool = False) -> List[str]:
    """Why `math`, as shown, is not a whole formula ([] when it is)."""
    found = [p for p in [bracket_problem(math)] if p]
    if _TRAILING.search(math):
        found.append(f"ends mid-expression: {math[-20:]!r}")
    if not refusal and undefined_symbols(math):
        found.append(f"uses symbols it does not define: {undefined_symbols(math)}")
    return found


def test_the_checks_find_a_cut_formula():
    cut = "l_n = -sum_c a_nc log p_nc, p_n = softmax(x_n)  ->  dx_n = g (p_n sum_c a_nc - a_n),"
    assert problems(cut) == ["ends mid-expression: 'n sum_c a_nc - a_n),'"]
    assert problems("y = max(x, 0  ->  dx = g [x > 0]") == ["1 bracket(s) never closed"]
    assert problems("y = x w  ->  dx = g w, dw = g x +") == ["ends mid-expression: 'dx = g w, dw = g x +'"]
    assert problems("y = x + b  ->  dx = g a_n") == ["uses symbols it does not define: ['a_n']"]
    assert problems("y = x + b  ->  dx = g a_n;  a_n = the weight of row n") == []
    assert problems("Y = A^-1  ->  dA = -Y^T G Y^T") == []  # transpose and the upstream gradient: conventional
    assert problems("y = ||A||  ->  dA = g U V^T") == ["uses symbols it does not define: ['U', 'V']"]
    assert problems("y = ||A||  ->  dA = g U V^T;  A = U diag(s) V^T its SVD") == []


def test_every_rule_shows_its_whole_math():
    cut = {rule.__name__: problems(rule_math(rule), is_refusal(rule)) for rule in rules()}
    cut = {name: found for name, found in cut.items() if found}
    assert not cut, f"{len(cut)} rules show math that is not whole: {cut}"


def test_a_rule_continued_on_a_second_line_is_shown_whole():
    class Continued(tt.Function):
        """y = w x  ->  dx = g w,
        dw = g x

        Prose after a blank line is not math."""

    assert rule_math(Continued) == "y = w x  ->  dx = g w, dw = g x"


def _cross_entropy_graph():
    logits = tt.randn(3, 4, requires_grad=True)
    return F.cross_entropy(logits, torch.tensor([0, 2, 1]))


def test_the_player_generated_code_doctor_and_ops_page_show_the_whole_math():
    rule = RULES[F.cross_entropy]
    whole = rule_math(rule)
    assert len(rule.__doc__.strip().split("\n\n")[0].splitlines()) > 1  # a formula on several lines
    assert math_line(rule) == whole  # the ops page and `python -m torchtrace ops`
    loss = _cross_entropy_graph()
    assert doctor_math(loss.grad_fn) == whole
    steps = [step for step in tt.explore(loss).steps if step.math.startswith("l_n = -sum_c")]
    assert [step.math for step in steps] == [whole]
    layer = tt.nn.Linear(4, 3)
    code = tt.trace(lambda x: F.cross_entropy(layer(x), torch.tensor([0, 2, 1])), torch.randn(3, 4)).to_code()
    comments = " ".join(line.strip()[2:] for line in code.splitlines() if line.strip().startswith("# "))
    assert " ".join(f"{rule.__name__}: {whole}".split()) in " ".join(comments.split())  # wrapped on comment lines
