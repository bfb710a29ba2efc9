"""Parameters with no path to the loss, and why: where the forward cut the graph, or a module that never ran.

While tt.diagnose runs the forward, a torch function mode (`CutWatcher`) sees every torch call before
the tracer does and notes the calls that leave the graph on purpose or by accident: `.detach()`,
`.data`, `.item()` / `.tolist()` / `.numpy()`, a cast to an integer dtype, and any op on a tensor that needs a
gradient while grad mode is off (`torch.no_grad()`); a tensor's `.data` / `.numpy()` is also copied, to tell a
write through it later (unversioned.py). Each cut remembers its source line and the leaves
its input depended on, so a parameter that the loss does not reach can be told the line that cut it. A
`torch.no_grad()` cut inside a library's code is told at the user's line (the innermost frame outside torch,
torchtrace and installed packages) with the module whose call is on that line. The same mode hands every
call's result to `FirstUnrecorded`, which finds a NaN made by an op that records nothing.
"""
import contextlib
from typing import Any, Dict, Iterator, List, Optional, Set, Tuple

import torch
from torch.overrides import TorchFunctionMode

from torchtrace.autograd.engine import topological_order
from torchtrace.autograd.node import AccumulateGrad
from torchtrace.autograd.state import STATE
from torchtrace.doctor.unrecorded import FirstUnrecorded
from torchtrace.doctor.unversioned import UnversionedWrites
from torchtrace.doctor.where import line_of, module_called_from, user_frame, user_line

T = torch.Tensor
_LEAVING = {T.detach: ".detach()", T.detach_: ".detach_()", T.item: ".item()", T.tolist: ".tolist()",
            T.numpy: ".numpy()"}
_CASTS = {T.to, T.type, T.long, T.int, T.short, T.char, T.byte, T.bool}


