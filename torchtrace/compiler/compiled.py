"""tt.compile: trace once, generate plain torch code, replay it behind one node of the eager graph."""
import builtins
import threading
import warnings
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from torchtrace.autograd.dispatch import run_rule
from torchtrace.autograd.function import Function
from torchtrace.autograd.node import leaf_accumulator
from torchtrace.autograd.plain import plain_torch
from torchtrace.autograd.state import observing
from torchtrace.compiler import effects, guards
from torchtrace.compiler.checking import compare_with_eager
from torchtrace.compiler.recorder import Program, UserCalls, _rng_state, _set_rng_state, plain, record_backward
from torchtrace.compiler.render import render
from torchtrace.compiler.step import InStepBackward, leaves_of
from torchtrace.compiler.world import World
from torchtrace.errors import UnsupportedOperationError
from torchtrace.tracer import tracer

MAX_SPECIALISATIONS = 8


class Trace:
    """One recorded run of fn: the program, its source, and what it was specialised on."""

    def __init__(self, fn: Callable, args: tuple, kwargs: dict):
        self.fn = fn
        flat: List[Tuple[str, torch.Tensor]] = []
        names = guards.argument_names(fn, len(args))
        for name, value in zip(names, args):
            guards.flatten(value, name, flat)
        for name, value in kwargs.items():
            guards.flatten(value, guards.identifier(name), flat)
        input_names = guards.unique([n for n, _ in flat])
        world = self.world = World()  # what fn reads besides its arguments, noted before anything runs
        world.add_global_hooks()
        world.follow(fn)
        for value in (*args, *kwargs.values()):  # a module or function passed in: its state is read like a global's
            world.follow(value)
        known = {i: name for i, name in world.python_names.items()}  # a closure tensor keeps its Python name
        module_names = {}
        if isinstance(fn, torch.nn.Module):
            known = {id(t): name for name, t in (*fn.named_buffers(), *fn.named_parameters())}
            module_names = {id(m): name for name, m in fn.named_modules() if name}
        program = self.program = Program(known)
        program.optimizer_state = {id(v): (p, key) for o in world.optimizers for p, state in o.state.items()
                                   for key, v in state.items() if isinstance(v, torch.Tensor)}
        for name, (_, t) in zip(input_names, flat):
            program.add_input(name, t)
        self.inputs = [t for _, t in flat]
        self.input_names = input_names
        stack: List[torch.nn.Module] = []
        thread = threading.get_ident()

        def enter(module: torch.nn.Module, _: Any) -> None:
            if threading.get_ident() != thread:  # module hooks are process-wide: another thread's model
                return
            if not stack and id(module) not in module_names:  # a model the function calls: learn its names
                module_names.update({id(m): name for name, m in module.named_modules() if name})
                _learn_parameter_names(program, module, world.python_names.get(id(module)))
            world.add_module(module, module_names.get(id(module)) or type(module).__name__)
            stack.append(module)

        def leave(module: torch.nn.Module, _: Any, output: Any) -> None:
            if stack and stack[-1] is module and threading.get_ident() == thread:
                stack.pop()
                name = module_names.get(id(module))
                if name and isinstance(output, torch.Tensor):
                    program.module_outputs.append((name, output))

        def path() -> str:
            if not stack:
                return ""
            inner = stack[-1]
            name = module_names.get(id(inner))
            return f"{name}: {type(inner).__name__}" if name else type(inner).__name__

        mode = UserCalls(program, path)
        before = effects.Snapshot(self.inputs)
        in_step = mode.backward = InStepBackward(program, leaves_of(world.modules, world.optimizers,
                                                                     [*world.tensors, *self.inputs]))
        hooks = (torch.nn.modules.module.register_module_forward_pre_hook(enter),
                 torch.nn.modules.module.register_module_forward_hook(leave))
        effects.TRACING.depth += 1
        try:
            with observing(on_record=mode.on_node, on_backward=in_step.on_backward), mode:
                self.output = fn(*args, **kwargs)
        finally:
            effects.TRACING.depth -= 1
            for hook in hooks:
                hook.remove()
        self.modules = world.modules
        grad_effects = in_step.effects()  # zero_grad() alone changes .grad too
        self.grad_effects = grad_effects if in_step.ran or grad_effects.setting else None
        changed = before.changed_by_call(world, program.draws)
        self.not_replayable = in_step.refused or program.refusal or changed
        self.first_step = in_step.ran and in_step.refused is None  # a step's first call fills the optimizer state
        if self.not_replayable is not None:
            return
        outputs = guards.output_tensors(self.output)
        self.output_spec = guards.rebuild_spec(self.output)
        self.output_names = [program.tensor_name(t) for t in outputs]
        if self.grad_effects is not None:  # the gradients the code leaves in .grad are outputs too
            self.output_names += self.grad_effects.outputs()
        if in_step.ran:  # a whole training step: its backward ran inside, the loss needs none
            self.needs_grad = [False] * len(outputs)
            self.grad_names = record_backward(program, [])
        else:
            self.needs_grad = [bool(getattr(t, "_tt_requires_grad", False)) for t in outputs]
            self.grad_names = record_backward(program, outputs)
        self.captured = list(program.captured)
        self.source = render(self, teaching=False)

    def gradient_names(self) -> List[Optional[str]]:
        """The backward's result: one gradient (or None) per input, then per captured tensor."""
        program, seen = self.program, set()
        found = []
        for t in [*self.inputs, *(t for _, t in self.captured)]:
            node = getattr(t, "_tt_node", None)
            if node is not None:
                key = (id(node), t._tt_nr)
            elif getattr(t, "_tt_requires_grad", False) or (type(t) is torch.Tensor and t.requires_grad):
                key = (id(leaf_accumulator(t)), 0)
            else:
                key = None
            g = program.buffers.get(key) if key is not None and key not in seen else None
            seen.add(key)
            found.append(program.names.get(id(g)) if g is not None else None)
        return found


