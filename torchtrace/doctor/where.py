"""Where an op was written (the user's source line: the innermost frame outside torchtrace and torch) and the math
of the rule that recorded it."""
import linecache
import os
import sys
from typing import Any, Tuple

import torch

from torchtrace.rule_math import rule_math

_LIBRARIES = (os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,
              os.path.dirname(os.path.abspath(torch.__file__)) + os.sep)
_SKIPPED_FILES = ("contextlib.py", "<frozen")


def user_line() -> Tuple[str, str]:
    """("file.py:123", "the code on that line") of the innermost frame that is the user's code."""
    frame = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith(_LIBRARIES) and not any(skip in filename for skip in _SKIPPED_FILES):
            code = linecache.getline(filename, frame.f_lineno).strip()
            return f"{os.path.basename(filename)}:{frame.f_lineno}", code
        frame = frame.f_back
    return "<unknown>", ""


def math_line(node: Any) -> str:
    """The rule's math: the first paragraph of its docstring, on one line."""
    return rule_math(node.rule)