def _needs_grad(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and bool(getattr(t, "_tt_requires_grad", False))


def leaves_of(t: torch.Tensor) -> List[torch.Tensor]:
    """The leaves that need a gradient and that `t` was computed from (t itself if it is one)."""
    node = getattr(t, "_tt_node", None)
    if node is None:
        return [t]
    return [n.variable for n in topological_order([node]) if isinstance(n, AccumulateGrad)]


class Cut:
    """A call that left the graph: how (".detach()", "integer cast", "torch.no_grad()") and where; `module`: for
    a cut inside a library's code, the module whose call is on the user's line."""

    def __init__(self, how: str, line: str, code: str, module: Optional[torch.nn.Module] = None) -> None:
        self.how, self.line, self.code, self.module = how, line, code, module


def _is_data(func: Any) -> bool:
    return getattr(func, "__self__", None) is T.data  # `t.data` arrives as a new method-wrapper each time


def _no_grad_cut() -> Cut:
    frame = user_frame(installed=True)
    module = module_called_from(frame, STATE.module_stack) if user_frame() is not frame else None
    return Cut("torch.no_grad()", *line_of(frame), module)


class CutWatcher(TorchFunctionMode):
    """Notes every call that takes a tensor needing a gradient out of the graph, by the leaves it depended on."""

    def __init__(self) -> None:
        super().__init__()
        self.cut_leaves: Dict[int, Cut] = {}  # id(leaf) -> the first cut its values went through
        self.unversioned = UnversionedWrites()  # the graph's tensors as they were at their .data / .numpy()
        self._seen_nodes: Set[int] = set()
        self._paused = False
        self.unrecorded = FirstUnrecorded()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Calls made inside the block are not watched (the doctor's own backward, inside a watched script)."""
        self._paused = True
        try:
            yield
        finally:
            self._paused = False

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
        kwargs = kwargs or {}
        written = None if self._paused else self.unrecorded.before(func, args)
        if not self._paused and args and _needs_grad(args[0]) and (_is_data(func) or func is T.numpy):
            self.unversioned.before_access(".numpy()" if func is T.numpy else ".data", args[0])
        result = func(*args, **kwargs)
        if self._paused:
            return result
        self.unrecorded.see(func, args, kwargs, result, written)
        source = args[0] if args else None
        if _needs_grad(source):
            how = ".data" if _is_data(func) else _LEAVING.get(func)
            if how is None and func in _CASTS and isinstance(result, torch.Tensor) and not result.is_floating_point():
                how = f"a cast to {result.dtype}"
            if how is not None:
                self._note(how, [source])
                return result
        if not torch.is_grad_enabled() and isinstance(result, torch.Tensor):
            self._note("torch.no_grad()", [a for a in (*args, *kwargs.values()) if _needs_grad(a)])
        return result

    def _note(self, how: str, sources: List[torch.Tensor]) -> None:
        cut = None
        for source in sources:
            node = getattr(source, "_tt_node", None)
            key = id(node) if node is not None else id(source)
            if key in self._seen_nodes:
                continue
            self._seen_nodes.add(key)
            cut = cut or (_no_grad_cut() if how == "torch.no_grad()" else Cut(how, *user_line()))
            for leaf in leaves_of(source):
                self.cut_leaves.setdefault(id(leaf), cut)


UNWATCHED = ("nothing it computed reaches the loss: its module did not run, or its result left the graph (.detach(), "
             ".data, .item(), torch.no_grad()) or was not used; the loss alone cannot tell which")


class ModulesRan:
    """Which modules ran a forward (a global forward pre-hook while tt.diagnose watches)."""

    def __init__(self) -> None:
        self.ran: Dict[int, torch.nn.Module] = {}

    def __call__(self, module: torch.nn.Module, args: tuple) -> None:
        self.ran[id(module)] = module

    def roots(self) -> List[torch.nn.Module]:
        """The modules that ran and are not inside another module that ran: the models."""
        inner = {id(m) for module in self.ran.values() for m in module.modules() if m is not module}
        return [m for key, m in self.ran.items() if key not in inner]


def no_path_reasons(params: List[Tuple[str, torch.Tensor]], reached: Set[int], cuts: Dict[int, Cut],
                    module_of: Dict[int, Tuple[str, torch.nn.Module]], ran: Optional[Dict[int, torch.nn.Module]],
                    names: Optional[Dict[int, str]] = None) -> List[Tuple[str, str, str, str, List[str]]]:
    """(why, line, code, module, parameter names) for every group of parameters the loss does not reach (one group
    per reason and line; the module is the innermost one holding the whole group). `ran` None: the forward was not
    watched, so which modules ran is not known (a module with no op in the graph may have run with its result cut)."""
    groups: Dict[Tuple[str, str, str, str], List[str]] = {}  # (why, line, code, module or '') -> parameter names
    modules: Dict[Tuple[str, str, str, str], List[str]] = {}
    for name, p in params:
        if id(p) in reached:
            continue
        cut = cuts.get(id(p))
        module_name, module = module_of.get(id(p), ("", None))
        if cut is not None:
            around = "" if cut.module is None else \
                f" around the call of {(names or {}).get(id(cut.module), type(cut.module).__name__)}"
            key = (f"its value reaches the loss only through {cut.how}{around}, which passes no gradient", cut.line,
                   cut.code, "")
        elif ran is None:
            key = (UNWATCHED, "", "", module_name)
        elif module is not None and id(module) not in ran:
            key = (f"the module {module_name or type(module).__name__} never ran in the forward (an unused "
                   "submodule)", "", "", module_name)
        else:
            key = ("its module ran, but nothing it computed reached the loss (a result that was not used)", "", "",
                   module_name)
        groups.setdefault(key, []).append(name)
        if module_name not in modules.setdefault(key, []):
            modules[key].append(module_name)
    return [(*key[:3], _common(modules[key]), names) for key, names in groups.items()]


def _common(modules: List[str]) -> str:
    """The innermost module that holds all of `modules` ('' when it is the whole model)."""
    parts = [m.split(".") for m in modules if m]
    if not parts:
        return ""
    shared = []
    for level in zip(*parts):
        if len(set(level)) > 1:
            break
        shared.append(level[0])
    return ".".join(shared)
