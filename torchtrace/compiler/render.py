"""Rendering placeholder."""
from typing import List

from torchtrace.compiler.ir import Program, Statement


def render_path(program: Program, path: List[Statement], teaching: bool) -> str:
    return ""


def render_tree(program: Program) -> str:
    return ""
