"""tt.nn.Module / Model / Parameter and the containers: torch's Module machinery on tracer parameters."""
import copy
import io
import pickle

import pytest
import torch
from helpers import ORIGINAL_SNIPPET_C_MODEL, check_op
from torch.func import functional_call

import torchtrace as tt
import torchtrace.nn as nn


def torch_requires_grad(t: torch.Tensor) -> bool:
    with torch._C.DisableTorchFunctionSubclass():
        return torch.Tensor.requires_grad.__get__(t)


def plain(t: torch.Tensor) -> torch.Tensor:
    with torch._C.DisableTorchFunctionSubclass():
        return t.as_subclass(torch.Tensor)


def mlp(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 2))


def torch_mlp(seed: int = 0) -> torch.nn.Sequential:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.ReLU(), torch.nn.Linear(5, 2))


def assert_tracer_parameters(module: torch.nn.Module) -> None:
    for name, p in module.named_parameters():
        assert type(p) is nn.Parameter, name
        assert isinstance(p, torch.nn.Parameter) and isinstance(p, tt.tracer)
        assert p.requires_grad and p._tt_requires_grad and p.is_leaf
        assert not torch_requires_grad(p), f"{name}: torch's own autograd must stay off"


# Parameter

def test_parameter_is_a_tracer_that_torch_takes_for_a_parameter():
    data = torch.randn(3)
    p = nn.Parameter(data)
    assert isinstance(p, torch.nn.Parameter) and isinstance(p, tt.tracer)
    assert p.requires_grad and not torch_requires_grad(p) and p.grad is None
    data += 1  # shares storage, as torch.nn.Parameter does
    torch.testing.assert_close(plain(p), data)
    assert repr(p).startswith("Parameter containing:\ntracer(")
    assert not nn.Parameter(torch.ones(2), requires_grad=False).requires_grad
    assert nn.Parameter([1, 2]).dtype == torch.float32
    assert nn.Parameter().shape == (0,)


def test_parameter_gradients_come_from_torchtrace():
    p = nn.Parameter(torch.tensor([1.0, 2.0]))
    (p * p).sum().backward()
    torch.testing.assert_close(p.grad, torch.tensor([2.0, 4.0]))
    assert type(p.grad) is torch.Tensor


def test_parameter_results_are_plain_tracers():
    p = nn.Parameter(torch.ones(2))
    assert type(p * 2) is tt.tracer


def test_integer_parameter_refuses_gradients():
    with pytest.raises(RuntimeError, match="floating point"):
        nn.Parameter(torch.tensor([1, 2]))


@pytest.mark.parametrize("duplicate", [copy.deepcopy, lambda p: pickle.loads(pickle.dumps(p))])
def test_parameter_copies_stay_parameters(duplicate):
    p = nn.Parameter(torch.randn(2, 2))
    q = duplicate(p)
    assert type(q) is nn.Parameter and q.requires_grad and q is not p
    torch.testing.assert_close(plain(q), plain(p))


# Module

def test_torch_parameters_become_tracer_parameters():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = torch.nn.Parameter(torch.ones(3))
            self.register_parameter("shift", torch.nn.Parameter(torch.zeros(3)))
            self.register_parameter("missing", None)

        def forward(self, x):
            return x * self.scale + self.shift

    net = Net()
    assert_tracer_parameters(net)
    assert [name for name, _ in net.named_parameters()] == ["scale", "shift"]
    check_op(lambda p, x: functional_call(net, p, (x,)), dict(net.named_parameters()), torch.randn(2, 3))


def test_layers_have_tracer_parameters():
    model = mlp()
    assert_tracer_parameters(model)
    assert [name for name, _ in model.named_parameters()] == ["0.weight", "0.bias", "2.weight", "2.bias"]


def test_same_seed_same_model_as_torch():
    ours, theirs = mlp(3), torch_mlp(3)
    for p, q in zip(ours.parameters(), theirs.parameters()):
        assert torch.equal(plain(p), q.detach())


def test_state_dict_is_plain_and_loads_into_the_torch_twin():
    model = mlp(1)
    state = model.state_dict()
    assert all(type(v) is torch.Tensor and not v.requires_grad for v in state.values())
    twin = torch_mlp(2)
    twin.load_state_dict(state)
    x = torch.randn(3, 4)
    torch.testing.assert_close(plain(model(tt.tracer(x))), twin(x).detach())
    kept = model.state_dict(keep_vars=True)
    assert all(type(v) is nn.Parameter for v in kept.values())


@pytest.mark.parametrize("assign", [False, True])
def test_load_state_dict_from_the_torch_twin(assign):
    model, twin = mlp(1), torch_mlp(2)
    model.load_state_dict(twin.state_dict(), assign=assign)
    assert_tracer_parameters(model)
    for p, q in zip(model.parameters(), twin.parameters()):
        assert torch.equal(plain(p), q.detach())


def test_torch_save_and_load_weights_only():
    model = mlp(1)
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    fresh = mlp(5)
    fresh.load_state_dict(state)
    for p, q in zip(model.parameters(), fresh.parameters()):
        assert torch.equal(plain(p), plain(q))


