"""tt.detect_anomaly(): NaN/Inf in forward or backward raises, naming the op, the module and the source line; and
torch's own anomaly mode (set_detect_anomaly) followed in a tracer's backward, as torch's engine does.

The message has two lines: what happened (which op's forward or backward produced NaN/Inf), and where the op
was created (module, file:line and the code).
"""
import os
import traceback
from typing import Any, Optional

import torch

from torchtrace.autograd.node import Contributions, Node
from torchtrace.autograd.plain import plain_torch
from torchtrace.autograd.state import observing
from torchtrace.inspect.scope import module_names, module_scope, path_name
from torchtrace.naming import callable_name
from torchtrace.nested import flatten

_LIBRARIES = (os.path.dirname(os.path.dirname(__file__)), os.path.dirname(torch.__file__))


class AnomalyError(RuntimeError):
    """A NaN or Inf appeared in a forward result or a gradient while tt.detect_anomaly() was active."""


def _user_line() -> str:
    """file:line: code of the innermost frame outside torchtrace and torch."""
    for frame in reversed(traceback.extract_stack()):
        if not frame.filename.startswith(_LIBRARIES):
            return f"{frame.filename}:{frame.lineno}: {frame.line}"
    return "<unknown>"


def _bad(values: Any) -> bool:
    leaves, _ = flatten(values if isinstance(values, (list, tuple)) else [values])
    with plain_torch():
        return any(isinstance(t, torch.Tensor) and t.is_floating_point() and not torch.isfinite(t).all()
                   for t in leaves)


class detect_anomaly:
    """Context manager: each recorded op remembers where it was created, and NaN/Inf raises AnomalyError.

    `model` (optional) gives modules their dotted names in the messages. The source line is captured
    only in this mode, so ordinary runs stay fast.
    """

    def __init__(self, model: Optional[torch.nn.Module] = None):
        self._names = module_names(model)

    def __enter__(self) -> "detect_anomaly":
        self._observing, self._scope = observing(self._forward, self._backward), module_scope()  # fresh each entry
        self._scope.__enter__()
        self._observing.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._observing.__exit__(*exc)
        self._scope.__exit__(*exc)

    def _forward(self, node: Node, args: tuple, kwargs: dict, result: Any) -> None:
        node.note(created_at=_user_line())
        if _bad(result):
            raise AnomalyError(f"forward of {_op(node)} produced NaN or Inf\n{self._where(node)}")

    def _backward(self, node: Node, grads: Any, result: Any) -> None:
        if _bad(list(result)):
            incoming = "finite" if not _bad(list(grads)) else "not finite"
            raise AnomalyError(f"backward of {_op(node)} produced a NaN or Inf gradient (its incoming gradient was "
                               f"{incoming})\n{self._where(node)}")

    def _where(self, node: Node) -> str:
        """`  where: in model.fc, created at file.py:12: y = torch.log(x)` (the message's second line)."""
        module = path_name(node.module_path, self._names) or "no module"
        created = (node.notes or {}).get("created_at", "<before detect_anomaly>")
        return f"  where: in {module}, created at {created}"


def refuse_nan(node: Node, grads: Any, result: Any) -> None:
    """Under torch's anomaly mode, set_detect_anomaly(True) (with its check_nan), a rule that returns NaN raises,
    as torch's engine does, naming it and the output. Each gradient is checked as its edge receives it, summed over
    the dimensions forward broadcast (torch checks after that sum: inf and -inf summed there are NaN), and each of a
    compiled node's contributions on its own (each is an eager node's)."""
    if not torch.is_anomaly_check_nan_enabled():
        return
    shapes = {edge[0]: edge[3] for edge in node.edges}
    with plain_torch():
        for i, g in enumerate(result if type(result) is tuple else (result,)):
            for each in g if type(g) is Contributions else (g,):
                if isinstance(each, torch.Tensor) and each.is_floating_point() and _received_nan(each, shapes.get(i)):
                    raise RuntimeError(f"Function '{node.name}' returned nan values in its {i}th output. "
                                       "(tt.detect_anomaly() names the module and the source line that made the op)")


def _received_nan(g: torch.Tensor, shape: Optional[torch.Size]) -> bool:
    if shape is not None and g.shape != shape:
        try:
            g = g.sum_to_size(shape)
        except RuntimeError:  # a shape no sum gives: the engine names that mistake
            pass
    return bool(g.isnan().any())


def _op(node: Node) -> str:
    return f"{node.name} ({callable_name(node.func) if node.func else node.rule.__name__ + '.apply'})"
