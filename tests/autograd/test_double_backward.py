"""create_graph=True: second derivatives of the core ops (mul, div, pow, exp, tanh, matmul, ...) equal torch's."""
import pytest
import torch
from helpers import double_backward_matches


def softmax_by_hand(x):
    e = torch.exp(x - x.amax(-1, keepdim=True).detach())
    return e / e.sum(-1, keepdim=True)


CASES = {
    "mul": (lambda a, b: a * b * a, (3, 4), (4,)),
    "div": (lambda a, b: a / b, (3, 4), (3, 4)),
    "pow": (lambda a, b: a ** b + a ** 3, (3,), (3,)),
    "exp": (lambda a, b: torch.exp(a) * b, (3,), (3,)),
    "log": (lambda a, b: torch.log(a) * b, (3,), (3,)),
    "tanh": (lambda a, b: torch.tanh(a * b), (2, 3), (3,)),
    "sigmoid": (lambda a, b: torch.sigmoid(a) * b, (4,), (4,)),
    "matmul": (lambda a, b: (a @ b) ** 2, (3, 4), (4, 2)),
    "sum": (lambda a, b: (a * b).sum(0) ** 2, (3, 4), (4,)),
    "mean": (lambda a, b: (a * b).mean(-1) ** 2, (3, 4), (4,)),
    "softmax_by_hand": (lambda a, b: softmax_by_hand(a * b) * b, (3, 4), (4,)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_double_backward_matches_torch(name):
    fn, shape_a, shape_b = CASES[name]
    generator = torch.Generator().manual_seed(0)
    a = torch.rand(shape_a, generator=generator, dtype=torch.float64) + 0.5
    b = torch.rand(shape_b, generator=generator, dtype=torch.float64) + 0.5
    double_backward_matches(fn, a, b)
