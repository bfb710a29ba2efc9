"""Python numbers in tensor arithmetic, written as tensors made once at the top of the generated code.

torch wraps a Python number in a new 0-dim tensor on every call (about 1.5 µs on a CPU, more than a small op
costs), so `1 - g` takes about three times as long as `h - g`. The generated code names each such number once
(`_1 = torch.tensor(1.0)`) and writes `_1 - g`. Only where the values cannot change: a CPU float32 or float64
tensor operand and a constant of that dtype (torch casts the number to the tensor's dtype inside the kernel, and
two tensors of one dtype keep it), +, -, * or / with two positional arguments and no options.
"""
import math
import re
from typing import Callable, Dict, List, Tuple

import torch

from torchtrace.autograd.plain import plain_torch

T = torch.Tensor
ARITHMETIC = {torch.add, torch.sub, torch.mul, torch.div, torch.rsub, T.add, T.sub, T.mul, T.div, T.add_, T.sub_,
              T.mul_, T.div_, T.__add__, T.__radd__, T.__sub__, T.__rsub__, T.__mul__, T.__rmul__, T.__truediv__,
              T.__rtruediv__}
_SUFFIX = {torch.float32: "", torch.float64: "_f64"}


def constant_name(number: float, dtype: torch.dtype) -> str:
    """_1, _0_5, _neg2, _neg0 (-0.0, which is not 0.0 to a division), _1e_06; float64 ones end in _f64."""
    value = float(number)
    text = repr(value) if not value.is_integer() else ("-0" if value == 0 and math.copysign(1, value) < 0
                                                              else str(int(value)))
    return "_" + text.replace("e", "e_").replace("-", "neg").replace(".", "_").replace("+", "") + _SUFFIX[dtype]


class Constants:
    """The numbers a program's arithmetic uses, by name, and the tensors standing for them while it is recorded."""

    def __init__(self) -> None:
        self.values: Dict[str, Tuple[float, torch.dtype]] = {}
        self.tensors: Dict[str, torch.Tensor] = {}

    def hoist(self, func: Callable, args: tuple, kwargs: dict, bind: Callable[[torch.Tensor, str], None]) -> tuple:
        """`args` with a Python number replaced by its constant's tensor, where that leaves every value as it is."""
        if func not in ARITHMETIC or kwargs or len(args) != 2:
            return args
        position = 1 if isinstance(args[0], torch.Tensor) else 0
        number, tensor = args[position], args[1 - position]
        if type(number) not in (int, float) or not isinstance(tensor, torch.Tensor) or not math.isfinite(number):
            return args
        with plain_torch():
            dtype, on_cpu = tensor.dtype, tensor.device.type == "cpu"
        if dtype not in _SUFFIX or not on_cpu:
            return args
        name = constant_name(number, dtype)
        if name not in self.tensors:
            with torch._C.DisableTorchFunction():
                self.tensors[name] = torch.tensor(float(number), dtype=dtype)
            self.values[name] = (float(number), dtype)
            bind(self.tensors[name], name)
        replaced = list(args)
        replaced[position] = self.tensors[name]
        return tuple(replaced)

    def inline(self, text: str) -> str:
        """`text` with each constant's name written as its number again (the teaching form)."""
        for name, (value, _) in sorted(self.values.items(), key=lambda item: -len(item[0])):
            number = repr(value) if math.isfinite(value) else f"float('{value}')"
            text = re.sub(rf"(?<![\w.]){re.escape(name)}\b", number, text)
        return text

    def source(self) -> List[str]:
        """The module-level lines that make the constants (none when no number was hoisted)."""
        if not self.values:
            return []
        lines = ["# numbers in tensor arithmetic, as tensors made once: torch would wrap each in a new tensor per call"]
        for name, (value, dtype) in self.values.items():
            lines.append(f"{name} = torch.tensor({value!r}, dtype={dtype})")
        return lines

