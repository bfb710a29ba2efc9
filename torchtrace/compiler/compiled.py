"""tt.compile: the user's Python runs on every call; its gradient-recording torch calls are checked and replayed."""
import threading
import warnings
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from torchtrace.argument_checks import count, input_tuples
from torchtrace.autograd.node import saved_tensor_hooks
from torchtrace.autograd.state import STATE
from torchtrace.compiler.checking import argument_names, compare_with_eager, flat_tensors
from torchtrace.compiler.ir import Program, Statement
from torchtrace.compiler.render import render_path, render_tree
from torchtrace.compiler.replay import ReplayMode, Run

MAX_BLOCKS = 64  # a trie this large stops growing: calls that leave it run eagerly from there, unrecorded
_DEPTH = threading.local()


class Compiled:
    """The callable tt.compile returns (see `compile`)."""

    def __init__(self, fn: Callable, example_inputs: Any, check_inputs: Optional[Sequence[Any]] = None,
                 check_tolerance: float = 1e-5, verify: int = 0):
        if not callable(fn):
            raise TypeError(f"tt.compile takes a function (or a module) to compile, not {fn!r}")
        verify = count("tt.compile", "verify (how many calls to check against eager)", verify, least=0)
        if not (isinstance(check_tolerance, (int, float)) and check_tolerance >= 0):
            raise ValueError(f"tt.compile: check_tolerance must be a number >= 0, not {check_tolerance!r}")
        self.fn = fn
        self.example_inputs = _as_args(example_inputs)
        self.program = Program(getattr(fn, "__name__", type(fn).__name__))
        self.verify_left, self.tolerance = verify, check_tolerance
        self.calls = self.replayed = 0  # calls, and calls whose every recorded torch call matched the program
        self.last_path: List[Statement] = []
        self.lock = threading.RLock()  # one call at a time: a call reads the trie another may grow
        self.warned = self.warned_eager = False
        for inputs in input_tuples("tt.compile", check_inputs, single_tensor_entries=True):
            self.check(*_as_args(inputs), tolerance=check_tolerance)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if getattr(_DEPTH, "value", 0) or STATE.on_record or torch._C._is_any_autocast_enabled() or \
                saved_tensor_hooks() is not None:
            return self.fn(*args, **kwargs)  # inside another compiled call, under a tool that watches every op, under
            # autocast (whose backward casts as forward did) or saved_tensors_hooks: eager (an outer run sees each call)
        if self.verify_left > 0 and not kwargs:
            self.verify_left -= 1
            self.check(*args, tolerance=self.tolerance)
        return self._run_plain(*args, **kwargs)

    def _run_plain(self, *args: Any, **kwargs: Any) -> Any:
        """One compiled call, without verify."""
        return self._run(args, kwargs)

    def _run(self, args: tuple, kwargs: dict) -> Any:
        with self.lock:
            return self._run_locked(args, kwargs)

    def _run_locked(self, args: tuple, kwargs: dict) -> Any:
        run = Run(self.program, lambda: self._names(args, kwargs))
        _DEPTH.value = 1
        try:
            with ReplayMode(run):
                out = self.fn(*args, **kwargs)
        finally:
            _DEPTH.value = 0
            run.segment = None
        self.calls += 1
        self.replayed += run.replaying and not run.eager_from
        if run.eager_from and not self.warned_eager:
            self.warned_eager = True
            warnings.warn(f"tt.compile: {self.program.title} runs eagerly from {run.eager_from}: from there on the "
                          "call is watched op by op (torch.utils.checkpoint learns the parameters its block reads "
                          "that way) or its saves go through saved_tensors_hooks entered inside it, which replay "
                          "cannot serve; the calls before it are replayed", stacklevel=4)
        if run.finish(out, lambda: len(self.program.blocks()) >= MAX_BLOCKS) is None and not run.replaying \
                and not self.warned:
            self.warned = True
            warnings.warn(f"tt.compile: {self.program.title} has taken {MAX_BLOCKS} different paths; new ones run "
                          "eagerly from where they leave the recorded program, and are not recorded", stacklevel=4)
        self.last_path, self.last_outputs = run.path, run.outputs
        return out

    def _names(self, args: tuple, kwargs: dict) -> Dict[int, str]:
        """Names for what a recorded call reads: the function's arguments, a module's parameters and submodules."""
        names: Dict[int, str] = {}
        if isinstance(self.fn, torch.nn.Module):
            for name, module in self.fn.named_modules():
                if name:
                    names[id(module)] = name
            for name, t in (*self.fn.named_buffers(), *self.fn.named_parameters()):
                names[id(t)] = name
        found: List[Tuple[str, torch.Tensor]] = []
        for name, value in zip(argument_names(self.fn, len(args)), args):
            flat_tensors(value, name, found)
        for name, value in kwargs.items():
            flat_tensors(value, name, found)
        names.update({id(t): (name, "input") for name, t in found})
        self.program.inputs = [name for name, _ in found]  # the generated forward takes them in this order
        code = getattr(self.fn, "__code__", None)
        if code is not None:  # tensors of closure cells and globals keep their Python names
            cells = zip(code.co_freevars, self.fn.__closure__ or ())
            named = [*((n, c.cell_contents) for n, c in cells if _filled(c)),
                     *((n, self.fn.__globals__.get(n)) for n in code.co_names)]
            names.update({id(v): (n, "param" if isinstance(v, torch.Tensor) else "module") for n, v in named
                          if isinstance(v, (torch.Tensor, torch.nn.Module)) and id(v) not in names})
        return names

    @property
    def code(self) -> str:
        """The generated source of the path the latest call took (the traced path, as torch.jit.trace's); before
        the first call, the function runs once on example_inputs to record it."""
        if not self.calls:
            self(*self.example_inputs)
        return render_path(self.program, self.last_path, self.last_outputs, teaching=False)

    @property
    def backward_code(self) -> str:
        """The generated backward (segment_code.py) of each compiled node the latest call's backward ran: the
        function that runs as the node's backward when no hook, retain_grad, tt.grad capture or create_graph asks
        for the step-by-step one."""
        sources = [code.source for st in self.last_path if st.generated for code in st.generated.values()]
        return "\n\n".join(dict.fromkeys(sources))

    @property
    def replay_code(self) -> str:
        """The generated replay (statement_replay.py) of each statement of the latest call's path that a matched
        call runs directly: its argument checks, its forward, its result made an output of the compiled node."""
        return "\n\n".join(st.replay.source for st in self.last_path if st.replay is not None)

    def to_code(self) -> str:
        """The teaching form: the chain rule, names from the model, and every branch the calls took."""
        if not self.calls:
            self(*self.example_inputs)
        return render_tree(self.program)

    def __repr__(self) -> str:
        paths = self.program.paths()
        return (f"tt.compile({self.program.title}): {self.calls} calls, {self.replayed} replayed to the end; "
                f"{len(paths)} path(s) of {', '.join(str(len(p)) for p in paths)} statements")

    def check(self, *args: Any, tolerance: float = 1e-5) -> None:
        """Run eager torchtrace and the compiled function on `args`; raise GradientMismatch at the first difference."""
        compare_with_eager(self, args, tolerance)


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True


