"""Where an op was written (the user's source line: the innermost frame outside torchtrace and torch) and the math
of the rule that recorded it."""
import functools
import linecache
import os
import sys
from types import FrameType
from typing import Any, Optional, Sequence, Tuple

import torch

from torchtrace.rule_math import rule_math

_LIBRARIES = (os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,
              os.path.dirname(os.path.abspath(torch.__file__)) + os.sep)
_SKIPPED_FILES = ("contextlib.py", "<frozen")
_INSTALLED = (f"{os.sep}site-packages{os.sep}", f"{os.sep}dist-packages{os.sep}")


@functools.lru_cache(maxsize=4096)
def is_installed(filename: str) -> bool:
    """Is `filename` part of an installed distribution: under site-packages / dist-packages, or in a package whose
    directory on sys.path also holds its `.dist-info` (pip install --target, an installed wheel elsewhere)?"""
    if any(part in filename for part in _INSTALLED):
        return True
    path = os.path.abspath(filename)
    for entry in sys.path:
        root = os.path.abspath(entry or os.curdir) + os.sep
        if path.startswith(root) and os.sep in path[len(root):]:
            top = path[len(root):].split(os.sep)[0].lower().replace("-", "_")
            try:
                names = os.listdir(root)
            except OSError:
                continue
            if any(n.endswith(".dist-info") and n.lower().replace("-", "_").startswith(top + "_") for n in names):
                return True
    return False


def _is_user(filename: str, installed: bool) -> bool:
    return not filename.startswith(_LIBRARIES) and not any(skip in filename for skip in _SKIPPED_FILES) and \
        not (installed and is_installed(filename))


def user_frame(installed: bool = False) -> Optional[FrameType]:
    """The innermost frame that is the user's code: outside torchtrace and torch (and, with `installed`, outside
    every installed package: a library's module is then reported at the user's call of it)."""
    frame = sys._getframe(1)
    while frame is not None and not _is_user(frame.f_code.co_filename, installed):
        frame = frame.f_back
    return frame


def line_of(frame: Optional[FrameType]) -> Tuple[str, str]:
    """("file.py:123", "the code on that line") of a frame."""
    if frame is None:
        return "<unknown>", ""
    code = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
    return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}", code


def user_line() -> Tuple[str, str]:
    """("file.py:123", "the code on that line") of the innermost frame that is the user's code."""
    return line_of(user_frame())


def module_called_from(frame: Optional[FrameType], stack: Sequence[Any]) -> Optional[Any]:
    """The module whose call is on `frame`'s line: the module stack's entry just below the modules whose calls
    enclose `frame` (counted by torch's module-call frames from `frame` outwards)."""
    enclosing = 0
    outer = frame.f_back if frame is not None else None
    while outer is not None:
        enclosing += outer.f_code.co_name == "_call_impl" and outer.f_code.co_filename.startswith(_LIBRARIES)
        outer = outer.f_back
    return stack[enclosing] if frame is not None and len(stack) > enclosing else None


def math_line(node: Any) -> str:
    """The rule's math: the first paragraph of its docstring, on one line."""
    return rule_math(node.rule)
