"""tt.port: ordinary torch models, ported in place, train with torchtrace's gradients exactly as torch's.

Each model is built in plain torch after a seed and deep-copied; one copy is ported, the other (the twin) stays
under torch autograd. Both run the same float64 batch: outputs, every parameter gradient and buffer agree, and
20 optimizer steps (tt.optim on the ported model, torch.optim on the twin) keep the parameters together.
The models here (LeNet, GPT) are also the ones bench/models.py times.
"""
import copy
import inspect
import io
import math
import pickle
from typing import Any, Callable, Dict, Tuple

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torchtrace as tt
from torchtrace.nn.module import Parameter
from torchtrace.port import port
from torchtrace.tracer import tracer

ATOL = 1e-8


# ----------------------------------------------------------------------------------------------- the models
class MLP(nn.Module):
    def __init__(self, sizes: Tuple[int, ...] = (6, 16, 16, 3)):
        super().__init__()
        layers = []
        for i, (fan_in, fan_out) in enumerate(zip(sizes, sizes[1:])):
            layers += [nn.Linear(fan_in, fan_out)] + ([nn.Tanh() if i % 2 else nn.ReLU()] if i < len(sizes) - 2 else [])
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class LeNet(nn.Module):
    """LeNet-5 on 1x28x28 images: conv 5x5 (pad 2) - relu - maxpool - conv 5x5 - relu - maxpool - 3 linear."""

    def __init__(self, classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Linear(16 * 5 * 5, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


class BasicBlock(nn.Module):
    """ResNet basic block: conv3x3-BN-ReLU-conv3x3-BN plus a (strided 1x1 conv + BN) shortcut, then ReLU."""

    def __init__(self, channels_in: int, channels: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(channels_in, channels, 3, stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.shortcut = nn.Sequential()
        if stride != 1 or channels_in != channels:
            self.shortcut = nn.Sequential(nn.Conv2d(channels_in, channels, 1, stride, bias=False),
                                          nn.BatchNorm2d(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class TinyResNet(nn.Module):
    def __init__(self, classes: int = 5):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4), nn.ReLU())
        self.blocks = nn.Sequential(BasicBlock(4, 4), BasicBlock(4, 8, stride=2))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.pool(self.blocks(self.stem(x))).flatten(1))


class CharRNN(nn.Module):
    """Character model: embedding - 2-layer LSTM (or GRU / RNN) - linear to the vocabulary."""

    def __init__(self, vocab: int = 20, embed: int = 8, hidden: int = 16, cell: type = nn.LSTM):
        super().__init__()
        self.embed = nn.Embedding(vocab, embed)
        self.rnn = cell(embed, hidden, num_layers=2, batch_first=True)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(self.embed(tokens))
        return self.head(out)


class CausalSelfAttention(nn.Module):
    """q, k, v projections, scores masked_fill(future, -inf), softmax, dropout, weighted sum, output projection."""

    def __init__(self, d: int, heads: int, length: int):
        super().__init__()
        self.heads = heads
        self.query, self.key, self.value, self.proj = (nn.Linear(d, d) for _ in range(4))
        self.drop = nn.Dropout(0.0)
        self.register_buffer("future", torch.ones(length, length, dtype=torch.bool).triu(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, d = x.size()
        q, k, v = (f(x).view(batch, length, self.heads, d // self.heads).transpose(1, 2)
                   for f in (self.query, self.key, self.value))
        scores = q @ k.transpose(-2, -1) / math.sqrt(d // self.heads)
        scores = scores.masked_fill(self.future[:length, :length], float("-inf"))
        weights = self.drop(F.softmax(scores, dim=-1))
        y = (weights @ v).transpose(1, 2).contiguous().view(batch, length, d)
        return self.proj(y)


class TorchAttention(nn.Module):
    """The same causal self-attention through nn.MultiheadAttention (which tt.port swaps)."""

    def __init__(self, d: int, heads: int, length: int):
        super().__init__()
        self.attn = nn.MultiheadAttention(d, heads, dropout=0.0, batch_first=True)
        self.register_buffer("future", torch.ones(length, length, dtype=torch.bool).triu(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        length = x.size(1)
        return self.attn(x, x, x, attn_mask=self.future[:length, :length], need_weights=False)[0]


class Block(nn.Module):
    def __init__(self, d: int, heads: int, length: int, attention: type):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = attention(d, heads, length)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d), nn.Dropout(0.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Token + position embeddings, pre-norm transformer blocks, final LayerNorm, lm head tied to the embedding."""

    def __init__(self, vocab: int = 20, d: int = 16, heads: int = 2, length: int = 8, layers: int = 2,
                 attention: type = CausalSelfAttention):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(length, d)
        self.blocks = nn.ModuleList(Block(d, heads, length, attention) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.tok.weight  # weight tying

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok(tokens) + self.pos(torch.arange(tokens.size(1), device=tokens.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def sequence_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


# ------------------------------------------------------------------------------------------------- harness
def twins(build: Callable[[], nn.Module], seed: int = 0, device: str = "cpu") -> Tuple[nn.Module, nn.Module]:
    """(ported model, its un-ported torch twin), float64, identical weights, on `device`."""
    torch.manual_seed(seed)
    model = build().double().to(device)
    twin = copy.deepcopy(model)
    return port(model), twin


def plain(t: torch.Tensor) -> torch.Tensor:
    with torch._C.DisableTorchFunctionSubclass():
        return t.as_subclass(torch.Tensor)


def assert_same_state(model: nn.Module, twin: nn.Module, atol: float = ATOL) -> None:
    """Every parameter and buffer (BatchNorm's running stats included) equal to the twin's."""
    ours, theirs = model.state_dict(), twin.state_dict()
    assert list(ours) == list(theirs)
    for name in theirs:
        torch.testing.assert_close(ours[name], theirs[name], rtol=0, atol=atol, msg=name)


def assert_same_grads(model: nn.Module, twin: nn.Module, atol: float = 1e-10) -> None:
    ours, theirs = dict(model.named_parameters()), dict(twin.named_parameters())
    assert list(ours) == list(theirs)
    for name, p in theirs.items():
        assert ours[name].grad is not None, f"{name} got no gradient"
        torch.testing.assert_close(plain(ours[name].grad), p.grad, rtol=1e-7, atol=atol, msg=name)


def batch(kind: str, seed: int = 1, device: str = "cpu") -> Tuple[torch.Tensor, torch.Tensor, Callable]:
    """(input, target, loss) for a model kind, float64, on `device`."""
    g = torch.Generator().manual_seed(seed)
    if kind == "tokens":
        tokens = torch.randint(0, 20, (3, 9), generator=g)
        return tokens[:, :-1].to(device), tokens[:, 1:].to(device), sequence_loss
    shapes = {"vector": (5, 6), "mnist": (4, 1, 28, 28), "image": (4, 3, 8, 8)}
    classes = {"vector": 3, "mnist": 10, "image": 5}[kind]
    x = torch.randn(shapes[kind], generator=g, dtype=torch.float64)
    return x.to(device), torch.randint(0, classes, (shapes[kind][0],), generator=g).to(device), F.cross_entropy


MODELS: Dict[str, Tuple[Callable[[], nn.Module], str]] = {
    "mlp": (MLP, "vector"),
    "lenet": (LeNet, "mnist"),
    "resnet-block": (TinyResNet, "image"),
    "char-lstm": (CharRNN, "tokens"),
    "char-gru": (lambda: CharRNN(cell=nn.GRU), "tokens"),
    "char-rnn": (lambda: CharRNN(cell=nn.RNN), "tokens"),
    "gpt": (GPT, "tokens"),
    "gpt-multihead-attention": (lambda: GPT(attention=TorchAttention), "tokens"),
}


# ---------------------------------------------------------------------------------------- models vs torch
def check_model(name: str, device: str = "cpu") -> None:
    """Output, every parameter gradient and buffer of model `name` equal to its torch twin's, on `device`."""
    build, kind = MODELS[name]
    model, twin = twins(build, device=device)
    x, target, loss_fn = batch(kind, device=device)
    ours, theirs = model(x), twin(x)
    assert isinstance(ours, tracer) and ours.grad_fn is not None and ours.device == x.device
    torch.testing.assert_close(plain(ours), theirs.detach(), rtol=1e-10, atol=1e-12)
    loss_fn(ours, target).backward()
    loss_fn(theirs, target).backward()
    assert_same_grads(model, twin)
    assert_same_state(model, twin)  # BatchNorm's running stats took the same in-place update


def check_adam_steps(name: str, device: str = "cpu", atol: float = ATOL) -> None:
    """Twenty Adam steps (tt.optim on the ported model, torch.optim on the twin) keep the two together."""
    build, kind = MODELS[name]
    model, twin = twins(build, device=device)
    ours, theirs = tt.optim.Adam(model.parameters(), lr=1e-2), torch.optim.Adam(twin.parameters(), lr=1e-2)
    for step in range(20):
        x, target, loss_fn = batch(kind, seed=step, device=device)
        for net, optimizer in ((model, ours), (twin, theirs)):
            optimizer.zero_grad()
            loss_fn(net(x), target).backward()
            optimizer.step()
    assert_same_state(model, twin, atol)
    model.eval(), twin.eval()  # BatchNorm now normalizes with the running stats both sides accumulated
    x, _, _ = batch(kind, seed=99, device=device)
    torch.testing.assert_close(plain(model(x)), twin(x).detach(), rtol=1e-7, atol=atol)


@pytest.mark.parametrize("name", MODELS)
def test_forward_and_every_parameter_gradient_match_torch(name):
    check_model(name)


@pytest.mark.parametrize("name", MODELS)
def test_twenty_adam_steps_track_torch(name):
    check_adam_steps(name)


def test_gpt_weight_tying_survives_port_and_training():
    model, twin = twins(GPT)
    assert model.head.weight is model.tok.weight and isinstance(model.tok.weight, Parameter)
    assert len(list(model.parameters())) == len(list(twin.parameters()))
    optimizer = tt.optim.Adam(model.parameters(), lr=1e-2)
    x, target, loss_fn = batch("tokens")
    loss_fn(model(x), target).backward()
    optimizer.step()
    assert model.head.weight is model.tok.weight


# ------------------------------------------------------------------------------------ what port changes
def test_port_returns_the_module_with_tracer_parameters_and_buffers():
    model, _ = twins(TinyResNet)
    assert port(model) is model
    for name, p in model.named_parameters():
        assert type(p) is Parameter and p.requires_grad and p.is_leaf, name
        with torch._C.DisableTorchFunctionSubclass():
            assert not torch._C.TensorBase.requires_grad.__get__(p), f"{name}: torch's own autograd is on"
    buffers = dict(model.named_buffers())
    assert buffers and all(isinstance(b, tracer) and not b.requires_grad for b in buffers.values())
    assert buffers["stem.1.num_batches_tracked"].dtype == torch.int64


def test_port_shares_storage_and_keeps_frozen_parameters_frozen():
    torch.manual_seed(0)
    model = MLP()
    original = model.net[0].weight
    model.net[2].weight.requires_grad_(False)
    port(model)
    assert model.net[0].weight.data_ptr() == original.data_ptr()
    assert not model.net[2].weight.requires_grad
    model(torch.randn(2, 6)).sum().backward()
    assert model.net[0].weight.grad is not None and model.net[2].weight.grad is None


def test_a_gradient_torch_accumulated_before_port_is_kept():
    torch.manual_seed(0)
    model = MLP().double()
    x, target, loss_fn = batch("vector")
    loss_fn(model(x), target).backward()
    before = {name: p.grad.clone() for name, p in model.named_parameters()}
    port(model)
    loss_fn(model(x), target).backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(plain(p.grad), 2 * before[name], msg=name)


def test_input_gradients_of_a_ported_model_match_torch():
    """A saliency map: the gradient of the loss with respect to the input image."""
    model, twin = twins(LeNet)
    x, target, loss_fn = batch("mnist")
    ours, theirs = tt.tracer(x, requires_grad=True), x.clone().requires_grad_(True)
    loss_fn(model(ours), target).backward()
    loss_fn(twin(theirs), target).backward()
    torch.testing.assert_close(plain(ours.grad), theirs.grad, rtol=1e-7, atol=1e-12)


def test_port_twice_changes_nothing():
    model, _ = twins(lambda: CharRNN(cell=nn.LSTM))
    params, buffers, cls = list(model.parameters()), list(model.buffers()), type(model.rnn)
    port(model)
    assert all(a is b for a, b in zip(params, model.parameters()))
    assert all(a is b for a, b in zip(buffers, model.buffers())) and type(model.rnn) is cls
    assert len(model.rnn._state_dict_hooks) == 1


def test_port_refuses_what_is_not_a_module():
    with pytest.raises(TypeError, match="expects a torch.nn.Module"):
        port(torch.zeros(3))


def test_a_lazy_module_is_ported_after_its_first_forward():
    model = nn.Sequential(nn.LazyLinear(3), nn.ReLU())
    with pytest.raises(RuntimeError, match="0.weight of this lazy module has no shape yet"):
        port(model)
    model(torch.randn(2, 4))
    port(model)(torch.randn(2, 4)).sum().backward()
    assert model[0].weight.grad.shape == (3, 4)


@pytest.mark.parametrize("layer, replacement", [
    (lambda: nn.LSTM(4, 5), tt.nn.LSTM), (lambda: nn.GRU(4, 5), tt.nn.GRU), (lambda: nn.RNN(4, 5), tt.nn.RNN),
    (lambda: nn.LSTMCell(4, 5), tt.nn.LSTMCell), (lambda: nn.GRUCell(4, 5), tt.nn.GRUCell),
    (lambda: nn.RNNCell(4, 5), tt.nn.RNNCell), (lambda: nn.MultiheadAttention(4, 2), tt.nn.MultiheadAttention),
])
def test_swapped_layers_keep_their_names_and_state_dict(layer, replacement):
    model, twin = twins(layer)
    assert type(model) is replacement and isinstance(model, type(twin))
    assert list(model.state_dict()) == list(twin.state_dict())
    assert repr(model) == repr(twin)


class ScaledLSTM(nn.LSTM):
    """A user's subclass of a swapped layer, with its own forward."""

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
        out, state = super().forward(x)
        return 2 * out, state


@pytest.mark.parametrize("duplicate", [lambda m: m, copy.deepcopy, lambda m: pickle.loads(pickle.dumps(m))])
def test_a_user_subclass_of_a_swapped_layer_keeps_its_own_forward(duplicate):
    model, twin = twins(lambda: ScaledLSTM(3, 4, batch_first=True))
    model = duplicate(model)
    assert isinstance(model, ScaledLSTM) and isinstance(model, tt.nn.LSTM)
    assert type(model).__name__ == "ScaledLSTM" and isinstance(model.weight_ih_l0, Parameter)
    x = torch.randn(2, 5, 3, dtype=torch.float64)
    ours, theirs = model(x)[0], twin(x)[0]
    torch.testing.assert_close(plain(ours), theirs.detach())
    ours.sum().backward(), theirs.sum().backward()
    assert_same_grads(model, twin)


# ---------------------------------------------------------------------------------------------- state_dict
def test_state_dict_is_plain_and_loads_into_an_unported_twin():
    model, _ = twins(TinyResNet)
    with torch.no_grad():
        model.fc.weight += 1.0
        model.stem[1].running_mean += 2.0
    state = model.state_dict()
    assert all(type(v) is torch.Tensor for v in state.values())
    torch.manual_seed(5)
    fresh = TinyResNet().double()
    fresh.load_state_dict(state)
    assert_same_state(model, fresh, atol=0)
    kept = model.state_dict(keep_vars=True)
    assert kept["fc.weight"] is model.fc.weight and kept["stem.1.running_mean"] is model.stem[1].running_mean


def test_load_state_dict_into_a_ported_model_keeps_the_tracers():
    model, twin = twins(GPT)
    with torch.no_grad():
        for p in twin.parameters():
            p.mul_(0.5)
    weight = model.tok.weight
    model.load_state_dict(twin.state_dict())
    assert model.tok.weight is weight and model.head.weight is weight and isinstance(weight, Parameter)
    assert_same_state(model, twin, atol=0)


def test_whole_model_torch_save_and_load():
    model, twin = twins(GPT)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    assert loaded.head.weight is loaded.tok.weight and isinstance(loaded.tok.weight, Parameter)
    x, target, loss_fn = batch("tokens")
    loss_fn(loaded(x), target).backward()
    loss_fn(twin(x), target).backward()
    assert_same_grads(loaded, twin)


def test_deepcopy_of_a_ported_model_is_an_independent_ported_model():
    model, _ = twins(GPT)
    clone = copy.deepcopy(model)
    assert clone.head.weight is clone.tok.weight and clone.tok.weight is not model.tok.weight
    assert isinstance(clone.tok.weight, Parameter) and clone.tok.weight.requires_grad
    x, target, loss_fn = batch("tokens")
    loss_fn(clone(x), target).backward()
    assert clone.tok.weight.grad is not None and model.tok.weight.grad is None


# --------------------------------------------------------------------------------- torch training idioms
def test_manual_sgd_idiom_and_torch_optim_zero_grad():
    """`with torch.no_grad(): p -= lr * p.grad` and torch.optim's zero_grad(), on ported parameters."""
    model, twin = twins(LeNet)
    ours, theirs = torch.optim.SGD(model.parameters(), lr=0.1), torch.optim.SGD(twin.parameters(), lr=0.1)
    for step in range(3):
        x, target, loss_fn = batch("mnist", seed=step)
        for net, optimizer in ((model, ours), (twin, theirs)):
            optimizer.zero_grad()
            loss_fn(net(x), target).backward()
            with torch.no_grad():
                for p in net.parameters():
                    p -= 0.05 * p.grad
    assert all(p.grad is not None for p in model.parameters())
    ours.zero_grad()
    assert all(p.grad is None for p in model.parameters())
    assert_same_state(model, twin)
    assert all(type(p) is Parameter for p in model.parameters())


@pytest.mark.parametrize("optimizer", [
    lambda params: torch.optim.Adam(params, lr=1e-2), lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9),
    lambda params: torch.optim.AdamW(params, lr=1e-2),
])
def test_torch_optimizers_step_ported_parameters(optimizer):
    model, twin = twins(TinyResNet)
    ours, theirs = optimizer(model.parameters()), optimizer(twin.parameters())
    for step in range(5):
        x, target, loss_fn = batch("image", seed=step)
        for net, opt in ((model, ours), (twin, theirs)):
            opt.zero_grad(set_to_none=False)
            loss_fn(net(x), target).backward()
            nn.utils.clip_grad_norm_(net.parameters(), 1.0)
            opt.step()
    assert_same_state(model, twin)


def test_module_zero_grad_and_dtype_conversion_after_port():
    model, twin = twins(MLP)
    x, target, loss_fn = batch("vector")
    loss_fn(model(x), target).backward()
    model.zero_grad()
    assert all(p.grad is None for p in model.parameters())
    model.float()
    assert all(type(p) is Parameter and p.dtype == torch.float32 for p in model.parameters())
    loss_fn(model(x.float()), target).backward()
    twin.float()
    loss_fn(twin(x.float()), target).backward()
    assert_same_grads(model, twin, atol=1e-6)


# ------------------------------------------------------------------------------------- common torch layers
def randn(*shape: int) -> torch.Tensor:
    return torch.randn(shape, dtype=torch.float64)


PADDING = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
LAYERS = {  # name: (build, inputs() -> (args, kwargs))
    "Conv1d": (lambda: nn.Conv1d(3, 4, 3, padding=1), lambda: ((randn(2, 3, 7),), {})),
    "Conv2d-reflect": (lambda: nn.Conv2d(3, 4, 3, stride=2, padding=1, padding_mode="reflect"),
                       lambda: ((randn(2, 3, 7, 7),), {})),
    "ConvTranspose2d": (lambda: nn.ConvTranspose2d(3, 2, 3, stride=2), lambda: ((randn(2, 3, 4, 4),), {})),
    "BatchNorm1d": (lambda: nn.BatchNorm1d(3), lambda: ((randn(5, 3),), {})),
    "BatchNorm2d-eval": (lambda: nn.BatchNorm2d(3).eval(), lambda: ((randn(2, 3, 4, 4),), {})),
    "GroupNorm": (lambda: nn.GroupNorm(2, 4), lambda: ((randn(2, 4, 5),), {})),
    "InstanceNorm2d": (lambda: nn.InstanceNorm2d(3, affine=True), lambda: ((randn(2, 3, 4, 4),), {})),
    "LayerNorm": (lambda: nn.LayerNorm(5), lambda: ((randn(2, 3, 5),), {})),
    "Embedding": (lambda: nn.Embedding(7, 4, padding_idx=0), lambda: ((torch.tensor([[0, 3, 6], [2, 0, 3]]),), {})),
    "AvgPool2d": (lambda: nn.Sequential(nn.Conv2d(2, 2, 1), nn.AvgPool2d(2)), lambda: ((randn(2, 2, 6, 6),), {})),
    "AdaptiveMaxPool2d": (lambda: nn.Sequential(nn.Conv2d(2, 2, 1), nn.AdaptiveMaxPool2d(2)),
                          lambda: ((randn(2, 2, 6, 6),), {})),
    "activations": (lambda: nn.Sequential(nn.Linear(4, 4), nn.SiLU(), nn.Linear(4, 4), nn.ELU(), nn.Linear(4, 4),
                                          nn.Softplus(), nn.Linear(4, 4), nn.LeakyReLU(), nn.LogSoftmax(-1)),
                    lambda: ((randn(3, 4),), {})),
    "Dropout": (lambda: nn.Sequential(nn.Linear(4, 6), nn.Dropout(0.3), nn.Linear(6, 2)), lambda: ((randn(5, 4),), {})),
    "bidirectional-GRU-dropout": (lambda: nn.GRU(4, 3, num_layers=2, bidirectional=True, dropout=0.3),
                                  lambda: ((randn(5, 2, 4),), {})),
    "LSTM-proj-with-state": (lambda: nn.LSTM(4, 3, proj_size=2, batch_first=True),
                             lambda: ((randn(2, 5, 4), (randn(1, 2, 2), randn(1, 2, 3))), {})),
    "LSTMCell": (lambda: nn.LSTMCell(4, 3), lambda: ((randn(2, 4),), {})),
    "MultiheadAttention-kdim-padding": (lambda: nn.MultiheadAttention(8, 2, kdim=3, vdim=5, dropout=0.2),
                                        lambda: ((randn(4, 2, 8), randn(5, 2, 3), randn(5, 2, 5)),
                                                 {"key_padding_mask": PADDING})),
    "TransformerEncoderLayer-dropout": (lambda: nn.TransformerEncoderLayer(8, 2, 16, dropout=0.2, batch_first=True),
                                        lambda: ((randn(2, 3, 8),), {})),
    "TransformerEncoder-norm-first-gelu": (lambda: nn.TransformerEncoder(nn.TransformerEncoderLayer(
        8, 2, 16, dropout=0.0, activation="gelu", norm_first=True), 2, enable_nested_tensor=False),
        lambda: ((randn(3, 2, 8),), {"mask": nn.Transformer.generate_square_subsequent_mask(3, dtype=torch.float64),
                                     "is_causal": True})),
    "TransformerEncoder-eval-padding": (lambda: nn.TransformerEncoder(nn.TransformerEncoderLayer(
        8, 2, 16, batch_first=True), 2).eval(), lambda: ((randn(2, 5, 8),), {"src_key_padding_mask": PADDING})),
    "TransformerDecoderLayer": (lambda: nn.TransformerDecoderLayer(8, 2, 16, dropout=0.0),
                                lambda: ((randn(3, 2, 8), randn(4, 2, 8)), {})),
}


def on_device(tree: Any, device: str) -> Any:
    """Every tensor of nested tuples, lists and dicts moved to `device`."""
    if isinstance(tree, torch.Tensor):
        return tree.to(device)
    if isinstance(tree, (tuple, list)):
        return type(tree)(on_device(t, device) for t in tree)
    if isinstance(tree, dict):
        return {k: on_device(v, device) for k, v in tree.items()}
    return tree


def check_layer(name: str, device: str = "cpu") -> None:
    """Output, parameter gradients and buffers of layer `name` equal to torch's; train-mode dropout draws torch's
    mask (the same generator, the same calls)."""
    build, inputs = LAYERS[name]
    model, twin = twins(build, device=device)
    args, kwargs = on_device(inputs(), device)
    outputs = []
    for net in (model, twin):
        torch.manual_seed(7)
        out = net(*args, **kwargs)
        outputs.append(out[0] if isinstance(out, tuple) else out)
    ours, theirs = outputs
    torch.testing.assert_close(plain(ours), theirs.detach(), rtol=1e-10, atol=1e-12)
    weights = torch.linspace(-1, 1, theirs.numel(), dtype=torch.float64, device=device).reshape(theirs.shape)
    (ours * weights).sum().backward()
    (theirs * weights).sum().backward()
    assert_same_grads(model, twin)
    assert_same_state(model, twin)


@pytest.mark.parametrize("name", LAYERS)
def test_common_torch_layers_differentiate_like_torch(name):
    check_layer(name)


def test_a_ported_model_names_its_layers_in_the_trace(capsys):
    model = port(nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 1)))
    forward = model[0].forward
    port(model)  # the module stack's forward is installed once
    model(torch.randn(2, 4)).sum().backward(show=True)
    lines = capsys.readouterr().out.splitlines()
    assert lines[1:5] == ["↘︎ Sum()", "↘︎ Linear(in_features=3, out_features=1, bias=True)", "↘︎ ReLU()",
                          "↘︎ Linear(in_features=4, out_features=3, bias=True)"]
    assert model[0].forward is forward and not model[0]._forward_pre_hooks and not model[0]._forward_hooks
    assert list(inspect.signature(model[0].forward).parameters) == ["input"]


def test_copies_of_a_ported_model_run_their_own_forward():
    torch.manual_seed(0)
    model = port(nn.Sequential(nn.Linear(3, 2), nn.Tanh()))
    x = torch.randn(4, 3)
    before = plain(model(x))
    for copied in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):  # parameters of their own
        with torch.no_grad():
            copied[0].weight.mul_(2.0)
        y = copied(x)
        assert y.grad_fn.module_path == (copied, copied[1])
        assert y.grad_fn.edges[0].node.module_path == (copied, copied[0])
        torch.testing.assert_close(plain(y), torch.tanh(F.linear(x, plain(copied[0].weight), plain(copied[0].bias))))
        torch.testing.assert_close(plain(model(x)), before)
    shallow = port(copy.copy(model))  # copy.copy shares the layers (and their parameters) with the original
    assert shallow(x).grad_fn.module_path == (shallow, model[1])


def test_an_optimizer_created_before_port_updates_the_model_as_torch():
    torch.manual_seed(0)
    model = MLP().double()
    twin = copy.deepcopy(model)
    params_before = list(model.parameters())
    opt, twin_opt = torch.optim.Adam(model.parameters(), lr=0.01), torch.optim.Adam(twin.parameters(), lr=0.01)
    port(model)
    assert all(p is q for p, q in zip(model.parameters(), params_before))
    x = torch.randn(5, 6, dtype=torch.float64)
    for _ in range(3):
        for m, o in ((model, opt), (twin, twin_opt)):
            o.zero_grad()
            m(x).pow(2).sum().backward()
            o.step()
    for p, q in zip(model.parameters(), twin.parameters()):
        assert isinstance(p, tracer)
        torch.testing.assert_close(p.detach().as_subclass(torch.Tensor), q.detach(), atol=ATOL, rtol=0)


def test_port_keeps_a_gradient_torch_already_accumulated():
    model = nn.Linear(2, 1)
    model(torch.ones(1, 2)).sum().backward()
    before = model.weight.grad.clone()
    port(model)
    torch.testing.assert_close(model.weight.grad, before)
    assert not torch.Tensor.requires_grad.__get__(model.weight)


PLAIN_INPUT_MODELS = {
    "lstm_2_layers": (lambda: nn.LSTM(4, 5, num_layers=2, batch_first=True), lambda m, x: m(x)[0]),
    "gru_bidirectional": (lambda: nn.GRU(4, 5, bidirectional=True), lambda m, x: m(x)[0]),
    "rnn": (lambda: nn.RNN(4, 5), lambda m, x: m(x)[0]),
    "multihead_attention": (lambda: nn.MultiheadAttention(4, 2, batch_first=True), lambda m, x: m(x, x, x)[0]),
    "transformer_encoder_layer": (lambda: nn.TransformerEncoderLayer(4, 2, 8, dropout=0.0, batch_first=True),
                                  lambda m, x: m(x)),
}


@pytest.mark.parametrize("name", sorted(PLAIN_INPUT_MODELS))
def test_a_plain_input_requiring_grad_gets_its_grad_from_a_ported_model_as_torch(name):
    build, call = PLAIN_INPUT_MODELS[name]
    torch.manual_seed(0)
    model = build().double()
    twin = copy.deepcopy(model)
    port(model)
    x = torch.randn(2, 3, 4, dtype=torch.float64)
    ours, theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
    call(model, ours).pow(2).sum().backward()
    call(twin, theirs).pow(2).sum().backward()
    torch.testing.assert_close(ours.grad, theirs.grad, atol=ATOL, rtol=1e-7)
    for p, q in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=ATOL, rtol=1e-7)
    direction, eps = torch.randn_like(x), 1e-6
    with torch.no_grad():
        loss_at = [call(twin, x + step * direction).pow(2).sum() for step in (eps, -eps)]
    slope = (loss_at[0] - loss_at[1]) / (2 * eps)
    torch.testing.assert_close((ours.grad * direction).sum(), slope, atol=1e-6, rtol=1e-6)


def test_loading_with_assign_keeps_a_ported_model_on_torchtraces_gradients():
    """load_state_dict(..., assign=True) puts the loaded tensors themselves in place: a ported module got plain
    torch.nn.Parameters and trained on torch's autograd. Its parameters and buffers are tracers again, the gradients
    equal torch autograd's on the loaded twin, and a model whose state_dict(keep_vars=True) was loaded stays torch's."""
    torch.manual_seed(0)

    def make():
        return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 1)).double()

    source, other = make(), make()
    twin = copy.deepcopy(source)
    model = tt.port(make())
    model.load_state_dict(source.state_dict(), assign=True)
    assert all(isinstance(t, tt.tracer) for t in (*model.parameters(), *model.buffers()))
    x = torch.randn(5, 3, dtype=torch.float64)
    model(x).pow(2).sum().backward()
    twin(x).pow(2).sum().backward()
    for ours, theirs in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(ours.grad.as_subclass(torch.Tensor), theirs.grad)
    torch.testing.assert_close(model[1].running_mean.as_subclass(torch.Tensor), twin[1].running_mean)
    tt.port(make()).load_state_dict(other.state_dict(keep_vars=True), assign=True)
    assert type(other[0].weight) is torch.nn.Parameter
