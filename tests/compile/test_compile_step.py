"""A whole training step compiled: forward, loss.backward(), opt.step() and opt.zero_grad() inside one compiled call.

The compiled step and an eager twin start from the same weights, see the same batches and the same changes
between calls; after every call their losses, and at the end their parameters, .grad and optimizer state, must
be equal bit for bit. The optimizer and any scheduler run as their own Python on every call; the step is one
recorded program however the learning rate, the parameters or their .grad change between calls.
"""
import copy
import warnings

import pytest
import torch
from torch import nn

import torchtrace as tt

STEPS = 6


def plain(t):
    return t.detach().as_subclass(torch.Tensor)


def mlp():
    return nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))


def cnn():
    return nn.Sequential(nn.Conv2d(1, 3, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(12, 1))


def batches(model_kind, seed=0):
    g = torch.Generator().manual_seed(seed)
    shape = (5, 3) if model_kind is mlp else (5, 1, 6, 6)
    return [(torch.randn(*shape, generator=g, dtype=torch.float64), torch.randn(5, 1, generator=g, dtype=torch.float64))
            for _ in range(STEPS)]


def make_step(model, optimizer, zero_first=True, set_to_none=True):
    def step(x, y):
        if zero_first:
            optimizer.zero_grad(set_to_none=set_to_none)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        if not zero_first:
            optimizer.zero_grad(set_to_none=set_to_none)
        return loss

    return step


def train_both(build, make_optimizer, data, change=lambda i, model, optimizer: None, **step_options):
    """Train a compiled step and an eager twin on `data`; return (compiled step, its model, its optimizer, twin's)."""
    torch.manual_seed(0)
    model = tt.port(build().double())
    twin = copy.deepcopy(model)
    optimizer, twin_optimizer = make_optimizer(model.parameters()), make_optimizer(twin.parameters())
    eager = make_step(twin, twin_optimizer, **step_options)
    compiled = tt.compile(make_step(model, optimizer, **step_options), data[0])
    eager(*data[0])
    compiled(*data[0])  # the first call records the program
    for i, batch in enumerate(data[1:]):
        change(i, model, optimizer)
        change(i, twin, twin_optimizer)
        ours, theirs = compiled(*batch), eager(*batch)
        torch.testing.assert_close(plain(ours), plain(theirs), rtol=0, atol=0)
    for a, b in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(plain(a), plain(b), rtol=0, atol=0)
        assert (a.grad is None) == (b.grad is None)
        if a.grad is not None:
            torch.testing.assert_close(plain(a.grad), plain(b.grad), rtol=0, atol=0)
    for a, b in zip(model.parameters(), twin.parameters()):
        state, twin_state = optimizer.state[a], twin_optimizer.state[b]
        assert state.keys() == twin_state.keys()
        for key in state:
            torch.testing.assert_close(plain(torch.as_tensor(state[key])), plain(torch.as_tensor(twin_state[key])),
                                       rtol=0, atol=0)
    return compiled


def sgd_momentum(params):
    return tt.optim.SGD(params, lr=0.05, momentum=0.9)


@pytest.mark.parametrize("build", [mlp, cnn], ids=["mlp", "cnn"])
@pytest.mark.parametrize("make_optimizer", [sgd_momentum, lambda p: tt.optim.SGD(p, lr=0.05, momentum=0.9,
                                                                                  nesterov=True, weight_decay=1e-2)],
                         ids=["momentum", "nesterov-weight-decay"])
def test_a_training_step_compiles_whole_and_trains_as_eager(build, make_optimizer):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compiled = train_both(build, make_optimizer, batches(build))
    assert len(compiled.program.paths()) == 1 and compiled.replayed == STEPS - 1  # one program, replayed


@pytest.mark.parametrize("zero_first", [True, False], ids=["zero-grad-first", "zero-grad-last"])
@pytest.mark.parametrize("set_to_none", [True, False])
def test_zero_grad_before_or_after_with_or_without_set_to_none_leaves_the_gradients_as_eager(zero_first, set_to_none):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compiled = train_both(mlp, sgd_momentum, batches(mlp), zero_first=zero_first, set_to_none=set_to_none)
    assert len(compiled.program.paths()) == 1 and compiled.replayed == STEPS - 1


def test_adam_trains_compiled_as_one_program_bit_for_bit():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compiled = train_both(mlp, lambda p: tt.optim.Adam(p, lr=1e-2), batches(mlp))
    assert len(compiled.program.paths()) == 1 and compiled.replayed == STEPS - 1


def test_a_learning_rate_changed_between_steps_is_used():
    def change(i, model, optimizer):
        if i == 1:
            optimizer.param_groups[0]["lr"] = 0.2
        if i == 3:
            optimizer.param_groups[0]["momentum"] = 0.5

    compiled = train_both(mlp, sgd_momentum, batches(mlp), change)
    assert len(compiled.program.paths()) == 1


def test_a_torch_scheduler_between_steps_is_followed():
    schedulers = {}

    def change(i, model, optimizer):
        scheduler = schedulers.setdefault(id(optimizer), torch.optim.lr_scheduler.StepLR(optimizer, 2, gamma=0.5))
        scheduler.step()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's note on calling the scheduler before the optimizer
        train_both(mlp, sgd_momentum, batches(mlp), change)


def test_a_parameter_replaced_between_steps_is_trained_as_eager():
    def change(i, model, optimizer):
        if i == 2:
            new = tt.nn.Parameter(tt.as_tracer(torch.full((8, 3), 0.1, dtype=torch.float64)))
            old = model[0].weight
            model[0].weight = new
            group = optimizer.param_groups[0]
            group["params"] = [new if p is old else p for p in group["params"]]
            optimizer.state.pop(old, None)

    compiled = train_both(mlp, sgd_momentum, batches(mlp), change)
    assert len(compiled.program.paths()) == 1  # the new parameter is bound to the same slot: nothing is keyed on it


def test_grad_present_before_a_step_without_zero_grad_is_not_overwritten():
    """A step without zero_grad adds to .grad: the first call finds None, later ones add into what is there."""
    torch.manual_seed(0)
    model = tt.port(mlp().double())
    twin = copy.deepcopy(model)

    def step_of(m):
        def step(x, y):
            loss = nn.functional.mse_loss(m(x), y)
            loss.backward()
            return loss
        return step

    data = batches(mlp)
    compiled = tt.compile(step_of(model), data[0])
    for batch in data[0:3]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compiled(*batch)
        step_of(twin)(*batch)
    for a, b in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(plain(a.grad), plain(b.grad), rtol=0, atol=0)


def test_verify_refuses_to_run_a_training_step_twice():
    model = tt.port(mlp().double())
    optimizer = sgd_momentum(model.parameters())
    data = batches(mlp)
    compiled = tt.compile(make_step(model, optimizer), data[0], verify=2)
    before = [plain(p).clone() for p in model.parameters()]
    with pytest.raises(tt.UnsupportedOperationError, match="cannot compare a training step"):
        compiled(*data[1])
    for a, b in zip(before, model.parameters()):  # the refused comparison left the parameters as they were
        assert torch.equal(a, plain(b))


def test_a_function_compiled_inside_a_backward_pass_gives_eagers_values():
    """Under backward(create_graph=True) a hook's torch calls are recorded; compiling there changes nothing."""
    v = tt.tracer(torch.tensor([1.0, -2.0]), requires_grad=True)
    compiled = []

    def hook(grad):
        compiled.append(tt.compile(lambda x: (x * v).tanh().sum(), (torch.ones(2),)))
        compiled[0](torch.ones(2))
        return grad

    w = tt.tracer(torch.ones(2), requires_grad=True)
    w.register_hook(hook)
    (w * 2).sum().backward(create_graph=True)
    x = torch.tensor([0.5, 3.0])
    for _ in range(2):
        torch.testing.assert_close(plain(compiled[0](x)), plain((x * v).tanh().sum()), rtol=0, atol=0)


def test_a_grad_replaced_between_steps_is_the_one_the_next_step_adds_into():
    def change(i, model, optimizer):
        if i == 2:
            for p in model.parameters():
                p.grad = torch.full_like(plain(p), 0.5)

    compiled = train_both(mlp, sgd_momentum, batches(mlp), change, set_to_none=False)
    assert len(compiled.program.paths()) == 1


def test_a_backward_that_reaches_a_graph_outside_the_step_gives_eagers_gradient():
    torch.manual_seed(0)
    model = tt.port(mlp().double())
    scale = tt.tracer(torch.tensor(1.5, dtype=torch.float64), requires_grad=True)
    optimizer = sgd_momentum(model.parameters())
    data = batches(mlp)
    step = make_step(model, optimizer)
    compiled = tt.compile(step, (data[0][0] * scale, data[0][1]))
    compiled(data[0][0] * scale, data[0][1])
    twin = copy.deepcopy(model)  # the parameters before the call: the gradient of scale is taken there
    scale.grad = None
    compiled(data[1][0] * scale, data[1][1])
    got = plain(scale.grad).clone()
    scale.grad = None
    make_step(twin, sgd_momentum(twin.parameters()))(data[1][0] * scale, data[1][1])
    torch.testing.assert_close(got, plain(scale.grad), rtol=0, atol=0)
