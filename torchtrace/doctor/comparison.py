"""tt.diff: two backward passes of the same model aligned rule by rule; where they first part, and by how much.

    r = tt.diff(fn_a, fn_b, *args)   # e.g. a student's rule vs the reference, fp32 vs bf16, eager vs tt.compile
    r.first                          # the first rule (in backward order) whose gradient differs beyond `rtol`
    r.top(5)                         # the largest differences
    print(r)

Steps are aligned by (rule, module) with difflib's sequence matching, so an extra cast or a renamed rule
does not shift everything after it; a replaced rule is paired with the one in its place. Where two paired steps
send other numbers or shapes of gradients (the graphs part: `y ** 2` against `y * y`), the steps from there on are
not compared one to one, the leaf gradients are. When the two passes have no steps in common (a compiled replay
runs as one node), the leaf gradients are compared.
The error of a pair is max |a - b| / max(max |a|, max |b|, atol): relative to the larger of the two.
"""
import difflib
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from torchtrace.argument_checks import count
from torchtrace.autograd.plain import plain_torch
from torchtrace.doctor.recording import Pass, record_pass


@dataclass
class Divergence:
    """Where the two passes differ: a rule step (or a leaf gradient) and the relative error there."""

    rule: str  # the rule of pass a ('' for a leaf)
    module: str
    line: str
    error: float
    incoming_error: float  # the error of the gradient that reached the step (0: it arrived equal, within rtol)
    index: int  # the step's place in pass a's backward order (-1 for a leaf)
    rule_b: str = ""  # the rule of pass b, where it is a different one
    leaf: str = ""  # the leaf's name, for a leaf gradient
    phase: str = "backward"  # "forward" for an op whose value differs
    line_b: str = ""  # the line of pass b, where it is another
    only: str = ""  # "a" or "b": an op of the forward that only that pass ran (the other has nothing in its place)

    def __str__(self) -> str:
        what = f"leaf {self.leaf}" if self.leaf else self.rule + (f" (b: {self.rule_b})" if self.rule_b else "")
        if self.only:
            what = f"{self.rule}, an op only {self.only} ran,"
        line = self.line + (f" (b: {self.line_b})" if self.line_b else "")
        where = " ".join(p for p in (f"in {self.module}" if self.module else "", f"at {line}" if line else "") if p)
        arrived = "" if self.leaf or self.phase == "forward" else (
            f", the gradient it received already differed by {self.incoming_error:.2e}"
                                        if self.incoming_error > 0 else ", the gradient it received was equal")
        return f"{what} {where}".rstrip() + (f": error {self.error:.2e}{arrived}" if not self.only else "")


def relative_error(a: Optional[torch.Tensor], b: Optional[torch.Tensor], atol: float) -> float:
    """max |a - b| / max(max |a|, max |b|, atol); inf when only one is None or the shapes differ."""
    if a is None or b is None:
        return 0.0 if a is None and b is None else float("inf")
    if a.shape != b.shape:
        return float("inf")
    with plain_torch():
        a64, b64 = a.double(), b.double()
        if a64.numel() == 0:
            return 0.0
        both_nan = torch.isnan(a64) & torch.isnan(b64)
        if not bool(torch.isfinite(a64[~both_nan]).all()) or not bool(torch.isfinite(b64[~both_nan]).all()):
            same = bool(((a64 == b64) | both_nan).all())
            return 0.0 if same else float("inf")
        a64, b64 = a64[~both_nan], b64[~both_nan]
        if a64.numel() == 0:
            return 0.0
        scale = max(float(a64.abs().max()), float(b64.abs().max()), atol)
        return float((a64 - b64).abs().max()) / scale


def _errors(xs: List[Optional[torch.Tensor]], ys: List[Optional[torch.Tensor]], atol: float) -> float:
    if len(xs) != len(ys):
        return float("inf")
    return max((relative_error(x, y, atol) for x, y in zip(xs, ys)), default=0.0)


