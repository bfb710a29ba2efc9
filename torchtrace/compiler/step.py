"""A training step compiled whole: `loss.backward()` and `opt.step()` inside the traced function.

The engine's own torch calls are not the program's: while a backward pass runs inside the traced call, nothing
it does is recorded as a user call (`inside_engine`). Instead, when the engine runs the first node of the pass,
the recorded rules' backward is written into the forward code from that node (recorder.run_rules), as
`record_backward` writes the backward of a compiled function: the step's code holds its backward. When the
pass is over, the gradient every leaf received is copied into a `.grad` of its own (eager's AccumulateGrad gives
each leaf a fresh tensor) and the leaf's new `.grad` object gets that name, so the optimizer's update, which reads
it through a plain alias, is recorded on it like any other value.

What the code leaves in `.grad` is not a torch call: `GradEffects` notes each leaf's `.grad` before the call and
after it (None, a gradient the code made, or untouched) so the replay can set the same; a later call whose
leaves hold or lack a `.grad` otherwise than the traced call did gets a trace of its own. Refused (the step then
runs eagerly, with a warning naming why): accumulating into a `.grad` that is already there (no zero_grad, or
zero_grad(set_to_none=False), before backward), `tt.grad` or `create_graph=True` inside, a pass from more than
one root or from a gradient other than ones, hooks on the leaves, and a leaf the code cannot name.
"""
import sys
from typing import Any, Dict, Iterable, List, Optional, Tuple

import torch

from torchtrace.autograd import engine
from torchtrace.autograd.node import AccumulateGrad, Node
from torchtrace.compiler.recorder import Program, RuleCalls, plain, run_rules, storage_key

_ENGINE = engine.__file__
_GRAD = engine.grad.__code__


def inside_engine() -> bool:
    """Is a backward pass of torchtrace's engine on this thread's stack?"""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_filename == _ENGINE:
            return True
        frame = frame.f_back
    return False


def grad_of(leaf: torch.Tensor) -> Optional[torch.Tensor]:
    return leaf._tt_grad if hasattr(type(leaf), "_tt_grad") else leaf.grad


def _set_grad(leaf: torch.Tensor, value: Optional[torch.Tensor]) -> None:
    if hasattr(type(leaf), "_tt_grad"):
        leaf._tt_grad = value
    else:
        leaf.grad = value


class InStepBackward:
    """Records the backward passes a traced call runs, and what they leave in `.grad`."""

    def __init__(self, program: Program, leaves: Iterable[torch.Tensor]):
        self.program = program
        self.refused: Optional[str] = None
        self.ran = False  # a backward pass ran inside the call
        self.entry = {id(t): (t, grad_of(t)) for t in leaves}  # every leaf the call could give a gradient to
        for leaf, grad in self.entry.values():
            if grad is not None:
                program.note_entry_grad(leaf, grad)
        self.walked: set = set()  # ids of the nodes the recorded walk of the running pass visited
        self.pending: List[Tuple[AccumulateGrad, str, bool]] = []  # leaves of the running pass, gradient, fresh?
        self.given: Dict[int, torch.Tensor] = {}  # id(leaf) -> leaf: leaves a pass gave a .grad
        if inside_engine():  # traced from a hook during a backward pass: every call would look like the engine's
            self.refuse("it is traced while a backward pass runs (from a hook or a gradient rule)")

    def engine_call(self) -> bool:
        """Is this torch call the engine's (not recorded)? The first call after a pass settles the pass."""
        if inside_engine():
            return True
        if self.walked:
            self.settle()
        return False

    def refuse(self, reason: str) -> None:
        if self.refused is None:
            self.refused = reason

    def on_backward(self, node: Any, grads: List[Any], _: Any) -> None:
        """The engine ran `node`'s rule: on the first node of a pass, write down the whole pass."""
        self.ran = True
        if self.refused is not None:
            return
        if self.pending or self.walked:
            if id(node) not in self.walked and not isinstance(node, AccumulateGrad):
                self.refuse("it runs a backward pass from more than one output at once")
            return
        reason = _unsupported(node, grads, self.program)
        if reason is not None:
            self.refuse(reason)
            return
        program = self.program
        buffers: Dict[Tuple[int, int], Any] = {}
        (nr, value), = [(nr, program.node_values[(id(node), nr)]) for nr, g in enumerate(grads) if g is not None]
        program.emit(f"# {program.tensor_name(value)}.backward(): the gradient rules, from the loss back to the leaves")
        with torch.no_grad(), RuleCalls(program):
            buffers[(id(node), nr)] = torch.ones_like(value)
        try:
            visited = run_rules(program, [node], buffers)
        except Exception as error:  # a hook or retain_grad inside, or a call the code cannot write
            self.refuse(f"its backward pass cannot be written as code ({error})")
            return
        self.walked = {id(n) for n in visited}
        if any(key not in program.nodes for key, _ in buffers if not any(key == id(e.node) for n in visited
                                                                          for e in n.edges
                                                                          if isinstance(e.node, AccumulateGrad))):
            self.refuse("its backward pass goes on into a graph made outside the function (an input computed "
                        "from tensors that require grad): detach the input, or compile the whole computation")
        leaves = {id(e.node): e.node for n in visited for e in n.edges if isinstance(e.node, AccumulateGrad)}
        for key, acc in leaves.items():
            g = buffers.get((key, 0))
            leaf = acc.variable
            if g is None:
                continue
            if id(leaf) not in self.entry:
                self.refuse("it gives a gradient to a tensor that is not a parameter of a module or optimizer it "
                            "names, nor a tensor in its closure or globals")
            elif getattr(leaf, "_tt_hooks", None) or getattr(leaf, "_tt_post_hooks", None):
                self.refuse("a leaf it gives a gradient to has hooks")
            elif grad_of(leaf) is not None and type(grad_of(leaf)) is not torch.Tensor:
                self.refuse("its backward adds into a .grad that is a tracer")
            else:
                self.pending.append((acc, program.tensor_name(g), grad_of(leaf) is None))

    def settle(self) -> None:
        """The pass is over: a leaf's new .grad is a copy of its gradient, under a name of its own; a .grad that was
        there has the gradient added in place (as the engine does)."""
        program = self.program
        for acc, name, fresh in self.pending:
            leaf = acc.variable
            current = grad_of(leaf)
            if current is None:
                self.refuse("a leaf's .grad is None after its backward pass")
                continue
            if not fresh:
                program.emit(f"{program.tensor_name(current)}.add_({name})  # {program.tensor_name(leaf)}.grad += ...")
                continue
            target = program._define(current)
            program.emit(f"{target} = {name}.clone(memory_format=torch.contiguous_format)  "
                         f"# {program.tensor_name(leaf)}.grad")
            self.given[id(leaf)] = leaf
        self.pending, self.walked = [], set()

    def effects(self) -> "GradEffects":
        """What the call did to each leaf's .grad, as the replay must repeat it."""
        self.settle()
        program = self.program
        setting: List[Tuple[torch.Tensor, Optional[str]]] = []
        for leaf, before in self.entry.values():
            after = grad_of(leaf)
            if after is before or (after is not None and before is not None
                                   and storage_key(after) == storage_key(before)):
                continue  # the same .grad (changed in place by the code, if at all)
            if after is None:
                setting.append((leaf, None))
                continue
            name = program.names.get(id(after))
            if name is None or id(leaf) not in self.given or program.is_external(after):
                self.refuse("it sets a .grad to a tensor the generated code does not compute")
                continue
            setting.append((leaf, name))
        read = [(leaf, storage_key(grad_of(leaf))) for leaf in program.grad_inputs]
        return GradEffects([leaf for leaf, _ in self.entry.values()],
                           [before is None for _, before in self.entry.values()], setting, read)


