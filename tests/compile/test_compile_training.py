"""Real models trained compiled: gradients and parameters equal eager torchtrace's over several optimizer steps.

The ported models of tests/test_port.py, a seq2seq model with attention and greedy decoding, a GAN step with
`fake.detach()` and a DQN step with a target network. The compiled and the eager side start from the same
weights, see the same batches and take their own optimizer steps; every step's loss and gradients must agree.
"""
import copy
import warnings

import pytest
import torch
import torch.nn.functional as F
from test_port import MODELS, batch, plain, twins
from torch import nn

import torchtrace as tt
from torchtrace.port import port

STEPS = 4


def assert_trains_like_eager(model, loss_of, batches, lr=1e-2):
    """Train `model` and a copy for len(batches) steps, one compiled and one eager; compare every step."""
    compiled_model, eager_model = model, copy.deepcopy(model)
    compiled = tt.compile(lambda *b: loss_of(compiled_model, *b), batches[0])
    compiled_model.load_state_dict(eager_model.state_dict())  # the tracing call moved running statistics
    sides = []
    for m, fn in ((compiled_model, compiled), (eager_model, lambda *b: loss_of(eager_model, *b))):
        sides.append((list(m.parameters()), tt.optim.Adam(m.parameters(), lr=lr), fn))
    for step, b in enumerate(batches):
        grads = []
        for params, optimizer, fn in sides:
            optimizer.zero_grad()
            torch.manual_seed(step)
            loss = fn(*b)
            loss.backward()
            grads.append([None if p.grad is None else plain(p.grad).clone() for p in params])
            optimizer.step()
            if fn is compiled and step:  # the first call records the program; later ones replay it
                assert loss._tt_node.name == "CompiledCallBackward"  # grad_fn is its statement's node
        for ours, eager in zip(*grads):
            assert (ours is None) == (eager is None)
            if ours is not None:
                torch.testing.assert_close(ours, eager, rtol=1e-12, atol=1e-15)  # sums in another order
    for a, b in zip(compiled_model.state_dict().values(), eager_model.state_dict().values()):
        torch.testing.assert_close(plain(a), plain(b), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_ported_models_train_compiled_as_eager(name):
    build, kind = MODELS[name]
    model, _ = twins(build)
    batches = [batch(kind, seed=s)[:2] for s in range(STEPS)]
    loss_fn = batch(kind)[2]
    assert_trains_like_eager(model, lambda m, x, t: loss_fn(m(x), t), batches)


class Seq2Seq(nn.Module):
    """GRU encoder; GRUCell decoder with dot-product attention; greedy decoding feeds back its own argmax."""

    def __init__(self, vocab=11, hidden=8):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.encoder = nn.GRU(hidden, hidden, batch_first=True)
        self.decoder = nn.GRUCell(2 * hidden, hidden)
        self.out = nn.Linear(hidden, vocab)

    def forward(self, source, steps):
        memory, h = self.encoder(self.embed(source))
        h = h[0]
        token = source[:, 0]
        logits = []
        for _ in range(steps):
            weights = torch.softmax(torch.einsum("bh,bth->bt", h, memory), dim=-1)
            context = torch.einsum("bt,bth->bh", weights, memory)
            h = self.decoder(torch.cat([self.embed(token), context], dim=-1), h)
            step_logits = self.out(h)
            logits.append(step_logits)
            token = step_logits.argmax(-1)  # greedy: the next input is this step's prediction
        return torch.stack(logits, dim=1)


def test_seq2seq_with_attention_and_greedy_decoding_trains_compiled_as_eager():
    torch.manual_seed(0)
    model = port(Seq2Seq().double())
    g = torch.Generator().manual_seed(3)
    batches = [(torch.randint(0, 11, (2, 5), generator=g), torch.randint(0, 11, (2, 4), generator=g))
               for _ in range(STEPS)]
    assert_trains_like_eager(model, lambda m, s, t: F.cross_entropy(m(s, 4).flatten(0, 1), t.flatten()), batches)


class GAN(nn.Module):
    def __init__(self):
        super().__init__()
        self.generator = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 4))
        self.discriminator = nn.Sequential(nn.Linear(4, 8), nn.LeakyReLU(0.2), nn.Linear(8, 1))


def gan_losses(m, real, z):
    """The discriminator's loss on real and on detached fakes, plus the generator's loss through D."""
    fake = m.generator(z)
    ones, zeros = torch.ones(real.shape[0], 1, dtype=real.dtype), torch.zeros(z.shape[0], 1, dtype=real.dtype)
    d_loss = (F.binary_cross_entropy_with_logits(m.discriminator(real), ones)
              + F.binary_cross_entropy_with_logits(m.discriminator(fake.detach()), zeros))
    g_loss = F.binary_cross_entropy_with_logits(m.discriminator(fake), ones)
    return d_loss + g_loss


def test_a_gan_step_with_detach_trains_compiled_as_eager():
    torch.manual_seed(0)
    model = port(GAN().double())
    g = torch.Generator().manual_seed(4)
    batches = [(torch.randn(6, 4, generator=g, dtype=torch.float64), torch.randn(6, 3, generator=g,
                                                                                 dtype=torch.float64))
               for _ in range(STEPS)]
    assert_trains_like_eager(model, gan_losses, batches)


class DQN(nn.Module):
    def __init__(self):
        super().__init__()
        self.q = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 3))
        self.target = copy.deepcopy(self.q).requires_grad_(False)


def td_loss(m, state, action, reward, next_state, done):
    """(Q(s, a) - (r + 0.9 max_a' Q_target(s', a') (1 - done)).detach())^2: the target is cut from the graph."""
    q = m.q(state).gather(1, action[:, None])[:, 0]
    target = (reward + 0.9 * m.q(next_state).max(1).values * (1 - done)).detach()
    target = torch.minimum(target, reward + 0.9 * m.target(next_state).max(1).values)
    return F.smooth_l1_loss(q, target)


def test_a_dqn_step_with_a_target_network_trains_compiled_as_eager():
    torch.manual_seed(0)
    model = port(DQN().double())
    g = torch.Generator().manual_seed(5)
    batches = [(torch.randn(8, 4, generator=g, dtype=torch.float64), torch.randint(0, 3, (8,), generator=g),
                torch.randn(8, generator=g, dtype=torch.float64), torch.randn(8, 4, generator=g, dtype=torch.float64),
                (torch.rand(8, generator=g) < 0.2).double()) for _ in range(STEPS)]
    assert_trains_like_eager(model, td_loss, batches)


def test_a_step_that_calls_tt_grad_inside_is_replayed_and_trains_as_eager():
    model = port(nn.Linear(3, 1).double())
    twin = copy.deepcopy(model)

    def step(m, x):
        weight, bias = tt.grad((m(x) ** 2).mean(), [m.weight, m.bias])
        with torch.no_grad():
            m.weight -= 0.1 * weight
            m.bias -= 0.1 * bias
        return weight

    x = torch.randn(4, 3, dtype=torch.float64)
    compiled = tt.compile(lambda v: step(model, v), (x,))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(4):
            compiled(x)
            step(twin, x)
    assert compiled.replayed == 3
    for a, b in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(plain(a), plain(b), rtol=0, atol=0)
