"""Symbolic tracing of a rule: run its forward and backward once on plain copies of a call's arguments, record every
torch call they make, and decide by mechanism whether that record is straight-line code valid for every call of the
same layout (clean), or why not (the rule branches on a number, reads a tensor's values, or lets a number escape).

`trace_rule` judges one call, `straight_line` writes a clean trace as Python, and `report` judges every registered
rule on the calls PyTorch's OpInfo samples make (`python -m torchtrace ops --compile`).
"""
from torchtrace.compiler.tracing.judge import Verdict, trace_rule
from torchtrace.compiler.tracing.straight_line import StraightLine, straight_line

__all__ = ["Verdict", "trace_rule", "StraightLine", "straight_line"]