def _unsupported(node: Any, grads: List[Any], program: Program) -> Optional[str]:
    """Why the pass starting at `node` cannot be written as code (None if it can)."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code is _GRAD:
            return "it calls tt.grad inside (the gradients it returns are not written into the code)"
        frame = frame.f_back
    if torch.is_grad_enabled():
        return "it runs backward(create_graph=True) inside"
    if id(node) not in program.nodes or not isinstance(node, Node):
        return "its backward pass starts at a tensor the traced code did not compute"
    given = [g for g in grads if g is not None]
    if len(given) != 1 or not bool(torch.all(plain(given[0]) == 1)):
        return "its backward pass starts from a gradient other than ones (loss.backward() of a scalar loss is)"
    return None


class GradEffects:
    """The `.grad` of each leaf a compiled step touches: checked before the replay, set after it."""

    def __init__(self, leaves: List[torch.Tensor], was_none: List[bool],
                 setting: List[Tuple[torch.Tensor, Optional[str]]], read: List[Tuple[torch.Tensor, Any]]):
        self.leaves, self.was_none, self.setting, self.read = leaves, was_none, setting, read

    def holds(self) -> bool:
        """Does every leaf hold or lack a .grad as it did when the call was traced, and is each .grad the code reads
        (kept by identity among the captured tensors) still in the same memory?"""
        return ([grad_of(t) is None for t in self.leaves] == self.was_none
                and all(storage_key(grad_of(leaf)) == where for leaf, where in self.read))

    def outputs(self) -> List[str]:
        return [name for _, name in self.setting if name is not None]

    def apply(self, values: Iterable[torch.Tensor]) -> None:
        """Set each leaf's .grad as the traced call left it: None, or the code's gradient (`values`, in order)."""
        found = iter(values)
        for leaf, name in self.setting:
            _set_grad(leaf, None if name is None else plain(next(found)))


def leaves_of(modules: Iterable[torch.nn.Module], optimizers: Iterable[torch.optim.Optimizer],
              tensors: Iterable[Any]) -> List[torch.Tensor]:
    """Every tensor that requires grad among the modules' parameters, the optimizers' and the given tensors."""
    found: Dict[int, torch.Tensor] = {}
    candidates: List[Any] = [p for m in modules for p in m.parameters()]
    candidates += [p for o in optimizers for g in o.param_groups for p in g["params"]]
    candidates += list(tensors)
    for t in candidates:
        if isinstance(t, torch.Tensor) and t.requires_grad and getattr(t, "_tt_node", None) is None:
            found.setdefault(id(t), t)
    return list(found.values())
