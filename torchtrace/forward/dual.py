"""The dual-number pass: f runs once on tracers, and right after each op is recorded its result gets a tangent.

A dual number is a pair (x, ẋ); an op y = f(x) maps it to (f(x), J ẋ), where J ẋ is the op's tangent rule
(derivatives.yaml's `result:` line). torchtrace records every op anyway, so the pass is an observer of the
recording (`state.observing(on_record=...)`): it looks up the tangents of the op's tracer arguments, applies
the tangent rule of the op's gradient rule, and files the result's tangent under (node, output number).
Where an op has no tangent rule, its own backward is transposed (`transpose.py`): exact when that backward is
itself differentiable, refused clearly when it is not.
"""
import contextlib
import sys
from collections import Counter
from typing import Any, Dict, Iterator, List, Optional

import torch
from torch.overrides import TorchFunctionMode

from torchtrace.autograd.plain import plain_torch
from torchtrace.autograd.state import observing
from torchtrace.errors import UnsupportedOperationError
from torchtrace.forward.call import Call, NoTangent
from torchtrace.forward.table import tangent_rule
from torchtrace.tracer import tracer as TRACER

DUAL, TRANSPOSED = "tangent rule", "transposed backward"
recording = torch._C._EnableTorchFunction  # an op recorded while the dispatcher runs plain (a view catching up)


class DualPass:
    """The tangents of one forward pass, keyed by (node, output number), or by id for a seeded leaf."""

    def __init__(self) -> None:
        self.tangents: Dict[Any, torch.Tensor] = {}
        self.leaves: List[torch.Tensor] = []  # seeded leaves stay alive, so their ids stay theirs
        self.methods: Counter = Counter()  # (rule name, DUAL or TRANSPOSED) -> ops
        self.paused = 0
        self.strict = False  # True: an op without a tangent rule raises instead of being transposed

    def seed(self, t: torch.Tensor, tangent: torch.Tensor) -> None:
        """t's tangent: a leaf's (kept alive, so its id stays its own), or a recorded result's."""
        if t._tt_node is None:
            self.leaves.append(t)
            self.tangents[id(t)] = tangent
        else:
            self.tangents[(t._tt_node, t._tt_nr)] = tangent

    def tangent_of(self, t: Any) -> Optional[torch.Tensor]:
        if not isinstance(t, TRACER) or not t._tt_requires_grad:
            return None
        node = t._tt_node
        return self.tangents.get(id(t) if node is None else (node, t._tt_nr))

    def _dots(self, value: Any) -> Any:
        if isinstance(value, (list, tuple)):
            dots = [self.tangent_of(v) for v in value]
            return dots if any(d is not None for d in dots) else None
        return self.tangent_of(value)

    @contextlib.contextmanager
    def pause(self) -> Iterator[None]:
        """Ops recorded inside (a nested pass, a transposed backward) are not this pass's."""
        self.paused += 1
        try:
            yield
        finally:
            self.paused -= 1

    @contextlib.contextmanager
    def running(self) -> Iterator["DualPass"]:
        with observing(on_record=self.observe), _GradModeOffRefused(self):
            yield self

    def observe(self, node: Any, args: tuple, kwargs: dict, result: Any) -> None:
        """The record observer: the result's tangent from the arguments' tangents."""
        if self.paused:
            return
        dots = [self._dots(a) for a in args]
        kwdots = {k: d for k, d in ((k, self._dots(v)) for k, v in kwargs.items()) if d is not None}
        if not kwdots and all(d is None for d in dots):
            return
        call = Call(node, args, kwargs, result, dots, kwdots)
        self._store(node, result, self._tangent(call))

    def _tangent(self, call: Call) -> Any:
        rule = tangent_rule(call.rule)
        if rule is not None:
            try:
                if getattr(rule, "recorded", False):
                    with recording():
                        tangent = rule(call)
                else:
                    with plain_torch():
                        tangent = rule(call)
                self.methods[(call.rule.__name__, DUAL)] += 1
                return tangent
            except NoTangent:
                pass
        if self.strict:
            raise NoTangentError(call.rule.__name__)
        from torchtrace.forward.transpose import transposed_tangent  # imports the engine's grad

        self.methods[(call.rule.__name__, TRANSPOSED)] += 1
        with self.pause(), recording():
            return transposed_tangent(call)

    def _store(self, node: Any, result: Any, tangent: Any) -> None:
        if isinstance(result, torch.Tensor):
            self._file(node, 0, result, tangent)
            return
        tangents = tangent if isinstance(tangent, (list, tuple)) else [tangent]
        for nr, (out, dot) in enumerate(zip(result, tangents)):
            if isinstance(out, torch.Tensor):
                self._file(node, nr, out, dot)

    def _file(self, node: Any, nr: int, out: torch.Tensor, dot: Optional[torch.Tensor]) -> None:
        if dot is None or not getattr(out, "_tt_requires_grad", False):
            return
        with plain_torch():
            if dot.shape != out.shape:
                raise RuntimeError(f"forward mode: the tangent of {node.rule.__name__}'s output {nr} has shape "
                                   f"{tuple(dot.shape)}, the output {tuple(out.shape)} (a wrong tangent rule)")
            if dot.dtype != out.dtype:
                dot = dot.to(out.dtype)
            if type(dot) is not torch.Tensor:
                dot = dot.as_subclass(torch.Tensor)
        self.tangents[(node, nr)] = dot

    def used(self) -> Dict[str, str]:
        """{rule name: how its tangents were found} for every op this pass saw with a tangent."""
        return {name: how for name, how in sorted(self.methods)}


class _GradModeOffRefused(TorchFunctionMode):
    """The pass follows f through the recording, which grad mode off stops: an op of f run under torch.no_grad() on
    a value that carries a tangent would drop it silently, where torch's forward mode goes on. Refused, by name.
    Grad mode turned off by torchtrace itself (a user Function's forward runs so, as torch runs it; its outputs get
    the Function's own tangents) is not f's."""

    def __init__(self, dual: DualPass) -> None:
        super().__init__()
        self.dual, self.ours = dual, 0  # grad mode turned off by torchtrace's own code, not yet back on

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
        kwargs = kwargs or {}
        if func is torch._C._set_grad_enabled and sys._getframe(1).f_globals.get("__name__", "").startswith(
                "torchtrace."):
            self.ours = max(0, self.ours + (-1 if args[0] else 1))
        result = func(*args, **kwargs)
        if torch.is_grad_enabled() or self.ours or self.dual.paused or not _has_floating(result):
            return result
        if any(self.dual._dots(a) is not None for a in (*args, *kwargs.values())):
            name = getattr(func, "__name__", str(func))
            raise UnsupportedOperationError(
                f"forward mode: f runs {name} with grad mode off (torch.no_grad(), tt.no_grad()) on a value that "
                "carries a tangent; torchtrace's forward mode follows f through what it records, which stops there "
                "(torch.func.jvp goes on). Run it outside the no_grad block, or .detach() the value if its tangent "
                "should be 0.")
        return result


def _has_floating(result: Any) -> bool:
    if isinstance(result, torch.Tensor):
        return result.is_floating_point()
    return isinstance(result, (list, tuple)) and any(map(_has_floating, result))


class NoTangentError(NotImplementedError):
    """method="dual" met an op that has no tangent rule."""

    def __init__(self, name: str):
        super().__init__(f"forward mode: {name} has no tangent rule, and method='dual' does not transpose its "
                         "backward; use method='auto' (the default), or give the op a tangent rule "
                         "(a `jvp(ctx, *tangents)` on your Function).")
