"""F.linear / F.bilinear rules and the Linear / Bilinear modules, against torch autograd and finite differences."""
import pytest
import torch
import torch.nn.functional as F
from helpers import check_op, double_backward_matches, non_contiguous
from torch.func import functional_call

import torchtrace as tt
import torchtrace.nn as nn

torch.manual_seed(0)
X, W, B = torch.randn(4, 3), torch.randn(2, 3), torch.randn(2)


@pytest.mark.parametrize("fn, inputs", [
    (lambda x, w, b: F.linear(x, w, b), (X, W, B)),
    (lambda x, w: F.linear(x, w), (X, W)),
    (lambda x, w, b: F.linear(x, w, bias=b), (X, W, B)),
    (lambda x, w, b: F.linear(input=x, weight=w, bias=b), (X, W, B)),
    (lambda x, w, b: F.linear(x, w, b), (torch.randn(2, 5, 3), W, B)),  # extra batch dimension
    (lambda x, w, b: F.linear(x, w, b), (torch.randn(3), W, B)),  # unbatched input
    (lambda x, w, b: F.linear(x, w, b), (X, W, torch.randn(()))),  # 0-d bias, broadcast
    (lambda x, w: F.linear(x, w), (X, torch.randn(3))),  # vector weight
    (lambda x, w, b: F.linear(x, w, b), (non_contiguous(X), non_contiguous(W), B)),
    (lambda x, w, b: F.linear(x, w, b), (X.double(), W.double(), B.double())),
    (lambda x, b: F.linear(x, x, b), (torch.randn(3, 3), torch.randn(3))),  # one tensor as input and weight
    (lambda x, w, b: F.linear(x, w, b) * 2 + F.linear(x, w, b), (X, W, B)),  # fan-out
])
def test_linear_function(fn, inputs):
    check_op(fn, *inputs)


@pytest.mark.parametrize("fn, inputs", [
    (lambda a, b, w, c: F.bilinear(a, b, w, c), (torch.randn(4, 3), torch.randn(4, 2), torch.randn(5, 3, 2),
                                                  torch.randn(5))),
    (lambda a, b, w: torch.bilinear(a, b, w), (torch.randn(4, 3), torch.randn(4, 2), torch.randn(5, 3, 2))),
    (lambda a, b, w, c: F.bilinear(a, b, w, c), (torch.randn(2, 4, 3), torch.randn(2, 4, 2), torch.randn(5, 3, 2),
                                                  torch.randn(5))),
    (lambda a, b, w, c: F.bilinear(a, b, w, c), (torch.randn(3), torch.randn(2), torch.randn(5, 3, 2), torch.randn(5))),
    (lambda a, w: F.bilinear(a, a, w), (torch.randn(4, 3).double(), torch.randn(2, 3, 3).double())),
])
def test_bilinear_function(fn, inputs):
    check_op(fn, *inputs)


@pytest.mark.parametrize("fn, inputs", [
    (lambda x, w, b: torch.tanh(F.linear(x, w, b)), (X, W, B)),
    (lambda x, w: F.linear(x, w) ** 2, (X, torch.randn(3))),
    (lambda a, b, w: torch.tanh(F.bilinear(a, b, w)), (X, torch.randn(4, 2), torch.randn(5, 3, 2))),
])
def test_double_backward(fn, inputs):
    double_backward_matches(fn, *inputs)


@pytest.mark.parametrize("make, inputs", [
    (lambda: nn.Linear(3, 2), (X,)),
    (lambda: nn.Linear(3, 2, bias=False), (X,)),
    (lambda: nn.Linear(3, 2, dtype=torch.float64), (X.double(),)),
    (lambda: nn.Bilinear(3, 2, 4), (torch.randn(5, 3), torch.randn(5, 2))),
])
def test_module_gradients_match_torch(make, inputs):
    """Input and parameter gradients of the module, through torch.func.functional_call."""
    layer = make()
    params = dict(layer.named_parameters())
    assert all(isinstance(p, nn.Parameter) and p.requires_grad for p in params.values())
    check_op(lambda p, *xs: functional_call(layer, p, xs), params, *inputs)