def _learn_parameter_names(program: Program, module: torch.nn.Module, python_name: Optional[str]) -> None:
    """Label the module's parameters and buffers by their dotted names, prefixed where another module took one."""
    prefix = python_name or type(module).__name__
    taken = set(program.known_params.values())
    for name, t in (*module.named_buffers(), *module.named_parameters()):
        if id(t) not in program.known_params:
            program.known_params[id(t)] = name if name not in taken else f"{prefix}.{name}"


class Specialisation:
    """Generated code for one kind of call, behind one tt.Function node."""

    def __init__(self, trace: Trace, key: Any):
        self.key, self.source = key, trace.source
        namespace: Dict[str, Any] = {}
        code = builtins.compile(trace.source, f"<tt.compile {getattr(trace.fn, '__name__', 'module')}>", "exec")
        exec(code, namespace)
        self.guard_failed = namespace["GuardFailed"]
        self.captured_named = list(trace.captured)
        self.captured = [t for _, t in trace.captured]
        with plain_torch():  # a parameter can change dtype (model.double()) or requires_grad (freezing) in place
            self.captured_keys = [(t.shape, t.dtype, t.requires_grad) for t in self.captured]
        self.modules = trace.modules
        self.unchanged = trace.world.check()
        self.world = trace.world
        self.grad_effects = trace.grad_effects
        changed = self.captured if self.grad_effects is not None else [t for t in self.captured if not t.requires_grad]
        self.buffers = changed if trace.program.guards else []  # what the code changes in place before a guard
        self.n_outputs = len(trace.output_names) - len(trace.grad_effects.outputs() if trace.grad_effects else ())
        self.output_spec = trace.output_spec
        self.no_grad_outputs = [i for i, needs in enumerate(trace.needs_grad) if not needs]
        self.random_with_guards = trace.program.random and bool(trace.program.guards)
        self.guards = trace.program.guards
        self.function = _node_function(namespace["forward"], namespace["backward"], len(trace.inputs),
                                       [label for label, _ in trace.captured], trace.fn, self.guard_failed)

    def valid(self) -> bool:
        try:
            if not self.unchanged():  # modules, closure cells, globals (world.py)
                return False
            if self.grad_effects is not None and not self.grad_effects.holds():  # .grad present as when traced
                return False
        except Exception:  # an attribute the check reads is gone
            return False
        with plain_torch():  # metadata of a tracer read without dispatch
            return [(t.shape, t.dtype, t.requires_grad) for t in self.captured] == self.captured_keys

    def run(self, tensors: List[torch.Tensor]) -> Any:
        kept = [(t, plain(t).clone()) for t in self.buffers]  # a guard failing half-way must undo buffer updates
        try:
            out = list(run_rule(tracer, self.function, None, (*tensors, *self.captured), {}))
        except self.guard_failed:
            with torch.no_grad():
                for t, data in kept:
                    plain(t).copy_(data)
            raise
        for i in self.no_grad_outputs:
            out[i] = out[i].detach()
        if self.grad_effects is not None:
            self.grad_effects.apply(out[self.n_outputs:])
        return guards.rebuild(self.output_spec, iter(out[:self.n_outputs]))


