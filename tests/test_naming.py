"""Callable names as users write them: unique across the rule table, dunder wrappers named as such."""
import torch
import torch.nn.functional as F

from torchtrace.autograd.function import RULES
from torchtrace.naming import callable_name


def test_every_supported_callable_has_its_own_name():
    names = [callable_name(func) for func in RULES]
    duplicates = {name for name in names if names.count(name) > 1}
    assert not duplicates, f"listed twice by python -m torchtrace ops: {sorted(duplicates)}"


def test_names_read_as_user_code():
    assert callable_name(torch.Tensor.__pow__) == "torch.Tensor.__pow__"
    assert callable_name(torch.Tensor.pow) == "torch.Tensor.pow"
    assert callable_name(torch.pow) == "torch.pow"
    assert callable_name(F.relu) == "torch.nn.functional.relu"
    assert callable_name(torch._C._nn.linear) == "torch.nn.functional.linear"
    assert callable_name(torch.Tensor.T.__get__) == "torch.Tensor.T.__get__"