def test_whole_model_pickles():
    model = mlp(1)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    assert_tracer_parameters(loaded)
    assert repr(loaded) == repr(model)


@pytest.mark.parametrize("convert", [lambda m: m.to(torch.float64), lambda m: m.double()])
def test_dtype_conversion_keeps_tracer_parameters(convert):
    model = mlp()
    model(tt.randn(2, 4)).sum().backward()
    first = model[0].weight
    assert convert(model) is model
    assert_tracer_parameters(model)
    assert model[0].weight is first and first.dtype == torch.float64 and first.grad.dtype == torch.float64
    out = model(tt.randn(2, 4, dtype=torch.float64))
    assert out.dtype == torch.float64
    out.sum().backward()
    assert first.grad.dtype == torch.float64
    model.float()
    assert_tracer_parameters(model)
    assert first.dtype == torch.float32


def test_deepcopy_is_independent():
    model = mlp()
    target = copy.deepcopy(model)
    assert_tracer_parameters(target)
    for p, q in zip(model.parameters(), target.parameters()):
        assert p is not q and torch.equal(plain(p), plain(q))
    with tt.no_grad():
        target[0].weight.add_(1.0)
    assert not torch.equal(plain(model[0].weight), plain(target[0].weight))
    assert repr(target) == repr(model)


def test_train_eval_requires_grad_and_zero_grad():
    model = mlp()
    assert model.training and all(m.training for m in model)
    model.eval()
    assert not model.training and not any(m.training for m in model)
    model.train()
    assert model[2].training
    model(tt.randn(2, 4)).sum().backward()
    assert all(p.grad is not None for p in model.parameters())
    model.zero_grad()
    assert all(p.grad is None for p in model.parameters())
    model.requires_grad_(False)
    assert model(tt.randn(2, 4)).grad_fn is None
    model.requires_grad_(True)
    assert model(tt.randn(2, 4)).grad_fn is not None


def test_data_fill_changes_the_parameter():
    """Snippet C of the original README: `para.data.fill_(0.001)`."""
    model = mlp()
    for para in model.parameters():
        para.data.fill_(0.001)
    assert all(torch.equal(plain(p), torch.full(p.shape, 0.001)) for p in model.parameters())
    assert_tracer_parameters(model)


def test_torch_optimizer_trains_tracer_parameters():
    model = mlp()
    before = [plain(p).clone() for p in model.parameters()]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(tt.randn(3, 4)).pow(2).sum().backward()
    optimizer.step()
    assert_tracer_parameters(model)
    assert all(not torch.equal(a, plain(p)) for a, p in zip(before, model.parameters()))


def test_init_fills_tracer_parameters_like_torch_and_records_nothing():
    p = nn.Parameter(torch.empty(4, 3))
    q = torch.empty(4, 3)
    for fill in [nn.init.xavier_uniform_, nn.init.kaiming_normal_, lambda t: nn.init.normal_(t, 0.0, 0.1),
                 nn.init.zeros_, nn.init.orthogonal_]:
        torch.manual_seed(0)
        fill(p)
        torch.manual_seed(0)
        fill(q)
        assert torch.equal(plain(p), q)
        assert p.is_leaf and p.grad_fn is None and type(p) is nn.Parameter


def test_nodes_are_labelled_with_their_layer():
    model = mlp()
    x = tt.randn(2, 4, requires_grad=True)
    out = model(x)
    assert out.grad_fn.module is model[2]
    relu_node = out.grad_fn.next_functions[0][0]
    assert relu_node.module is model[1]
    assert relu_node.next_functions[0][0].module is model[0]
    hidden = model[0](x)
    assert nn.Identity()(hidden).grad_fn.module is model[0]  # Identity returns its input: no relabelling


# Containers

@pytest.mark.parametrize("make, inputs", [
    (mlp, (torch.randn(3, 4),)),
    (lambda: nn.Sequential(nn.Flatten(), nn.Linear(6, 2), nn.Unflatten(1, (2, 1))), (torch.randn(3, 2, 3),)),
    (lambda: nn.Sequential(nn.Identity(), nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 1)), (torch.randn(3, 4),)),
])
def test_containers_match_torch_autograd(make, inputs):
    model = make()
    check_op(lambda p, *xs: functional_call(model, p, xs), dict(model.named_parameters()), *inputs)


def test_module_list_and_dict_register_parameters():
    layers = nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 3)])
    table = nn.ModuleDict({"a": nn.Linear(3, 1), "b": nn.ReLU()})
    assert len(list(layers.parameters())) == 4 and len(list(table.parameters())) == 2
    assert_tracer_parameters(layers)
    assert_tracer_parameters(table)
    out = table["a"](layers[1](layers[0](tt.randn(5, 2))))
    out.sum().backward()
    assert all(p.grad is not None for p in [*layers.parameters(), *table.parameters()])


def test_sequential_slicing_keeps_our_class():
    model = mlp()
    assert type(model[:2]) is nn.Sequential and model[0] is model[:2][0]


# Printing

