"""What the doctor found: one Finding per problem, and the Diagnosis that prints them, most urgent first.

Kinds: "nonfinite" (the first NaN/Inf, forward or backward), "killed" (a rule zeroes most of the gradient
it receives: a dead ReLU, a clamp outside its range), "saturated" (tanh/sigmoid pass almost nothing),
"zero_by_construction" (a gradient that is exactly zero because of the model's structure, such as a bias
before a batch normalisation: not a training problem), "no_path" (a parameter the loss does not depend on),
"unversioned_write" (a value changed through .data or shared memory after an op made or saved it: computed
with, silently, as if an op had made it), "wrong_rule" (a user's tt.Function or torch Function subclass whose
backward disagrees with finite differences of its forward: doctor/custom_rules.py), "exploding" / "vanishing" (the
relative gradient of the weight matrices grows or shrinks by over 1e4 from the layer nearest the loss to the
farthest: doctor/depth.py).
"""
import html
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional

ORDER = ("nonfinite", "wrong_rule", "unversioned_write", "killed", "underflow", "saturated", "no_path", "exploding",
         "vanishing", "zero_by_construction")


@dataclass
class Finding:
    """One problem, said by rule, module and source line, with what made it and what to change."""

    kind: str
    phase: str  # "forward" or "backward" ("graph" for facts about paths)
    rule: str  # the rule's name (Log, Relu, ...); '' where no single rule is to blame
    math: str  # the rule's math line
    module: str  # the dotted module path ('' outside modules)
    line: str  # "file.py:123" where the op was written ('' when not known)
    message: str  # what happened, with the inputs that made it
    advice: str  # what to change
    share: Optional[float] = None  # the share of elements affected, where that is meaningful
    code: str = ""  # the source text of `line`
    node: Any = field(default=None, repr=False, compare=False)

    def __str__(self) -> str:
        where = " ".join(part for part in (f"in {self.module}" if self.module else "",
                                           f"at {self.line}" if self.line else "") if part)
        head = f"[{self.kind}, {self.phase}] {self.rule + ' ' if self.rule else ''}{where}".rstrip()
        lines = [head]
        if self.code:
            lines.append(f"    code: {self.code}")
        if self.math:
            lines.append(f"    rule: {self.math}")
        lines.append(f"    what: {self.message}")
        if self.advice:
            lines.append(f"    fix:  {self.advice}")
        return "\n".join(lines)


class Diagnosis:
    """The findings of tt.diagnose, the first non-finite value first; `print(d)` explains each one."""

    def __init__(self, findings: List[Finding], checked: Dict[str, Any], recorded: Optional[List[Any]] = None,
                 rerun: Optional[Callable[[], Any]] = None) -> None:
        self.findings = sorted(findings, key=lambda f: ORDER.index(f.kind) if f.kind in ORDER else len(ORDER))
        self.checked = checked  # what was looked at: nodes recorded / run, parameters, whether forward was watched
        self._recorded, self._rerun = recorded or [], rerun  # the forward's nodes in order; how to run fn again

    def __iter__(self) -> Iterator[Finding]:
        return iter(self.findings)

    def __len__(self) -> int:
        return len(self.findings)

    def __bool__(self) -> bool:
        return True

    def of_kind(self, kind: str) -> List[Finding]:
        if kind not in ORDER:  # (a misspelt kind would find nothing, and look like a clean bill of health)
            raise ValueError(f"of_kind: kind must be one of {', '.join(ORDER)}, not {kind!r}")
        return [f for f in self.findings if f.kind == kind]

    @property
    def alarms(self) -> List[Finding]:
        """The findings that are problems (a zero by construction is information, not an alarm)."""
        return [f for f in self.findings if f.kind != "zero_by_construction"]

    @property
    def first_nonfinite(self) -> Optional[Finding]:
        found = self.of_kind("nonfinite")
        return found[0] if found else None

    def summary(self) -> str:
        c = self.checked
        watched = f"{c.get('recorded', 0)} ops recorded, " if c.get("forward") else "forward not watched, "
        counts: Dict[str, int] = {}
        for f in self.findings:
            counts[f.kind] = counts.get(f.kind, 0) + 1
        found = ", ".join(f"{n} {kind}" for kind, n in counts.items()) or "no problems found"
        return f"tt.diagnose: {found} ({watched}{c.get('ran', 0)} backward steps, {c.get('params', 0)} parameters)"

    def __str__(self) -> str:
        return "\n".join([self.summary(), *(str(f) for f in self.findings)])

    __repr__ = __str__

    def explore(self) -> Any:
        """The player of this backward with the findings marked on their steps (badges, messages, the page's
        "diagnosis" button). The function runs once more, its backward through tt.explore; `.grad` stays as it is."""
        if self._rerun is None:
            raise RuntimeError("Diagnosis.explore() needs the function: diagnose with tt.diagnose(fn, *args), not "
                               "tt.diagnose(loss)")
        from torchtrace.doctor.player import diagnosis_in_player

        return diagnosis_in_player(self, self._rerun(), self._recorded)

    def _repr_html_(self) -> str:
        return f"<pre>{html.escape(str(self))}</pre>"