def _node_function(fwd: Callable, bwd: Callable, n_inputs: int, labels: List[str], fn: Callable,
                   guard_failed: type) -> type:
    """A tt.Function whose forward and backward are the generated code: the one node of a compiled call."""
    def forward(ctx: Any, *tensors: torch.Tensor) -> tuple:
        params = dict(zip(labels, tensors[n_inputs:]))  # tracers: torch runs them as plain tensors here (no dispatch)
        outputs, saved = fwd(*tensors[:n_inputs], params)
        ctx.params = params
        ctx.save_for_backward(*saved)
        return outputs

    def backward(ctx: Any, *grads: torch.Tensor) -> tuple:
        if torch.is_grad_enabled():
            raise UnsupportedOperationError(
                "tt.compile: backward(create_graph=True) through a compiled call is not supported (its backward is "
                "generated code on plain tensors) — call the function uncompiled for higher derivatives")
        try:
            return bwd(ctx.params, ctx.saved_tensors, *grads)
        except guard_failed as failed:
            raise RuntimeError(f"tt.compile: the generated backward was specialised on a value a rule read ({failed}), "
                               "and it differs now; call the function uncompiled for this input") from None

    name = f"Compiled_{getattr(fn, '__name__', type(fn).__name__)}"
    doc = f"y = {getattr(fn, '__name__', type(fn).__name__)}(x) -> dy/dx by the generated backward code"
    return type(name, (Function,), {"__doc__": doc, "forward": staticmethod(forward),
                                    "backward": staticmethod(backward)})