class Conv2d(nn.Module, torch.nn.Conv2d):
    """A stand-in for the conv layer: a layer only defines original_repr() to print the original way."""

    def original_repr(self) -> str:
        return f"Conv2d {self.in_channels} -> {self.out_channels}"


class MyConv(nn.Model):
    """Snippet C of the original README: attributes first, then super().__init__(), and construct()."""

    def __init__(self):
        self.conv = nn.Sequential(
            Conv2d(3, 8, kernel_size=8, stride=4), nn.ReLU(),
            Conv2d(8, 4, kernel_size=4, stride=2), nn.ReLU(),
            Conv2d(4, 2, kernel_size=3, stride=1), nn.ReLU(),
        )
        self.fc = nn.Linear(7 * 7 * 2, 1)
        super(MyConv, self).__init__()

    def construct(self):
        ops = [self.conv, self.fc]
        return ops

    def forward(self, x):
        x = self.conv(x)
        x = x.View(x.shape[0], -1)
        return self.fc(x)


SNIPPET_C = ORIGINAL_SNIPPET_C_MODEL


def test_snippet_c_model_prints_like_the_original():
    model = MyConv()
    assert repr(model) == SNIPPET_C
    assert str(model) == SNIPPET_C
    assert [name for name, _ in model.named_parameters()][-2:] == ["fc.weight", "fc.bias"]
    assert_tracer_parameters(model)


def test_sequential_prints_like_the_original():
    assert repr(nn.Sequential(nn.Linear(8, 256), nn.ReLU(), nn.Linear(256, 4))).splitlines() == [
        "Sequence(", "    (0):Linear layer (8 X 256)", "    (1):ReLU()", "    (2):Linear layer (256 X 4)", ")",
    ]


@pytest.mark.parametrize("ours, theirs", [
    (lambda: nn.Linear(2, 3), lambda: torch.nn.Linear(2, 3)),
    (lambda: nn.ModuleList([nn.Linear(2, 3), nn.ReLU()]), lambda: torch.nn.ModuleList([torch.nn.Linear(2, 3),
                                                                                       torch.nn.ReLU()])),
    (lambda: nn.Sequential(nn.Linear(2, 3), torch.nn.ReLU()), lambda: torch.nn.Sequential(torch.nn.Linear(2, 3),
                                                                                          torch.nn.ReLU())),
    (lambda: nn.Sequential(nn.ModuleList([nn.ReLU()])), lambda: torch.nn.Sequential(torch.nn.ModuleList([
        torch.nn.ReLU()]))),
])
def test_other_modules_print_as_torch_does(ours, theirs):
    assert repr(ours()) == repr(theirs())


def test_plain_module_prints_as_torch_does():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(2, 3)

    class TorchNet(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(2, 3)

    assert repr(Net()).replace("Net", "TorchNet", 1) == repr(TorchNet())
    assert Net().original_repr() is None


# Model

def test_model_construct_runs_the_layers_in_order():
    class Net(nn.Model):
        def __init__(self):
            super().__init__()
            self.first = nn.Linear(3, 4)
            self.act = nn.Tanh()
            self.last = nn.Linear(4, 1)

        def construct(self):
            return [self.first, self.act, self.last]

    net = Net()
    assert repr(net).splitlines() == [
        "Sequence(", "    (0):Linear layer (3 X 4)", "    (1):Tanh()", "    (2):Linear layer (4 X 1)", ")",
    ]
    x = torch.randn(5, 3)
    torch.testing.assert_close(plain(net(tt.tracer(x))), plain(net.last(net.act(net.first(tt.tracer(x))))))
    check_op(lambda p, x: functional_call(net, p, (x,)), dict(net.named_parameters()), x)


def test_model_without_construct_lists_its_layers_and_needs_forward():
    class Net(nn.Model):
        def __init__(self, width):
            self.body = nn.Linear(2, width)
            super().__init__()

    net = Net(3)
    assert repr(net).splitlines() == ["Sequence(", "    (0):Linear layer (2 X 3)", ")"]
    with pytest.raises(NotImplementedError, match="neither forward"):
        net(tt.randn(1, 2))


def test_model_state_dict_and_deepcopy():
    model = MyConv()
    clone = copy.deepcopy(model)
    assert repr(clone) == SNIPPET_C
    assert_tracer_parameters(clone)
    assert list(clone.state_dict()) == list(model.state_dict())


# Snippet B of the original README

def test_snippet_b_trains():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(8, 256),
        nn.ReLU(),
        nn.Linear(256, 128),
        nn.ReLU(),
        nn.Linear(128, 64),
        nn.ReLU(),
        nn.Linear(64, 4),
    )
    assert str(model).startswith("Sequence(\n    (0):Linear layer (8 X 256)\n    (1):ReLU()")
    optimizer = torch.optim.RMSprop(model.parameters(), lr=5e-4)
    mse = nn.MSE()
    x = torch.rand(16, 8).float()
    target = torch.rand(16, 1)
    losses = []
    for _ in range(10):
        out = model(x)
        _, action = out.max(1)
        out = out.Gather(action)
        loss = mse(out, target)
        losses.append(loss.item())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert losses[-1] < losses[0]
    assert_tracer_parameters(model)
