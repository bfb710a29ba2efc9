"""The steps of a backward pass, as records a student can read: one per rule applied, one per ⊕ into a leaf.

A rule step says which node ran (rule, module), its math, what it saved, the gradient that reached it
(the sum of what its consumers sent: upstream), and what it sent to each input (downstream): by the
chain rule, upstream x local derivative = downstream. An accumulation step adds what reached a leaf
into its `.grad`.
"""
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

from torchtrace.inspect.explore.derivative import LocalDerivative
from torchtrace.inspect.explore.local import Check


@dataclass
class Sent:
    """The gradient a rule step sends along one edge, to one input."""

    to: str  # the id of the input's node (an op, or a leaf)
    input: str  # the input, as the student knows it: a leaf's name, or "Add (step 3)"
    gradient: str  # the gradient, summed to the input's shape (broadcasting undone)
    local: Optional[LocalDerivative] = None  # the rule's local derivative d out / d input, labelled (small steps)
    check: Optional[Check] = None  # the rule's local derivative next to a finite-difference estimate

    @property
    def local_text(self) -> str:
        """The local derivative's numbers as the page writes them ('' when unknown or too many to read)."""
        return self.local.text if self.local is not None else ""


@dataclass
class Step:
    """One step of the backward pass: a rule applied (kind "rule") or a gradient summed into a leaf ("accumulate")."""

    index: int
    kind: str
    node: str  # the id of the node that ran
    name: str  # MulBackward, or the leaf's name for an accumulation
    module: str  # dotted module path ('' outside modules)
    math: str  # the rule's math line (its docstring)
    upstream: str  # the gradient that reached the node (of each output, joined by ';')
    parts: List[Tuple[str, str]] = field(default_factory=list)  # (who sent it, gradient): summed into upstream
    saved: List[Tuple[str, str]] = field(default_factory=list)  # (what, value) the rule saved for backward
    sent: List[Sent] = field(default_factory=list)
    before: str = ""  # accumulation: the leaf's .grad before (— for none) ...
    after: str = ""  # ... and after
    gathered: bool = False  # an op with several outputs: `upstream` is one gradient per output, not a sum
    note: str = ""  # what a hook changed, if anything

    def __str__(self) -> str:
        where = f"  in {self.module}" if self.module else ""
        lines = [f"step {self.index + 1}: {self.name}{where}"]
        if self.kind == "accumulate":
            lines.append(f"  ⊕ {self.name}.grad = {self.before} + {self.upstream} = {self.after}"
                         if self.before != "—" else f"  ⊕ {self.name}.grad = {self.after}")
            if len(self.parts) > 1:
                lines.append("  reached by " + " + ".join(f"{g} (from {who})" for who, g in self.parts))
            return "\n".join(lines + ([f"  note: {self.note}"] if self.note else []))
        if self.math:
            lines.append(f"  math: {self.math}")
        for what, value in self.saved:
            lines.append(f"  saved {what}: {value}")
        parts = [f"{g} (from {who})" for who, g in self.parts]
        if self.gathered:
            lines.append(f"  upstream gradients, one per output: {self.upstream}  ({'; '.join(parts)})")
        else:
            summed = f" = {' + '.join(parts)}" if len(parts) > 1 else ""
            lines.append(f"  upstream gradient: {self.upstream}{summed}")
        if self.note:
            lines.append(f"  note: {self.note}")
        for sent in self.sent:
            local = sent.local
            if local is not None and local.kind == "elementwise" and local.text:
                lines.append(f"  -> {sent.input}: {self.upstream} x local {local.text} = {sent.gradient}")
            else:
                lines.append(f"  -> {sent.input}: sends {sent.gradient}")
                if local is not None:
                    lines.append(f"     local derivative: {local}  ({local.how})")
            if sent.check is not None and sent.check.estimate is not None:
                lines.append(f"     check: {sent.check}")
        unchecked = {sent.check.why_not for sent in self.sent if sent.check is not None and sent.check.estimate is None}
        lines += [f"  not checked by finite differences: {why}" for why in sorted(unchecked)]
        return "\n".join(lines)
