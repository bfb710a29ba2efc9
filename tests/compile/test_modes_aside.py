"""A compiled call's backward without create_graph, and a torchtrace optimizer's update, run with tt.compile's replay
mode off the stack (plain.modes_aside): their torch calls record nothing, and entering the mode only handed each on.

What must hold: a whole training step compiled (zero_grad, forward, backward, update) trains exactly as torch autograd
does; torch calls a backward hook makes with grad mode on again give eager's values; a backward with create_graph still
runs under the mode (its calls record a graph, and the program replays them); a mode of the user's stays.
"""
import copy

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode, _get_current_function_mode_stack

import torchtrace as tt
from torchtrace.port import port


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(2, 5), torch.nn.Tanh(), torch.nn.Linear(5, 1)).double()


def _batches(n: int) -> list:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(6, 2, generator=g, dtype=torch.float64), torch.randn(6, 1, generator=g, dtype=torch.float64))
            for _ in range(n)]


def _central_differences(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, eps: float = 1e-6) -> list:
    grads = []
    with torch.no_grad():
        for p in model.parameters():
            g = torch.zeros_like(p)
            for i in range(p.numel()):
                p.view(-1)[i] += eps
                up = F.mse_loss(model(x), y).item()
                p.view(-1)[i] -= 2 * eps
                down = F.mse_loss(model(x), y).item()
                p.view(-1)[i] += eps
                g.view(-1)[i] = (up - down) / (2 * eps)
            grads.append(g)
    return grads


def test_a_compiled_training_step_trains_as_torch_autograd_with_the_mode_aside_in_backward_and_update():
    theirs = _mlp()
    reference = copy.deepcopy(theirs)  # for central differences at each step's weights
    ours = port(copy.deepcopy(theirs))
    torch_optimizer = torch.optim.SGD(theirs.parameters(), lr=0.1, momentum=0.9)
    optimizer = tt.optim.SGD(ours.parameters(), lr=0.1, momentum=0.9)
    seen_in_update = []

    class Watched(type(optimizer)):
        def update_all(self, *args, **kwargs):
            seen_in_update.append([type(m).__name__ for m in _get_current_function_mode_stack()])
            return super().update_all(*args, **kwargs)

    optimizer.__class__ = Watched
    seen_in_backward = []

    def step(x, y):
        optimizer.zero_grad()
        loss = F.mse_loss(ours(x), y)
        loss.register_hook(lambda g: seen_in_backward.append(
            [type(m).__name__ for m in _get_current_function_mode_stack()]))
        loss.backward()
        grads = [p.grad.as_subclass(torch.Tensor).clone() for p in ours.parameters()]
        optimizer.step()
        return loss, grads

    compiled = tt.compile(step, _batches(1)[0])
    for k, (x, y) in enumerate(_batches(5)):
        reference.load_state_dict(theirs.state_dict())
        torch_optimizer.zero_grad()
        torch_loss = F.mse_loss(theirs(x), y)
        torch_loss.backward()
        loss, grads = compiled(x, y)
        torch.testing.assert_close(loss.as_subclass(torch.Tensor), torch_loss.detach(), rtol=1e-12, atol=1e-14)
        for ours_grad, p, numeric in zip(grads, theirs.parameters(), _central_differences(reference, x, y)):
            torch.testing.assert_close(ours_grad, p.grad, rtol=1e-10, atol=1e-12)
            torch.testing.assert_close(ours_grad, numeric, rtol=1e-6, atol=1e-7)
        torch_optimizer.step()
        for p, q in zip(ours.parameters(), theirs.parameters()):
            torch.testing.assert_close(p.as_subclass(torch.Tensor), q.detach(), rtol=1e-12, atol=1e-14)
    assert compiled.replayed >= 4  # every call after the first replayed its program
    assert seen_in_backward == [[]] * 5 and seen_in_update == [[]] * 5  # the mode was off the stack there


def test_torch_calls_a_backward_hook_makes_with_grad_on_give_eagers_values():
    """A hook that computes a penalty with grad mode on during backward: the compiled and the eager call agree."""
    def run(compiled: bool) -> list:
        w = tt.tracer(torch.tensor([[0.5, -1.0], [1.5, 0.25]], dtype=torch.float64), requires_grad=True)
        found = []

        def hook(g):
            with torch.enable_grad():
                found.append((g @ w).tanh().sum())
            return g * 2

        def f(x):
            h = x @ w
            h.register_hook(hook)
            loss = h.sin().sum()
            loss.backward()
            return loss

        fn = tt.compile(f, (torch.ones(3, 2, dtype=torch.float64),)) if compiled else f
        values = []
        for k in range(3):
            w.grad = None
            loss = fn(torch.full((3, 2), 0.1 * (k + 1), dtype=torch.float64))
            penalty = found[-1]
            penalty.backward()  # the hook's value has its own graph, to w
            values.append((loss.item(), penalty.item(), w.grad.as_subclass(torch.Tensor).clone()))
        return values

    for (loss, penalty, grad), (loss_e, penalty_e, grad_e) in zip(run(True), run(False)):
        assert (loss, penalty) == (loss_e, penalty_e)
        torch.testing.assert_close(grad, grad_e, rtol=0, atol=0)


def test_a_backward_with_create_graph_still_runs_under_the_mode_and_a_users_mode_stays():
    seen = []

    class Users(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    w = tt.tracer(torch.tensor([0.3, -0.7], dtype=torch.float64), requires_grad=True)

    def f(x):
        y = (x * w).pow(3).sum()
        y.register_hook(lambda g: seen.append([type(m).__name__ for m in _get_current_function_mode_stack()]))
        (g,) = tt.grad(y, w, create_graph=True)
        return (g * g).sum()

    compiled = tt.compile(f, (torch.ones(2, dtype=torch.float64),))
    x = torch.tensor([1.5, 2.0], dtype=torch.float64)
    for _ in range(3):
        w.grad = None
        compiled(x).backward()  # d/dw sum((3 x^3 w^2)^2) = 4 * 9 x^6 w^3
        torch.testing.assert_close(w.grad.as_subclass(torch.Tensor), 36 * x ** 6 * w.detach() ** 3)
    assert seen == [["ReplayMode"]] * 3
    seen.clear()
    with Users():
        y = (x * w).sum()
        y.register_hook(lambda g: seen.append([type(m).__name__ for m in _get_current_function_mode_stack()]))
        y.backward()
    assert seen == [["Users"]]
