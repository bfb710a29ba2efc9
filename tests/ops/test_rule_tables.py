"""Every table rule's `uses` says exactly what its gradient formulas read: not less (a formula would read a
tensor that was never saved) and not more (a tensor saved for nothing makes an in-place change of it an error
where torch allows it)."""
import math

import pytest
import torch
from helpers import WrongSquare

import torchtrace as tt
from torchtrace.autograd.function import RULES
from torchtrace.autograd.node import Context
from torchtrace.ops.rule_tables import AS_CALLED, NAMES, Meta, unary

TABLE_RULES = sorted({rule for rule in RULES.values() if "formulas" in rule.__dict__}, key=lambda r: r.__name__)


def _grid(*shape: int):
    """Inputs for rules that need more dims than the default 1-D sample."""
    return lambda: [torch.linspace(1.1, 1.9, math.prod(shape), dtype=torch.float64).reshape(shape)]


def _other(*shape: int) -> torch.Tensor:
    return torch.zeros(shape, dtype=torch.float64)


# rules whose formulas need other inputs than 1-D float64 tensors of 4, or options without a usable default:
# name -> (make the inputs, the arguments after them)
SAMPLES = {
    "Threshold": (None, (1.5, 0.0)), "Cumsum": (None, (0,)), "BroadcastTo": (None, ((2, 4),)),
    "Expand": (None, (2, 4)), "ExpandAs": (None, (_other(3, 4),)), "SumToSize": (None, ((1,),)),
    "Flip": (None, ((0,),)), "Fliplr": (_grid(2, 3), ()), "MT": (_grid(2, 3), ()), "Movedim": (_grid(2, 3), (0, 1)),
    "Narrow": (None, (0, 1, 2)), "Permute": (_grid(2, 3), (1, 0)), "Repeat": (None, (2,)), "Reshape": (None, ((2, 2),)),
    "ReshapeAs": (None, (_other(2, 2),)), "Roll": (None, (1,)), "Rot90": (_grid(2, 3), ()), "Select": (None, (0, 1)),
    "Swapaxes": (_grid(2, 3), (0, 1)), "Tile": (None, ((2,),)), "Transpose": (_grid(2, 3), (0, 1)),
    "Tril": (_grid(3, 3), ()), "Triu": (_grid(3, 3), ()), "Type": (None, (torch.float32,)),
    "TypeAs": (None, (_other(1).float(),)), "Unflatten": (None, (0, (2, 2))), "Unfold": (None, (0, 2, 1)),
    "Unsqueeze": (None, (0,)), "View": (None, (2, 2)), "ViewAs": (None, (_other(2, 2),)),
    "Diagonal": (_grid(3, 3), ()), "TProperty": (_grid(2, 3), ()), "PixelShuffling": (_grid(1, 4, 2, 2), (2,)),
    "PixelUnshuffling": (_grid(1, 1, 4, 4), (2,)), "ChannelShuffling": (_grid(1, 4, 2, 2), (2,)),
    "SelectScatter": (lambda: [_grid(2, 3)()[0], torch.ones(3, dtype=torch.float64)], (0, 1)),
    "DiagonalScatter": (lambda: [_grid(3, 3)()[0], torch.ones(3, dtype=torch.float64)], ()),
    "Fill": (lambda: [_grid(4)()[0], torch.tensor(2.0, dtype=torch.float64)], ()), "LinalgDiagonal": (_grid(3, 3), ()),
    "Adjoint": (_grid(2, 3), ()),
}


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
    args, kwargs = (ctx.args, ctx.kwargs) if rule.options == AS_CALLED else ((), getattr(ctx, "options", {}))
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


def _runs_here(rule: type) -> None:
    if rule.__name__ == "Cuda" and not torch.cuda.is_available():
        pytest.skip("Tensor.cuda's forward needs a CUDA device")


@pytest.mark.parametrize("rule", TABLE_RULES, ids=lambda r: r.__name__)
def test_each_formula_reads_nothing_it_does_not_declare(rule):
    _runs_here(rule)
    values, options, g = _sample(rule)
    for i, used in enumerate(rule.uses):
        result = _call(rule, i, values, options, g, allowed=set(used))
        assert isinstance(result, torch.Tensor) and result.shape == values[NAMES[len(rule.uses)][i]].shape


@pytest.mark.parametrize("rule", TABLE_RULES, ids=lambda r: r.__name__)
def test_each_formula_reads_everything_it_declares(rule):
    _runs_here(rule)
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


def _both(fn):
    """fn(leaf) run on a tracer and under torch autograd: the two leaves' gradients."""
    ours, theirs = tt.tracer(torch.arange(4.0, dtype=torch.float64), requires_grad=True), \
        torch.arange(4.0, dtype=torch.float64, requires_grad=True)
    fn(ours).backward()
    fn(theirs).backward()
    return ours.grad, theirs.grad


def test_a_rule_that_keeps_only_a_shape_allows_changing_its_input_in_place_as_torch_does():
    def fn(x):
        y = x * 2
        loss = y.sum() + y.reshape(2, 2).mean() + y.expand(3, 4).sum()  # x.meta rules: nothing saved
        y.add_(1)
        return loss

    ours, theirs = _both(fn)
    torch.testing.assert_close(ours, theirs)


def test_a_tensor_argument_is_read_at_the_call_not_at_backward():
    def fn(x):
        start = torch.tensor(1)
        y = x.narrow(0, start, 2) * torch.tensor([1.0, 10.0], dtype=torch.float64)
        start.add_(1)  # after the call: the gradient still goes where the slice came from
        return y.sum()

    ours, theirs = _both(fn)
    torch.testing.assert_close(ours, theirs)
    assert ours.tolist() == [0.0, 1.0, 10.0, 0.0]


def test_a_table_rule_names_its_options_so_keywords_find_their_place():
    assert RULES[torch.sum].param_index("dim") == 1 and RULES[torch.sum].param_index("keepdim") == 2
    with pytest.raises(tt.GradientMismatch, match="WrongSquareBackward"):  # the mismatch report re-runs sum(dim=0)
        tt.check(lambda x: WrongSquare.apply(x).sum(dim=0), torch.rand(3, 2, dtype=torch.float64))


def test_an_input_passed_by_keyword_takes_its_place():
    value = torch.tensor(2.0, dtype=torch.float64)
    ours, theirs = _both(lambda x: (torch.fill(x, value=3.0) * x).sum() + torch.clamp_min(x, min=value).sum())
    torch.testing.assert_close(ours, theirs)