class Compiled:
    """The callable tt.compile returns: replays generated code, re-tracing when a guard fails."""

    def __init__(self, fn: Callable, example_inputs: Any, check_inputs: Optional[Sequence[Any]] = None,
                 check_tolerance: float = 1e-5, verify: int = 0):
        self.fn = fn
        self.specialisations: Dict[Any, List[Specialisation]] = {}
        self.warned: set = set()
        self.traces = 0
        self.eager_reason: Optional[str] = None  # set when fn does something replayed code would not repeat
        self.step_traced = False  # the last trace was a training step's call that filled optimizer state
        self.verify_left, self.tolerance, self.verifying = verify, check_tolerance, False
        args = _as_args(example_inputs)
        self._trace(args, {}, self._key(args, {}))
        for inputs in check_inputs or ():
            self.check(*_as_args(inputs), tolerance=check_tolerance)

    def latest_captured(self) -> List[Tuple[str, torch.Tensor]]:
        return self.latest.captured_named

    @property
    def code(self) -> str:
        """The source of the most recent specialisation."""
        if self.eager_reason is not None:
            raise RuntimeError(f"{self.eager_reason}: there is no generated code")
        return self.latest.source

    def _key(self, args: tuple, kwargs: dict) -> Any:
        flat: List[Tuple[str, torch.Tensor]] = []
        with plain_torch():
            if not kwargs and all(isinstance(a, torch.Tensor) for a in args):  # the common case, made quick
                return (tuple(map(guards.tensor_key, args)), torch.is_grad_enabled()), [("", a) for a in args]
            return (guards.flatten(args, "", flat), guards.flatten(kwargs, "", flat), torch.is_grad_enabled()), flat

    def _trace(self, args: tuple, kwargs: dict, keyed: Any) -> Any:
        key, _ = keyed
        trace = Trace(self.fn, args, kwargs)  # this call's result is the eager one; later calls run the code
        self.traces += 1
        if trace.not_replayable is not None and trace.first_step and not self.step_traced:
            self.step_traced = True  # a step's first call fills the optimizer's state: the next call traces again
            return trace.output
        if trace.not_replayable is not None:
            self.eager_reason = (f"tt.compile: {self._name()} runs eagerly: {trace.not_replayable}, which replayed "
                                 "code would not repeat (compile the part without it)")
            warnings.warn(self.eager_reason, stacklevel=4)
            return trace.output
        self.step_traced = False
        self.latest = Specialisation(trace, key)
        self.specialisations.setdefault(key, []).insert(0, self.latest)
        return trace.output

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.eager_reason is not None or effects.TRACING.depth:  # inside another trace: its recording sees the ops
            return self.fn(*args, **kwargs)
        if self.verify_left > 0 and not self.verifying and not kwargs:
            self.verify_left -= 1
            self.verifying = True
            try:
                self.check(*args, tolerance=self.tolerance)
            finally:
                self.verifying = False
        keyed = self._key(args, kwargs)
        key, flat = keyed
        tensors = [t for _, t in flat]
        reasons = []
        found = self.specialisations.get(key, ())
        for spec in found:
            if not spec.valid():
                continue
            state = _rng_state() if spec.random_with_guards else None
            try:
                return spec.run(tensors)
            except spec.guard_failed as failed:
                reasons.append(str(failed))
                if state is not None:
                    _set_rng_state(state)
        if len(found) >= MAX_SPECIALISATIONS:
            self._warn_once(("eager", key), f"tt.compile: {MAX_SPECIALISATIONS} specialisations of "
                            f"{self._name()} for these inputs already; running it eagerly ({'; '.join(reasons)})")
            return self.fn(*args, **kwargs)
        for reason in reasons[:1]:
            self._warn_once(reason.split(" read ")[0], f"tt.compile: re-tracing {self._name()}: {reason} when the "
                            "code was made, not now; the new value gets code of its own")
        return self._trace(args, kwargs, keyed)

    def _warn_once(self, what: Any, message: str) -> None:
        if what not in self.warned:
            self.warned.add(what)
            warnings.warn(message, stacklevel=3)

    def _name(self) -> str:
        return getattr(self.fn, "__name__", type(self.fn).__name__)

    def __repr__(self) -> str:
        lines = [f"tt.compile({self._name()}): {sum(map(len, self.specialisations.values()))} specialisation(s)"]
        for key, specs in self.specialisations.items():
            lines.append(f"  inputs {_describe_key(key)}")
            for spec in specs:
                checks = [f"{g.expression} == {g.value!r} ({g.where.strip() or 'in a rule'})" for g in spec.guards]
                modes = sorted({"train" if m.training else "eval" for m in spec.modules})
                flags = [f"{len(spec.modules)} modules in {'/'.join(modes)} mode"] if spec.modules else []
                lines.append("    specialised on " + ("; ".join(checks + flags) or "shapes only"))
        return "\n".join(lines)

    def check(self, *args: Any, tolerance: float = 1e-5) -> None:
        """Run eager torchtrace and the compiled code on `args`; raise GradientMismatch at the first difference."""
        compare_with_eager(self, args, tolerance)


