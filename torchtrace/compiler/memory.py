"""Memory in the generated code: free each value after its last use, and compute into dead buffers in place.

A straight-line function keeps every local alive until it returns, so the generated backward would hold
every intermediate gradient at once (torch autograd frees each as soon as it is consumed). Two rewrites
over the recorded lines fix that:

  * `del a, b` right after the statement that reads a and b for the last time;
  * `g7 = g5.mul(g6)` becomes `g7 = g5.mul_(g6)` when g5 is dead after that line, owns its storage (a
    fresh result computed in this function, no view of an input, a parameter or a saved tensor, and no
    view of it is alive), and has the result's shape, dtype and a contiguous layout. The elementwise
    kernel is the same, so the values are too; only the allocation goes away.

The recorder notes, per line, what the rewrites need (names defined, storage shared with arguments,
in-place forms); this module only reads those notes and the lines' text.
"""
import re
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Set, Tuple

import torch

from torchtrace.autograd.plain import plain_torch

T = torch.Tensor
_ELEMENTWISE = ("exp erf erfc rsqrt sqrt tanh sigmoid neg abs sign reciprocal log log1p expm1 relu sin cos square "
                "nan_to_num clamp clamp_min clamp_max pow masked_fill addcmul addcdiv scatter_add index_add add sub "
                "mul div").split()
# torch callable -> its in-place method; the first argument is the buffer it writes
INPLACE_FORMS: Dict[Callable, str] = {}
for _name in _ELEMENTWISE:
    for _owner in (torch, T):
        _f = getattr(_owner, _name, None)
        if _f is not None and hasattr(T, _name + "_"):
            INPLACE_FORMS.setdefault(_f, _name + "_")
for _op, _name in (("add", "add"), ("radd", "add"), ("sub", "sub"), ("mul", "mul"), ("rmul", "mul"),
                   ("truediv", "div"), ("neg", "neg"), ("pow", "pow"), ("abs", "abs")):
    INPLACE_FORMS.setdefault(getattr(T, f"__{_op}__"), _name + "_")
COMMUTATIVE = {torch.add, T.add, T.__add__, torch.mul, T.mul, T.__mul__}
# calls whose tensor result is always new memory (never a view or one of the arguments)
ALLOCATING: Set[Callable] = set(INPLACE_FORMS) - {T.__radd__, T.__rmul__} | {
    getattr(owner, name) for owner in (torch, T) for name in (
        "matmul", "mm", "bmm", "addmm", "baddbmm", "where", "zeros_like", "ones_like", "full_like", "empty_like",
        "softmax", "log_softmax", "sum", "mean", "cumsum", "clone", "scatter", "index_select", "gather",
        "conv2d", "conv1d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "lerp", "cat",
        "stack", "rand_like", "randn_like", "le", "lt", "ge", "gt", "eq", "ne") if hasattr(owner, name)} | {
    torch.zeros, torch.ones, torch.full, torch.empty, torch.arange, T.new_zeros, T.new_ones, T.new_full,
    torch.nn.functional.linear, torch.nn.functional.gelu, torch.nn.functional.log_softmax,
    torch.nn.functional.softmax, torch.nn.functional.max_unpool1d, torch.nn.functional.max_unpool2d,
    torch.nn.functional.max_unpool3d, T.__matmul__}
_IDENTIFIER = re.compile(r"[A-Za-z_]\w*")
_ASSIGNMENT = re.compile(r"^(\w+(?:, *\w+)*,?) = ")


def _plain_storage(t: torch.Tensor) -> Optional[int]:
    """The address of t's storage (None for empty tensors, whose address means nothing)."""
    with plain_torch():
        if t.layout != torch.strided or t.numel() == 0:
            return None
        return t.untyped_storage().data_ptr()


def suits(buffer: object, out: torch.Tensor) -> bool:
    """Can `buffer` hold `out` in place: same shape, dtype and device, both contiguous, not empty."""
    if not isinstance(buffer, torch.Tensor):
        return False
    with plain_torch():
        return (buffer.layout == torch.strided and buffer.shape == out.shape and buffer.dtype == out.dtype
                and buffer.device == out.device and buffer.numel() > 0 and buffer.is_contiguous()
                and out.is_contiguous())