def _aligned(a: List[Any], b: List[Any]) -> List[Tuple[int, int]]:
    """Index pairs of steps (or forward ops) of a and b that correspond: equal (rule, module) runs, and replaced runs
    of equal length."""
    matcher = difflib.SequenceMatcher(a=[s.key for s in a], b=[s.key for s in b], autojunk=False)
    pairs = []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal" or (tag == "replace" and i2 - i1 == j2 - j1):
            pairs += list(zip(range(i1, i2), range(j1, j2)))
    return pairs


def _signature(step: Any) -> Tuple[Any, ...]:
    """The shapes of what a step sent, None where it sent nothing: two steps with other signatures are not one step
    of two versions of a graph (x.tanh() ** 2 against x.tanh() * x.tanh(): Pow sends one gradient, Mul two)."""
    return tuple(None if g is None else tuple(g.shape) for g in step.sent)


def _passes_through(step: Any) -> bool:
    """One gradient in, one of its shape out (a cast, a view, a scaling): an extra one does not change the graph."""
    sent = [g for g in step.sent if g is not None]
    return len(step.incoming) == 1 and len(sent) == 1 and _signature(step) == (
        None if step.incoming[0] is None else tuple(step.incoming[0].shape),)


def _parting(a: List[Any], b: List[Any]) -> Optional[Tuple[int, Optional[int], Optional[int]]]:
    """Where the two backward graphs part: (place in a's order, the step of a, the step of b; None for the side
    that has no step there): paired steps of other signatures, or a step only one pass ran that does more than pass
    its gradient through."""
    matcher = difflib.SequenceMatcher(a=[s.key for s in a], b=[s.key for s in b], autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal" or (tag == "replace" and i2 - i1 == j2 - j1):
            for i, j in zip(range(i1, i2), range(j1, j2)):
                if _signature(a[i]) != _signature(b[j]):
                    return i, i, j
            continue
        for i in range(i1, i2):
            if not _passes_through(a[i]):
                return i, i, None
        for j in range(j1, j2):
            if not _passes_through(b[j]):
                return i1, None, j
    return None


def _only_in_one(a: List[Any], b: List[Any]) -> List[Tuple[int, Any]]:
    """The forward ops that only one pass ran (an op inserted or removed, not replaced by one in its place), each with
    its place in pass a's order (where it would have been, for an op of b)."""
    matcher = difflib.SequenceMatcher(a=[s.key for s in a], b=[s.key for s in b], autojunk=False)
    found = []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal" or (tag == "replace" and i2 - i1 == j2 - j1):
            continue
        if i2 > i1 and j2 == j1 or tag == "replace" and i2 - i1 > j2 - j1:
            op = a[i1 + (j2 - j1)]
            found.append((i1, Divergence(op.rule, op.module, op.line, float("inf"), 0.0, i1, phase="forward",
                                         only="a")))
        else:
            op = b[j1 + (i2 - i1)]
            found.append((i1, Divergence(op.rule, op.module, op.line, float("inf"), 0.0, i1, phase="forward",
                                         only="b")))
    return found


def _leaf_pairs(a: Pass, b: Pass) -> List[Tuple[Any, Any]]:
    """Each leaf of pass a with its leaf in pass b: the same object (a parameter both passes used), else the leaf
    of the same name (two copies of one model, e.g. copy.deepcopy: different objects, the same paths)."""
    by_name: Dict[str, List[Any]] = {}
    for key in b.leaf_order:
        by_name.setdefault(b.leaf_names.get(key, ""), []).append(key)
    pairs = []
    for key in a.leaf_order:
        same_name = by_name.get(a.leaf_names.get(key, ""), [])
        pairs.append((key, key if key in b.leaf_grads else same_name[0] if len(same_name) == 1 else key))
    return pairs


def _sent(step: Any) -> str:
    sent = [g for g in step.sent if g is not None]
    return f"{len(sent)} gradient{'s' if len(sent) != 1 else ''} ({', '.join(str(tuple(g.shape)) for g in sent)})"


class DiffReport:
    """Two passes aligned: `first` (the first divergence beyond rtol, or None), `top(k)`, `divergences`."""

    def __init__(self, a: Pass, b: Pass, rtol: float, atol: float, titles: Tuple[str, str],
                 rerun: Optional[Callable[[bool], Tuple[Pass, Pass]]] = None) -> None:
        self.a, self.b, self.rtol, self.atol, self.titles = a, b, rtol, atol, titles
        self._rerun = rerun
        self.pairs = _aligned(a.steps, b.steps)
        self.divergences: List[Divergence] = []
        self.parted = _parting(a.steps, b.steps)
        for i, j in self.pairs:
            if self.parted is not None and i >= self.parted[0]:
                break  # (from there on a step's gradient is one share of a sum the other graph splits otherwise)
            sa, sb = a.steps[i], b.steps[j]
            error = _errors(sa.sent, sb.sent, atol)
            if error > rtol:
                incoming = _errors(sa.incoming, sb.incoming, atol)
                self.divergences.append(Divergence(sa.rule, sa.module, sa.line, error,
                                                   incoming if incoming > rtol else 0.0, i,
                                                   sb.rule if sb.rule != sa.rule else "",
                                                   line_b=sb.line if sb.line != sa.line else ""))
        self.forward_pairs = _aligned(a.forward, b.forward)
        self.forward_divergences = []
        for i, j in self.forward_pairs:
            fa, fb = a.forward[i], b.forward[j]
            error = relative_error(fa.value, fb.value, atol)
            if error > rtol:
                self.forward_divergences.append(Divergence(fa.rule, fa.module, fa.line, error, 0.0, i,
                                                           fb.rule if fb.rule != fa.rule else "", phase="forward",
                                                           line_b=fb.line if fb.line != fa.line else ""))
        placed = [(d.index, k, d) for k, d in enumerate(self.forward_divergences)]
        placed += [(i, -1, d) for i, d in _only_in_one(a.forward, b.forward)]  # (an op only one ran comes first)
        self.forward_divergences = [d for _, _, d in sorted(placed, key=lambda item: item[:2])]
        self.leaf_pairs = _leaf_pairs(a, b)
        self.leaf_divergences = [
            Divergence("", "", "", error, 0.0, -1, leaf=self._leaf_name(key, key_b)) for key, key_b, error in
            ((key, key_b, relative_error(a.leaf_grads.get(key), b.leaf_grads.get(key_b), atol))
             for key, key_b in self.leaf_pairs)
            if error > rtol]

    def _leaf_name(self, key: Any, key_b: Any) -> str:
        """The fuller of the two passes' names (a pass that called a submodule directly knows less of the model)."""
        return max((self.a.leaf_names.get(key, ""), self.b.leaf_names.get(key_b, "")), key=lambda n: n.count("."))

    @property
    def first(self) -> Optional[Divergence]:
        """The first rule, in backward order, whose gradient differs; a leaf when no aligned rule does."""
        if self.divergences:
            return self.divergences[0]
        return self.leaf_divergences[0] if self.leaf_divergences else None

    @property
    def first_forward(self) -> Optional[Divergence]:
        """The first op of the forward whose value differs (None when both forwards computed the same values): a
        change of the model shows here; a wrong backward rule does not."""
        return self.forward_divergences[0] if self.forward_divergences else None

    @property
    def same(self) -> bool:
        return self.first is None

    def top(self, k: int = 5) -> List[Divergence]:
        """The k largest divergences (rule steps and leaves), largest first."""
        k = count("top", "k (how many divergences to list)", k, least=0)
        return sorted(self.divergences + self.leaf_divergences, key=lambda d: -d.error)[:k]

    def __str__(self) -> str:
        a, b = self.titles
        head = (f"tt.diff {a} vs {b}: loss {self.a.loss:.6g} vs {self.b.loss:.6g}; {len(self.pairs)} of "
                f"{len(self.a.steps)}/{len(self.b.steps)} rule steps aligned, {len(self.divergences)} differ and "
                f"{len(self.leaf_divergences)} of {len(self.a.leaf_order)} leaf gradients differ beyond {self.rtol:g}")
        forward = self.first_forward
        forward_line = (f"forward: the values first differ at {forward}" if forward is not None and not forward.only
                        else f"forward: the graphs differ first at {forward}" if forward is not None else
                        "forward: the same values (what differs is the backward)")
        if self.parted is not None:
            place, i, j = self.parted
            sa, sb = (self.a.steps[i] if i is not None else None), (self.b.steps[j] if j is not None else None)
            where = (f"{sa.rule} (b: {sb.rule}), which sends {_sent(sa)} where b's sends {_sent(sb)}" if sa and sb
                     else f"{(sa or sb).rule}, a step only {'a' if sa else 'b'} ran, which sends {_sent(sa or sb)}")
            forward_line += (f"\nstructure: the backward graphs part at {where}: the {len(self.a.steps) - place} steps "
                             "of a from there on are not compared one to one (a gradient there can be a share of a sum "
                             "the other graph splits otherwise); the leaf gradients are")
        if self.first is None:
            return f"{head}\n{forward_line}\nno divergence"
        follows = " (the forwards already differ, above: the gradients of the ops after it differ with them)"
        lines = [head, forward_line, f"first: {self.first}" + (follows if forward is not None else "")]
        if self.first.line and self.first.index >= 0:
            step = self.a.steps[self.first.index]
            lines += [f"    {label}: {text}" for label, text in (("code", step.code), ("rule", step.math)) if text]
        lines.append("largest:")
        lines += [f"  {d}" for d in self.top(5)]
        return "\n".join(lines)

    __repr__ = __str__

    def rerun(self, explore: bool = False) -> Tuple[Pass, Pass]:
        """Both passes once more (with `explore`, each backward through tt.explore)."""
        if self._rerun is None:
            raise RuntimeError("this report cannot run its functions again: make it with tt.diff(fn_a, fn_b, *args)")
        return self._rerun(explore)

    def explore(self, first: Optional[int] = None) -> Any:
        """Both passes in the player, side by side, stepping through the aligned rules; every divergent step is
        marked, and the page opens at the first one (or at pair `first`). The functions run once more."""
        from torchtrace.doctor.player import diff_in_player

        return diff_in_player(self, first)


def _random_state() -> Tuple[torch.Tensor, List[torch.Tensor]]:
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else []
    return torch.get_rng_state(), cuda


def _set_random_state(state: Tuple[torch.Tensor, List[torch.Tensor]]) -> None:
    torch.set_rng_state(state[0])
    if state[1]:
        torch.cuda.set_rng_state_all(state[1])


def diff(fn_a: Any, fn_b: Any, *args: Any, rtol: float = 1e-4, atol: float = 1e-12,
         titles: Tuple[str, str] = ("a", "b"), **kwargs: Any) -> DiffReport:
    """Run fn_a(*args) and fn_b(*args) and the backward of each scalar result; align their rule steps and report
    where their gradients first differ by more than rtol (relative to the larger of the two). Both start from the
    same state of torch's random generators (a dropout draws the same mask in both)."""
    def rerun(explore: bool) -> Tuple[Pass, Pass]:
        state = _random_state()  # both passes draw the same random numbers (dropout): only the code differs
        a = record_pass(fn_a, args, kwargs, explore)
        _set_random_state(state)
        return a, record_pass(fn_b, args, kwargs, explore)

    return DiffReport(*rerun(False), rtol, atol, titles, rerun)