def _describe_key(key: Any) -> str:
    parts = []

    def walk(k: Any) -> None:
        if isinstance(k, tuple) and len(k) == 6 and isinstance(k[0], type) and issubclass(k[0], torch.Tensor):
            parts.append(f"{str(k[2]).replace('torch.', '')}{list(k[1])} on {k[3]}"
                         f"{' requires_grad' if k[4] else ''}")
        elif isinstance(k, tuple) and len(k) == 2 and k[0] in (list, tuple, dict):
            for item in k[1]:
                walk(item[1] if k[0] is dict else item)
        elif isinstance(k, tuple) and len(k) == 2 and isinstance(k[0], type):
            parts.append(repr(k[1]))
        elif isinstance(k, tuple):
            for item in k:
                walk(item)

    walk(key[:-1])
    return ", ".join(parts) + ("" if key[-1] else " (no_grad)")


def _as_args(example_inputs: Any) -> tuple:
    return tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (example_inputs,)


def compile(fn: Callable, example_inputs: Any, check_inputs: Optional[Sequence[Any]] = None,
            check_tolerance: float = 1e-5, verify: int = 0) -> Compiled:
    """Trace fn on example_inputs; return a callable that replays the generated code.

    The generated code runs only while everything it was made from still holds, checked before it runs:
      * the arguments: tensors' type, shape, dtype, device, requires_grad and contiguity; every other argument
        by value (numbers, strings, tuples, lists, dicts, sets and dataclasses of them; -0.0 is not 0.0);
        other objects are refused; grad mode;
      * every value Python read from tensor data, whatever the API (`if x.sum() > 0`, `.item()`, `torch.equal`,
        `1.0 in x`, `f"{x:.1f}"`): any torch call whose result is not a tensor and is not metadata is a
        guard, and a value that cannot be compared (`np.asarray(x)`) is refused, naming the line; a result
        whose shape follows from values (`x[mask]`, `torch.where(c)`) has its shape checked;
      * every module the call ran and every module, function, closure cell and global the function's code
        (and the code of the functions and module methods it names) can reach: parameters, buffers,
        submodules and hooks by identity, other attributes (`training`, `Dropout.p`, `self.scale`) by value;
        torch's global module hooks and default dtype.
      * an optimizer the function reaches: hyperparameters by value, parameters and state tensors by identity;
      * for a training step (`loss.backward()` inside): whether each leaf holds a `.grad`.
    A check that fails re-traces (up to 8 specialisations per kind of input, then eager with a warning). A call
    that changes Python state, draws Python/NumPy random numbers, sets torch's generator, changes its inputs'
    requires_grad or hooks, reads a value it changed in place (Adam's step count) or calls tt.grad is run eagerly
    from then on, with a warning naming why. A training step (zero_grad, forward, loss.backward(), opt.step())
    compiles whole: the code holds the backward and the update, and `.grad` is set as eager leaves it; its first
    call (which fills the optimizer's state) runs eagerly and the second is traced again.
    Not guarded: I/O (print, files), a mutable object reached only through an attribute of something checked by
    identity (a list inside a plain object), and torch's and torchtrace's own internals. `check_inputs` compares
    compiled and eager on more inputs now; `verify=N` compares them on the first N calls and raises
    GradientMismatch on a difference.
    """
    return Compiled(fn, example_inputs, check_inputs, check_tolerance, verify)


def to_code(fn: Callable, *example_inputs: Any, **kwargs: Any) -> str:
    """The forward and backward of fn(*example_inputs) as Python source that needs only torch."""
    state = _rng_state()
    try:
        trace = Trace(fn, example_inputs, kwargs)
        if trace.not_replayable is not None:
            raise UnsupportedOperationError(f"to_code: {trace.not_replayable}, which straight-line code cannot show")
        return render(trace, teaching=True)
    finally:
        _set_rng_state(state)