@pytest.mark.parametrize("ours, theirs, inputs", [
    (lambda: nn.Linear(6, 4), lambda: torch.nn.Linear(6, 4), (torch.randn(3, 6),)),
    (lambda: nn.Bilinear(3, 2, 4), lambda: torch.nn.Bilinear(3, 2, 4), (torch.randn(5, 3), torch.randn(5, 2))),
])
def test_same_seed_same_layer_as_torch(ours, theirs, inputs):
    torch.manual_seed(7)
    layer = ours()
    torch.manual_seed(7)
    twin = theirs()
    for (name, p), (twin_name, q) in zip(layer.named_parameters(), twin.named_parameters()):
        assert name == twin_name and torch.equal(p.as_subclass(torch.Tensor), q.detach())
    xs = [tt.tracer(x) for x in inputs]
    torch.testing.assert_close(layer(*xs).as_subclass(torch.Tensor), twin(*inputs).detach())


def test_linear_training_step_gradients_equal_torch():
    torch.manual_seed(1)
    layer = nn.Linear(3, 2)
    twin = torch.nn.Linear(3, 2)
    twin.load_state_dict(layer.state_dict())
    layer(tt.tracer(X)).pow(2).sum().backward()
    twin(X).pow(2).sum().backward()
    torch.testing.assert_close(layer.weight.grad, twin.weight.grad)
    torch.testing.assert_close(layer.bias.grad, twin.bias.grad)
    assert isinstance(layer.weight.grad, torch.Tensor) and not isinstance(layer.weight.grad, tt.tracer)


def test_linear_node_and_labels():
    layer = nn.Linear(98, 1)
    out = layer(tt.randn(3, 98))
    assert out.grad_fn.name == "LinearFunctionBackward"
    assert out.grad_fn.module is layer
    assert layer.original_repr() == "Linear layer (98 X 1)"
    assert repr(layer) == "Linear(in_features=98, out_features=1, bias=True)"


def test_no_parameter_gradient_without_grad_mode():
    layer = nn.Linear(3, 2)
    with tt.no_grad():
        out = layer(tt.tracer(X))
    assert out.grad_fn is None and not out.requires_grad


@pytest.mark.parametrize("shapes", [((4, 3), (2, 3)), ((2, 4, 3), (2, 3)), ((3,), (2, 3)), ((4, 3), (3,))], ids=str)
@pytest.mark.parametrize("frozen", [0, 1])
def test_linear_saves_x_only_for_dw_and_w_only_for_dx(shapes, frozen):
    """As torch: with x (or W) needing no gradient, W (or x) is not saved, so it may change in place before backward;
    the gradient is the one at the values of the call (checked against torch and finite differences)."""
    values = [torch.linspace(-1, 1, t.numel(), dtype=torch.float64).reshape(t.shape) for t in map(torch.empty, shapes)]
    # (a vector weight takes no bias in torch)
    bias = torch.linspace(0, 1, shapes[1][0], dtype=torch.float64) if len(shapes[1]) == 2 else None
    results, weights = [], None
    for ours in (True, False):
        leaves = [tt.tracer(v.clone(), requires_grad=k != frozen) if ours else v.clone().requires_grad_(k != frozen)
                  for k, v in enumerate(values)]
        out = F.linear(leaves[0], leaves[1], bias)
        weights = torch.linspace(0.5, 2, out.numel(), dtype=out.dtype).reshape(out.shape)
        moving = 1 - frozen  # needs a gradient, and no gradient reads it
        with (tt.no_grad() if ours else torch.no_grad()):
            leaves[moving].mul_(3)
        (out * weights).sum().backward()
        results.append(leaves[moving].grad.as_subclass(torch.Tensor))
    torch.testing.assert_close(results[0], results[1])
    place = lambda v: [values[0], v] if moving == 1 else [v, values[1]]  # noqa: E731
    loss = lambda v: (F.linear(*place(v), bias) * weights).sum()  # noqa: E731
    assert tt.gradcheck(loss, values[moving].clone())
    torch.testing.assert_close(results[0], torch.func.grad(loss)(values[moving].clone()))
