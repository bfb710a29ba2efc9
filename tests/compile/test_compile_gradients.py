"""tt.compile gives the gradients of eager torchtrace and of torch autograd, and composes with eager code."""
import copy

import pytest
import torch
import torch.nn.functional as F
from test_port import GPT, LeNet, sequence_loss

import torchtrace as tt
from torchtrace.port import port


def _grads(model: torch.nn.Module) -> list:
    return [p.grad.clone() for p in model.parameters()]


def _zero(model: torch.nn.Module) -> None:
    for p in model.parameters():
        p.grad = None


def _mlp() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(2, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16), torch.nn.Tanh(),
                               torch.nn.Linear(16, 1))


CASES = {
    "mlp": lambda: (_mlp(), torch.randn(8, 2, dtype=torch.float64), torch.randn(8, 1, dtype=torch.float64),
                    F.mse_loss),
    "lenet": lambda: (LeNet(), torch.randn(2, 1, 28, 28, dtype=torch.float64), torch.tensor([3, 7]),
                      F.cross_entropy),
    "gpt": lambda: (GPT(vocab=16, d=16, heads=2, length=8, layers=2), torch.randint(0, 16, (2, 8)),
                    torch.randint(0, 16, (2, 8)), sequence_loss),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_gradients_match_eager_torchtrace_and_torch_autograd(name):
    torch.manual_seed(0)
    twin, x, target, loss_fn = CASES[name]()
    twin = twin.double()
    ours = port(copy.deepcopy(twin))
    compiled = tt.compile(lambda inputs, targets: loss_fn(ours(inputs), targets), (x, target))
    compiled(x, target)  # the first call records the program (eagerly); the next ones replay it
    _zero(ours)
    loss = compiled(x, target)
    assert loss._tt_node.name == "CompiledCallBackward"  # grad_fn is its statement's node
    loss.backward()
    got = _grads(ours)
    _zero(ours)
    loss_fn(ours(x), target).backward()
    eager = _grads(ours)
    expected_loss = loss_fn(twin(x), target)
    expected_loss.backward()
    torch.testing.assert_close(float(loss), expected_loss.item())
    for g, e, t in zip(got, eager, twin.parameters()):
        torch.testing.assert_close(g, e, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(g, t.grad)


def test_compiled_and_eager_code_compose_and_an_optimizer_step_works():
    torch.manual_seed(0)
    model = tt.nn.Linear(3, 2)
    scale = tt.randn(3, requires_grad=True)
    body = tt.compile(lambda x: torch.tanh(model(x)), (torch.randn(4, 3),))
    x = tt.randn(4, 3)

    def run(fn):
        for p in (*model.parameters(), scale):
            p.grad = None
        ((fn(x * scale) ** 2).sum() * 3).backward()  # eager before and after the compiled part
        return [p.grad.clone() for p in (*model.parameters(), scale)]

    run(body)  # records
    for g, e in zip(run(body), run(lambda v: torch.tanh(model(v)))):
        torch.testing.assert_close(g, e)
    before = model.weight.detach().clone()
    tt.optim.SGD(model.parameters(), lr=0.1).step()
    assert not torch.equal(before, model.weight.detach())


def test_tt_grad_through_a_compiled_call():
    w = tt.randn(3, requires_grad=True)
    f = tt.compile(lambda x: (x * w).sin().sum(), (torch.randn(3),))
    x = tt.randn(3, requires_grad=True)
    f(x)
    gx, gw = tt.grad(f(x), [x, w])
    ex, ew = tt.grad((x * w).sin().sum(), [x, w])
    torch.testing.assert_close(gx, ex)
    torch.testing.assert_close(gw, ew)


@pytest.mark.parametrize("how", ["tt.grad", "allow_unused", "backward(inputs=) inside", "then a backward below"])
def test_the_gradient_of_a_value_made_inside_a_compiled_call(how):
    """tt.grad(y, [h]) and y.backward(inputs=[h]) for h made inside the compiled call (both outputs of its one node):
    on every replayed call the gradient eager gives (d y/d h = cos(h) w, exactly), and nothing below h run
    or freed, as eager leaves it."""
    torch.manual_seed(0)
    w = tt.randn(3, requires_grad=True, dtype=torch.float64)
    x = tt.randn(3, requires_grad=True, dtype=torch.float64)

    def fn(x):
        h = x * w
        y = (h.sin() * w).sum()
        if how == "backward(inputs=) inside":
            y.backward(inputs=[h], retain_graph=True)
        return y, h

    def gradient(y, h):
        if how == "tt.grad":
            return tt.grad(y, [h], retain_graph=True)[0]
        if how == "allow_unused":
            return tt.grad(y, [h], allow_unused=True, retain_graph=True)[0]
        if how == "backward(inputs=) inside":
            return h.grad
        g = tt.grad(y, [h])[0]
        x.grad = None
        h.sum().backward()  # the statement below h was not run by tt.grad: its saved tensors are still there
        torch.testing.assert_close(x.grad, w.detach().as_subclass(torch.Tensor), rtol=0, atol=0)
        return g

    expected = gradient(*fn(x))
    wt = w.detach().as_subclass(torch.Tensor)
    torch.testing.assert_close(expected, torch.cos(x.detach().as_subclass(torch.Tensor) * wt) * wt)  # d/dh
    compiled = tt.compile(fn, (x,))
    for _ in range(3):
        got = gradient(*compiled(x))
        assert got is not None
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
    assert compiled.replayed >= 2  # (the first call records)


def test_tt_grad_runs_the_hooks_of_inside_values_only_where_eager_runs_them():
    """tt.grad(y, [k]) with k made inside a compiled call: a hook or retain_grad on an inside value that k's
    gradient does not need never runs (as in eager and torch); the gradient is eager's, bit for bit."""
    W = tt.nn.Parameter(torch.randn(4, 4, generator=torch.Generator().manual_seed(1)))
    V = tt.nn.Parameter(torch.randn(4, 4, generator=torch.Generator().manual_seed(2)))
    seen, inside = [], []

    def fn(x):
        a = x @ W
        k = torch.tanh(a) @ V
        m = torch.sigmoid(a)
        m.register_hook(lambda g: seen.append(g))
        m.retain_grad()
        inside[:] = [k, m]
        return (m * a).sum() + (k * m).sum()

    results = {}
    for mode in ("eager", "compiled"):
        f = fn if mode == "eager" else tt.compile(fn, (torch.randn(3, 4),))
        results[mode] = []
        for call in range(3):
            seen.clear()
            y = f(torch.randn(3, 4, generator=torch.Generator().manual_seed(10 + call)))
            gk, = tt.grad(y, [inside[0]])
            results[mode].append(gk.detach().as_subclass(torch.Tensor))
            assert not seen and inside[1].grad is None, (mode, call)
    for got, expected in zip(results["compiled"], results["eager"]):
        torch.testing.assert_close(got, expected, rtol=0, atol=0)


@pytest.mark.parametrize("tool", ["diagnose", "explore"])
def test_the_graph_tools_read_a_compiled_node_whose_tensor_two_statements_read(tool):
    """A compiled node sends a tensor read by several statements their gradients one by one: the tools that watch a
    backward read them as the edge's one gradient, as on an eager result."""
    W = tt.nn.Parameter(torch.randn(4, 4, generator=torch.Generator().manual_seed(0)))
    f = tt.compile(lambda x: (torch.tanh(x @ W) @ W).sum(), (torch.randn(3, 4),))
    f(torch.randn(3, 4))  # recorded; the next call replays
    y = f(torch.randn(3, 4))
    if tool == "diagnose":
        assert tt.diagnose(y) is not None
    else:
        assert tt.explore(y, retain_graph=True) is not None
    assert W.grad is None or torch.isfinite(W.grad).all()


def _gradients_of_w(compiled: bool, case: str) -> list:
    """w.grad after each of four backwards, and how often w's post-accumulate hook ran in each."""
    torch.manual_seed(0)
    x, w = tt.randn(50, requires_grad=True), tt.randn(50, requires_grad=True)
    calls = []
    w.register_post_accumulate_grad_hook(lambda leaf: calls.append(1))

    def used_again_outside(x):
        a = x * w
        return a, a.sin() * w

    def loop(x, n):
        h = x
        for _ in range(n):
            h = torch.sin(h * w)
        return h.sum()

    fn = used_again_outside if case == "used again outside" else loop
    f = tt.compile(fn, (x,) if case == "used again outside" else (x, 2)) if compiled else fn
    results = []
    for n in (2, 3, 3, 4):
        w.grad, calls[:] = None, []
        if case == "used again outside":
            a, b = f(x)
            (b * 3 + (a * w).exp()).sum().backward()  # w read once more, after the compiled call
        else:
            f(x, n).backward()  # n = 3 first leaves the recorded path half-way, then replays it
        results.append((w.grad.detach().as_subclass(torch.Tensor).clone(), len(calls)))
    return results


@pytest.mark.parametrize("case", ["used again outside", "a loop longer than recorded"])
def test_gradients_meet_in_eagers_order_bit_for_bit(case):
    """A parameter read by several compiled statements and by eager ops too: its gradient's terms are summed in
    eager's order (each statement's sent on its own), and its accumulator runs once, after every node that sends to it
    (a leaf's AccumulateGrad made by a compiled call comes before the call's node, as before an eager op's)."""
    eager, compiled = _gradients_of_w(False, case), _gradients_of_w(True, case)
    for (expected, hooks_expected), (got, hooks) in zip(eager, compiled):
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
        assert hooks == hooks_expected == 1


def test_second_derivatives_through_compiled_code():
    f = tt.compile(lambda x: (x ** 3).sum(), (tt.randn(3, requires_grad=True),))
    x = tt.randn(3, requires_grad=True, dtype=torch.float64)
    f(x)
    g, = tt.grad(f(x), [x], create_graph=True)  # 3 x^2
    h, = tt.grad(g.sum(), [x])  # 6 x
    x_ = x.detach().as_subclass(torch.Tensor).clone().requires_grad_()
    g_, = torch.autograd.grad((x_ ** 3).sum(), [x_], create_graph=True)
    torch.testing.assert_close(h.as_subclass(torch.Tensor), torch.autograd.grad(g_.sum(), [x_])[0])
    torch.testing.assert_close(h.as_subclass(torch.Tensor), 6 * x_.detach())
