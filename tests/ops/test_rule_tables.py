"""Every table rule's `uses` says exactly what its gradient formulas read: not less (a formula would read a
tensor that was never saved) and not more (a tensor saved for nothing makes an in-place change of it an error
where torch allows it)."""
import pytest
import torch

import torchtrace  # noqa: F401  (registers every rule)
from torchtrace.autograd.function import RULES, Context
from torchtrace.ops.rule_tables import NAMES, Meta, unary

TABLE_RULES = sorted({rule for rule in RULES.values() if "formulas" in rule.__dict__}, key=lambda r: r.__name__)
# rules whose formulas need other inputs than 1-D float64 tensors, or options without a usable default:
# name -> (make the inputs, the arguments after them)
SAMPLES = {"Threshold": (None, (1.5, 0.0)), "Cumsum": (None, (0,))}


class Touched(Exception):
    """A formula used a value its rule does not declare."""


class Poison:
    """Stands in for a value a formula must not read: any use of it raises Touched."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        raise Touched(f"passed to {func}")

    def __getattr__(self, name):
        raise Touched(f".{name}")


def _touch(self, *args):
    raise Touched("an operator")


for _op in ("add radd sub rsub mul rmul truediv rtruediv pow rpow neg pos abs lt le gt ge eq ne and rand or ror "
            "invert bool float int index getitem len iter").split():
    setattr(Poison, f"__{_op}__", _touch)


def _sample(rule: type):
    """The values the formulas receive: inputs, the result (run through the rule's forward) and the options."""
    n = len(rule.formulas)
    inputs, extra = SAMPLES.get(rule.__name__, (None, ()))
    inputs = inputs() if inputs else [torch.linspace(1.1, 1.9, 4, dtype=torch.float64) * (k + 1) for k in range(n)]
    ctx = Context(rule, needs_mask=(1 << n) - 1)
    out = rule.forward(ctx, *inputs, *extra)
    options = getattr(ctx, "options", {})
    args, kwargs = ((), options) if isinstance(options, dict) else options
    return dict(zip(NAMES[n], [*inputs, out])), (args, kwargs), torch.ones_like(out)


def _call(rule: type, i: int, values: dict, options: tuple, g: torch.Tensor, allowed: set):
    """Formula i with every value it may not read poisoned (an input declared only as `x.meta` comes as its Meta)."""
    def seen(name: str):
        if name in allowed:
            return values[name]
        if f"{name}.meta" in allowed:
            return Meta(values[name].shape, values[name].dtype, values[name].device)
        return Poison()

    args, kwargs = options
    return rule.formulas[i](g, *[seen(name) for name in NAMES[len(rule.formulas)]], *args, **kwargs)


def test_there_are_table_rules_to_check():
    assert len(TABLE_RULES) > 80


@pytest.mark.parametrize("rule", TABLE_RULES, ids=lambda r: r.__name__)
def test_each_formula_reads_nothing_it_does_not_declare(rule):
    values, options, g = _sample(rule)
    for i, used in enumerate(rule.uses):
        result = _call(rule, i, values, options, g, allowed=set(used))
        assert isinstance(result, torch.Tensor) and result.shape == values[NAMES[len(rule.uses)][i]].shape


@pytest.mark.parametrize("rule", TABLE_RULES, ids=lambda r: r.__name__)
def test_each_formula_reads_everything_it_declares(rule):
    values, options, g = _sample(rule)
    for i, used in enumerate(rule.uses):
        for name in used:
            with pytest.raises(Touched):
                _call(rule, i, values, options, g, allowed=set(used) - {name})


def test_a_declaration_names_only_the_formulas_parameters():
    with pytest.raises(ValueError, match="uses must name"):
        unary("Bad", [torch.exp], "y = e^x  ->  dy/dx = y", lambda g, x, y: g * y, uses=("z",))


def test_the_poison_itself_is_caught_by_torch_calls_and_operators():
    for use in (lambda p: torch.ones(2) * p, lambda p: torch.cos(p), lambda p: -p, lambda p: p.abs(), lambda p: p == 0):
        with pytest.raises(Touched):
            use(Poison())
