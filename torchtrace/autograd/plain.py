"""plain_torch(): inside it, torch calls on tracers run as on plain tensors (no __torch_function__ re-entry).

Every module that calls torch on tracers without recording uses this one guard: `with plain_torch(): ...`.
modes_aside(): a region that records nothing runs without entering a mode that would only hand its calls on.
"""
from typing import Any

import torch

plain_torch = torch._C.DisableTorchFunctionSubclass
_stack_len, _stack_at = torch._C._len_torch_function_stack, torch._C._get_function_stack_at
_pop_mode, _push_mode = torch._C._pop_torch_function_stack, torch._C._push_on_torch_function_stack


class modes_aside:
    """`with modes_aside(records_nothing):` around a region that records nothing (a backward without create_graph, an
    optimizer's update): the TorchFunctionMode on top of the stack is off it meanwhile when it says that a call made
    with grad mode off runs as without it (`idle_without_grad`: tt.compile's replay mode, which then only hands the
    call on). Each torch call of the region then skips entering it, as eager's do; any other mode stays."""

    __slots__ = ("records_nothing", "mode")

    def __init__(self, records_nothing: bool = True):
        self.records_nothing = records_nothing

    def __enter__(self) -> None:
        n = _stack_len()
        self.mode = _pop_mode() if self.records_nothing and n and getattr(
            _stack_at(n - 1), "idle_without_grad", False) else None

    def __exit__(self, *exc: Any) -> None:
        if self.mode is not None:
            _push_mode(self.mode)
