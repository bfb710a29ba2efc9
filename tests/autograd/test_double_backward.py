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


TORCH_MODULES = {  # a plain torch module: its parameters are tensors with torch's requires_grad, saved by the rule
    "group_norm": (lambda: torch.nn.GroupNorm(2, 4), (2, 4, 3)),
    "batch_norm_eval": (lambda: torch.nn.BatchNorm1d(4).eval(), (3, 4)),
    "batch_norm_train": (lambda: torch.nn.BatchNorm1d(4), (3, 4)),
    "instance_norm_affine": (lambda: torch.nn.InstanceNorm1d(4, affine=True), (2, 4, 5)),
    "layer_norm": (lambda: torch.nn.LayerNorm(4), (2, 4)),
    "conv1d": (lambda: torch.nn.Conv1d(4, 2, 3), (2, 4, 6)),
}


def second_order(module, x, compiled):
    """d/d(x, parameters) of |d(sum tanh(m(x))^2)/dx|^2, by torchtrace (eager or tt.compile) or torch autograd."""
    import copy

    import torchtrace as tt
    module = copy.deepcopy(module)
    params = list(module.parameters())
    if compiled is None:
        x = x.clone().requires_grad_()
        (g,) = torch.autograd.grad(module(x).tanh().pow(2).sum(), x, create_graph=True)
        return [x, *params], torch.autograd.grad((g * g).sum(), [x, *params])

    def loss(x):
        return module(x).tanh().pow(2).sum()
    run = tt.compile(loss, (tt.tracer(x, requires_grad=True),)) if compiled else loss
    for _ in range(2 if compiled else 1):  # (compiled: the second call replays)
        xt = tt.tracer(x.clone(), requires_grad=True)
        (g,) = tt.grad(run(xt), xt, create_graph=True)
        grads = tt.grad((g * g).sum(), [xt, *params])
    return [xt, *params], [t.detach().as_subclass(torch.Tensor) for t in grads]


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("name", sorted(TORCH_MODULES))
def test_double_backward_through_a_plain_torch_modules_parameters(name, compiled):
    """A rule's saved torch parameter (w) was used alone in its backward (w.reshape) under create_graph: torch autograd
    recorded that op and the tracer it met refused it. Now it is a tracer of its own leaf there."""
    make, shape = TORCH_MODULES[name]
    torch.manual_seed(0)
    module, x = make().double(), torch.randn(*shape, dtype=torch.float64)
    _, ours = second_order(module, x, compiled)
    _, theirs = second_order(module, x, None)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b)
    v = torch.randn_like(x)  # finite differences of the first derivative's squared norm, along v

    def first(point):
        p = point.clone().requires_grad_()
        (g,) = torch.autograd.grad(module(p).tanh().pow(2).sum(), p)
        return (g * g).sum()
    eps = 1e-6
    numeric = (first(x + eps * v) - first(x - eps * v)) / (2 * eps)
    torch.testing.assert_close((ours[0] * v).sum(), numeric, rtol=1e-5, atol=1e-6)


def test_a_gradient_seed_that_is_a_torch_leaf_gets_its_gradient_under_create_graph():
    """backward(gradient=v, create_graph=True) / tt.grad(grad_outputs=v): d(x.grad)/dv = exp(x) reached v when v was a
    tracer, and was silently None when v was a plain tensor with torch's requires_grad (a torch leaf)."""
    import torchtrace as tt
    x0 = torch.tensor([0.3, -1.2, 0.7], dtype=torch.float64)
    x, v = tt.tracer(x0, requires_grad=True), torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64, requires_grad=True)
    x.exp().backward(gradient=v, create_graph=True)
    x.grad.sum().backward()
    torch.testing.assert_close(v.grad, x0.exp())
    x, v = tt.tracer(x0, requires_grad=True), torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64, requires_grad=True)
    (g,) = tt.grad(x.exp(), x, grad_outputs=v, create_graph=True)
    torch.testing.assert_close(tt.grad(g.sum(), v)[0], x0.exp())
