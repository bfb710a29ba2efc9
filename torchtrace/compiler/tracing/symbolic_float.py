"""A float that remembers how it was computed, and refuses every way its value could steer Python.

`SymbolicFloat(2.5, Var(0))` behaves as 2.5 in arithmetic (`+ - * / ** // %`, negation, abs), and each result
carries its expression (`Var(0) * 0.5`), so the code a rule ran can be written with the call's numbers as
parameters. Everything that would let the value decide what Python does next raises `FloatSteering`: truth
(`if alpha:`), comparisons, hashing, `int()`, `round`/`floor`/`ceil`, `float()`, `repr`/`str`/`format`.

C code reads a float subclass's value directly (`math.sqrt(p)` returns a plain float): such an escape cannot
be caught here; the judge finds it by running the rule again with every number perturbed.
"""
import math
import operator
import threading
from typing import Any, Callable, Dict, List, Sequence, Tuple, Union

Expression = Union["Var", "Const", "Apply"]


class Var:
    """The i-th number of the call (a parameter `f{i}` of the generated code)."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index

    def evaluate(self, values: Sequence[float]) -> float:
        return values[self.index]

    def render(self) -> str:
        return f"f{self.index}"


class Const:
    """A number the rule itself wrote (`0.5`, `1`): the same on every call."""

    __slots__ = ("value",)

    def __init__(self, value: Union[int, float]) -> None:
        self.value = value

    def evaluate(self, values: Sequence[float]) -> Union[int, float]:
        return self.value

    def render(self) -> str:
        if isinstance(self.value, float) and not math.isfinite(self.value):  # nan, inf: no literal spells them
            return f"float({float.__repr__(self.value)!r})"
        return float.__repr__(self.value) if isinstance(self.value, float) else int.__repr__(self.value)


# name -> (python operator, infix symbol or None for a call)
BINARY: Dict[str, Tuple[Callable[[Any, Any], Any], str]] = {
    "add": (operator.add, "+"), "sub": (operator.sub, "-"), "mul": (operator.mul, "*"),
    "truediv": (operator.truediv, "/"), "floordiv": (operator.floordiv, "//"), "mod": (operator.mod, "%"),
    "pow": (operator.pow, "**"),
}
UNARY: Dict[str, Tuple[Callable[[Any], Any], str]] = {"neg": (operator.neg, "-{}"), "pos": (operator.pos, "+{}"),
                                                      "abs": (abs, "abs({})")}


class Apply:
    """`op(operands)`: one arithmetic step on numbers."""

    __slots__ = ("op", "operands")

    def __init__(self, op: str, *operands: Expression) -> None:
        self.op, self.operands = op, operands

    def evaluate(self, values: Sequence[float]) -> Any:
        args = [e.evaluate(values) for e in self.operands]
        return BINARY[self.op][0](*args) if self.op in BINARY else UNARY[self.op][0](*args)

    def render(self) -> str:
        parts = [e.render() for e in self.operands]
        if self.op in BINARY:
            return f"({parts[0]} {BINARY[self.op][1]} {parts[1]})"
        return UNARY[self.op][1].format(parts[0])


class FloatSteering(Exception):
    """A symbolic float was asked for something that lets its value decide what Python does."""

    def __init__(self, what: str, escapes: bool) -> None:
        super().__init__(what)
        self.what, self.escapes = what, escapes


class _Steered(threading.local):
    """Every refusal raised in this thread, kept even when the code that caused it caught it."""

    def __init__(self) -> None:
        self.refusals: List[FloatSteering] = []


_STEERED = _Steered()


def steered() -> List[FloatSteering]:
    """The refusals raised in this thread since the list was last emptied (`steered().clear()`)."""
    return _STEERED.refusals


def expression_of(x: Any) -> Expression:
    """The expression of a symbolic float, a constant for a plain number."""
    return x.expression if isinstance(x, SymbolicFloat) else Const(x)


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _binary(name: str) -> Tuple[Callable, Callable]:
    python_op = BINARY[name][0]

    def forward(self: "SymbolicFloat", other: Any) -> Any:
        if not _number(other):
            return NotImplemented
        return SymbolicFloat(python_op(float.__float__(self), _plain(other)), Apply(name, self.expression,
                                                                                   expression_of(other)))

    def reflected(self: "SymbolicFloat", other: Any) -> Any:
        if not _number(other):
            return NotImplemented
        return SymbolicFloat(python_op(_plain(other), float.__float__(self)), Apply(name, expression_of(other),
                                                                                   self.expression))

    return forward, reflected


def _plain(x: Union[int, float]) -> Union[int, float]:
    return float.__float__(x) if isinstance(x, SymbolicFloat) else x


def _refuse(what: str, escapes: bool = False) -> Callable:
    def refuse(self: "SymbolicFloat", *args: Any) -> Any:
        _STEERED.refusals.append(FloatSteering(what, escapes))
        raise _STEERED.refusals[-1]

    return refuse


class SymbolicFloat(float):
    """A float with an expression; see the module's docstring."""

    expression: Expression

    def __new__(cls, value: float, expression: Expression) -> "SymbolicFloat":
        self = super().__new__(cls, value)
        self.expression = expression
        return self

    def __neg__(self) -> "SymbolicFloat":
        return SymbolicFloat(-float.__float__(self), Apply("neg", self.expression))

    def __pos__(self) -> "SymbolicFloat":
        return self

    def __abs__(self) -> "SymbolicFloat":
        return SymbolicFloat(abs(float.__float__(self)), Apply("abs", self.expression))

    __add__, __radd__ = _binary("add")
    __sub__, __rsub__ = _binary("sub")
    __mul__, __rmul__ = _binary("mul")
    __truediv__, __rtruediv__ = _binary("truediv")
    __floordiv__, __rfloordiv__ = _binary("floordiv")
    __mod__, __rmod__ = _binary("mod")
    __pow__, __rpow__ = _binary("pow")

    __bool__ = _refuse("its truth (`if x:`)")
    __eq__ = _refuse("a comparison (==)")
    __ne__ = _refuse("a comparison (!=)")
    __lt__ = _refuse("a comparison (<)")
    __le__ = _refuse("a comparison (<=)")
    __gt__ = _refuse("a comparison (>)")
    __ge__ = _refuse("a comparison (>=)")
    __hash__ = _refuse("its hash (a dict or set key)")  # type: ignore[assignment]
    __int__ = _refuse("int()")
    __index__ = _refuse("an index (__index__)")
    __round__ = _refuse("round()")
    __floor__ = _refuse("math.floor()")
    __ceil__ = _refuse("math.ceil()")
    __trunc__ = _refuse("math.trunc()")
    __divmod__ = _refuse("divmod()")
    is_integer = _refuse("is_integer()")
    as_integer_ratio = _refuse("as_integer_ratio()")
    __float__ = _refuse("float()", escapes=True)
    __repr__ = _refuse("repr()", escapes=True)
    __str__ = _refuse("str()", escapes=True)
    __format__ = _refuse("format()", escapes=True)
    hex = _refuse("hex()", escapes=True)
    __reduce__ = _refuse("pickling", escapes=True)
    __reduce_ex__ = _refuse("pickling", escapes=True)
    __getnewargs__ = _refuse("pickling", escapes=True)
    __deepcopy__ = _refuse("copy.deepcopy", escapes=True)
    __copy__ = _refuse("copy.copy", escapes=True)
