"""The registry's listing: one list and one count of supported callables, and a math line on every rule that
states its derivative."""
import torch

import torchtrace as tt
from torchtrace.autograd.function import RULES
from torchtrace.naming import callable_name
from torchtrace.ops.listing import families, is_refusal, math_line, math_line_problem, rules, supported_ops


def test_every_rule_states_its_derivative_in_its_math_line():
    missing = {rule.__name__: f"{math_line(rule)!r}: {math_line_problem(rule)}" for rule in rules()
               if math_line_problem(rule)}
    assert not missing, missing


class ForwardOnly(tt.Function):
    """y = x^2, squared"""


class PrivateHelper(tt.Function):
    """l = -sum_c a_c log p_c  ->  dx = g (p - a), a from _class_coefficients"""


class Stated(tt.Function):
    """y = x^2  ->  dx = 2 g x"""


def test_the_convention_rejects_a_rule_without_a_derivative_or_with_private_names():
    assert "no derivative" in math_line_problem(ForwardOnly)
    assert "_class_coefficients" in math_line_problem(PrivateHelper)
    assert math_line_problem(Stated) == ""
    original = RULES[torch.Tensor.xlogy]
    tt.register(torch.Tensor.xlogy, rule=ForwardOnly)  # plant a registered rule without a derivative
    try:
        assert ForwardOnly in [rule for rule in rules() if math_line_problem(rule)]
    finally:
        RULES[torch.Tensor.xlogy] = original
    assert ForwardOnly not in rules()


def test_refusals_are_registered_but_neither_listed_nor_counted():
    refused = [func for func, rule in RULES.items() if is_refusal(rule)]
    assert torch.as_strided_scatter in refused and torch.nn.functional.multi_head_attention_forward in refused
    assert not set(refused) & set(supported_ops())
    listed = {name for names in families().values() for name in names}
    assert "torch.as_strided_scatter" not in listed and "torch.as_strided" in listed


def test_one_count_the_public_callables_with_a_differentiating_rule():
    names = [name for family in families().values() for name in family]
    assert len(names) == len(set(names)) == len(supported_ops()) == len(tt.supported_ops())
    assert all(not name.split(".")[-1].startswith("_") or name.split(".")[-1].startswith("__") for name in names)
    assert callable_name(torch.ops.aten.slice.Tensor) not in names  # internal spellings are not counted