def _as_args(example_inputs: Any) -> tuple:
    return tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (example_inputs,)


def compile(fn: Callable, example_inputs: Any, check_inputs: Optional[Sequence[Any]] = None,
            check_tolerance: float = 1e-5, verify: int = 0) -> Compiled:
    """fn with checked replay: your Python runs on every call; torchtrace checks the torch calls it makes against
    the recorded program and reuses the backward.

    Every call runs fn as written — every read, branch, print, random draw, optimizer update and scheduler value
    happens, once, as in eager. A torch call that records a gradient (grad mode on, an argument that requires one)
    is matched against the program recorded by earlier calls: the same callable, the same structural arguments
    (shapes, dims, dtypes, flags), each tensor from the same place (an input or parameter bound to this call's
    object, with its shape, dtype and requires_grad; or the result of an earlier statement), and the same result
    shapes. Python floats are read on every call. A matched call runs its rule's forward on plain tensors (its
    traced torch calls, where the rule traced clean), without building a graph; the matched calls of one call become
    one node of the graph, whose backward is one generated function (`.backward_code`): each clean statement's
    traced backward written out, any other a call of its rule, the gradients summed as eager sums them; it fills
    `.grad` as eager does. The first call that differs ends the match: the call goes on eagerly from there, and the
    new path joins the recorded program as a branch — nothing runs twice. In-place changes, `Function.apply` and
    calls that record several nodes run eagerly inside a matched program. Hooks, `retain_grad()` and `tt.grad`
    inputs on values made inside see each value's whole gradient, and `create_graph=True` records the gradient's
    graph through the compiled node, as in eager: these run the statements' rules step by step. A result's `grad_fn`
    is the node of the statement that made it (as in eager): its `register_prehook` / `register_hook` hooks run
    around that statement's rule. Calls inside a `torch.autocast` region of the function replay as eager statements
    (the eager engine runs each, so its backward casts as its forward did). From a call watched op by op on (the
    discovery run of `torch.utils.checkpoint`), the rest of the call runs eagerly, and so do later calls from that
    point (a warning names the line once). A call made under `torch.autocast`, inside another compiled call or while
    a tool watches every op (`tt.recording()`, `tt.detect_anomaly`) runs eagerly. Calls of one compiled function
    from several threads run one at a time.

    `example_inputs` are what `.code` and `.to_code()` record on when no call has run yet. `check_inputs`
    compares compiled and eager on each given input now; `verify=N` does so before each of the first N calls
    (it runs the function twice more: use it on functions without side effects). Both raise GradientMismatch.
    """
    return Compiled(fn, example_inputs, check_inputs, check_tolerance, verify)


def to_code(fn: Callable, *example_inputs: Any, **kwargs: Any) -> str:
    """The forward and backward of fn(*example_inputs) as Python source that needs only torch (the teaching form).
    It runs fn once, as a compiled call would."""
    compiled = Compiled(fn, example_inputs)
    state = torch.get_rng_state()
    try:
        compiled(*example_inputs, **kwargs)
    finally:
        torch.set_rng_state(state)
    return render_tree(compiled.program)
