"""A fuzz program: straight-line torch code over float64 inputs, printable as a pasteable test."""
import math
import re
from collections import namedtuple
from dataclasses import dataclass, field
from typing import Callable, List, Tuple

import torch
import torch.nn.functional as F

Pair = namedtuple("Pair", ["first", "second"])


class TensorList(list):
    """A list subclass, as some libraries pass to torch.cat."""


@dataclass
class Program:
    inputs: List[Tuple[str, torch.Tensor]] = field(default_factory=list)
    lines: List[str] = field(default_factory=list)
    outputs: List[str] = field(default_factory=list)
    retained: List[str] = field(default_factory=list)
    double: bool = False
    strict_nonfinite: bool = True  # a difference among NaN/inf values fails (else it is counted apart)

    def used_inputs(self) -> List[Tuple[str, torch.Tensor]]:
        body = "\n".join(self.lines + self.outputs)
        return [(n, v) for n, v in self.inputs if re.search(rf"\b{n}\b", body)]

    def function_source(self) -> str:
        names = ", ".join(n for n, _ in self.inputs)
        body = [f"    {line}" for line in self.lines]
        retained = [r for r in self.retained if f"{r}.retain_grad()" in self.lines]
        body.append(f"    return [{', '.join(self.outputs)}], [{', '.join(retained)}]")
        return f"def program({names}):\n" + "\n".join(body) + "\n"

    def function(self) -> Callable:
        scope = {"torch": torch, "F": F, "Pair": Pair, "TensorList": TensorList}
        exec(self.function_source(), scope)
        return scope["program"]

    def source(self) -> str:
        """A pasteable test: the program, its inputs, and the comparison it failed."""
        lines = ["import torch", "import torch.nn.functional as F", "", "from fuzz.runner import assert_same"]
        text = "\n".join(self.lines)
        if "Pair(" in text:
            lines += ["from fuzz.program import Pair"]
        if "TensorList(" in text:
            lines += ["from fuzz.program import TensorList"]
        lines += ["", "", self.function_source().rstrip(), "", ""]
        inputs = ", ".join(tensor_literal(v) for _, v in self.inputs)
        lines.append(f"assert_same(program, [{inputs}], double={self.double})")
        return "\n".join(lines)

    def without(self, index: int) -> "Program":
        """The program minus statement `index` (and outputs it defined)."""
        line = self.lines[index]
        defined = line.split("=")[0].strip() if re.match(r"^t\d+ = ", line) else None
        outputs = [o for o in self.outputs if o != defined]
        if not outputs:
            outputs = [self.lines_defined()[-1]] if self.lines_defined() else [self.inputs[0][0]]
        return Program(self.inputs, self.lines[:index] + self.lines[index + 1:], outputs,
                       [r for r in self.retained if r != defined], self.double, self.strict_nonfinite)

    def lines_defined(self) -> List[str]:
        return [line.split(" = ")[0] for line in self.lines if re.match(r"^t\d+ = ", line)]

    def without_unused_inputs(self) -> "Program":
        used = self.used_inputs() or self.inputs[:1]
        return Program(used, self.lines, self.outputs, self.retained, self.double, self.strict_nonfinite)


def _number(x: float) -> str:
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return repr(x)


def tensor_literal(t: torch.Tensor) -> str:
    """torch.tensor(...) source for a float64 tensor (nan / inf spelled as float('nan') / float('inf'))."""
    text = repr(_nested(t.tolist()))
    for token, spelled in (("'nan'", "float('nan')"), ("'-inf'", "-float('inf')"), ("'inf'", "float('inf')")):
        text = text.replace(token, spelled.replace("'", '"'))
    text = text.replace('"', "'")
    return f"torch.tensor({text}, dtype=torch.float64)"


def _nested(x: object) -> object:
    if isinstance(x, list):
        return [_nested(e) for e in x]
    text = _number(x)
    return text if text in ("nan", "inf", "-inf") else x