class Notes:
    """What one section (forward or backward) of a recorded program says about memory, line by line."""

    def __init__(self) -> None:
        self.defined: Dict[str, int] = {}  # name -> index of the line that defines it
        self.owner: Dict[str, str] = {}  # name -> the name whose storage it shares (itself if its own)
        self.fresh: Set[str] = set()  # names whose storage was allocated by their own line
        # line -> (its text, [(buffer name, () -> the in-place call's source, names of the other tensor arguments)])
        self.inplace: Dict[int, Tuple[str, List[Tuple[str, Callable[[], str], List[str]]]]] = {}

    def define(self, name: str, index: int, out: torch.Tensor, func: Callable, arguments: Sequence[torch.Tensor],
               name_of: Callable[[torch.Tensor], str]) -> None:
        """Note a tensor result: which argument's storage it shares, or whether its line allocated it."""
        self.defined[name] = index
        storage = _plain_storage(out)
        for a in arguments:
            if storage is not None and _plain_storage(a) == storage:
                shared = name_of(a)
                self.owner[name] = self.owner.get(shared, shared)
                return
        self.owner[name] = name
        with plain_torch():
            is_view = out._is_view()
        if func in ALLOCATING and storage is not None and not is_view:
            self.fresh.add(name)


def statements(lines: Sequence[str]) -> List[Tuple[int, int]]:
    """(first, last) line index of each statement: an indented line belongs to the one above it."""
    found: List[Tuple[int, int]] = []
    for i, line in enumerate(lines):
        if line.startswith((" ", "\t")) and found:
            found[-1] = (found[-1][0], i)
        else:
            found.append((i, i))
    return found


def _reads(text: str, known: Dict[str, int]) -> Set[str]:
    if text.lstrip().startswith("#"):
        return set()
    match = _ASSIGNMENT.match(text)
    body = text[match.end():] if match else text
    return {word for word in _IDENTIFIER.findall(body) if word in known}


def optimise(lines: List[str], notes: Notes, live_out: Iterable[str]) -> List[str]:
    """The lines with in-place rewrites and `del` statements (see the module docstring)."""
    live = set(live_out)
    spans = statements(lines)
    last: Dict[str, int] = {}
    for s, (first, end) in enumerate(spans):
        for name in _reads("\n".join(lines[first:end + 1]), notes.defined):
            last[name] = s
    statement_of = {first: s for s, (first, _) in enumerate(spans)}
    owner = dict(notes.owner)

    def root(name: str) -> str:
        while owner.get(name, name) != name:
            name = owner[name]
        return name

    def dead_after(s: int, name: str) -> bool:
        return name not in live and last.get(name, -1) <= s

    members: Dict[str, List[str]] = {}  # root -> the names sharing its storage, in order of definition
    for name in sorted(notes.defined, key=notes.defined.get):
        members.setdefault(root(name), []).append(name)
    out = list(lines)
    for index, (text, options) in sorted(notes.inplace.items()):
        s = statement_of.get(index)
        if s is None:
            continue
        target = text.split(" = ", 1)[0]
        for buffer, source, others in options:
            base = root(buffer)
            if base not in notes.fresh:
                continue
            group = [n for n in members.get(base, ()) if notes.defined[n] <= index and n != target]
            if not all(dead_after(s, n) for n in group) or any(root(o) == base for o in others):
                continue
            out[index] = out[index].replace(text, f"{target} = {source()}", 1)
            members[root(target)].remove(target)
            owner[target] = base
            members[base].append(target)
            break
    freed: Dict[int, List[str]] = {}  # statement -> the names it reads (or defines) for the last time
    for name in sorted(notes.defined, key=notes.defined.get):
        if name not in live:
            at = last.get(name)
            freed.setdefault(statement_of_line(spans, notes.defined[name]) if at is None else at, []).append(name)
    result: List[str] = []
    for s, (first, end) in enumerate(spans):
        result.extend(out[first:end + 1])
        if s in freed:
            result.append(f"del {', '.join(freed[s])}")
    return result


def statement_of_line(spans: Sequence[Tuple[int, int]], index: int) -> int:
    """The statement holding line `index` (spans are sorted and cover every line)."""
    low, high = 0, len(spans) - 1
    while low < high:
        middle = (low + high + 1) // 2
        if spans[middle][0] <= index:
            low = middle
        else:
            high = middle - 1
    return low
