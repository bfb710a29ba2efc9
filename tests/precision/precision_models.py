"""Small models for the mixed-precision tests, in torch.nn (ported with tt.port where torchtrace runs them): a
one-block GPT, a CNN, a model whose head underflows float16 gradients at scale 1, and one with an op that can be
forced to overflow in the backward."""
import math

import torch
import torch.nn.functional as F
from torch import nn


class GPT(nn.Module):
    """Token and position embeddings, one pre-norm block (causal attention spelled out, a GELU MLP), a linear head."""

    def __init__(self, vocab: int = 11, d: int = 16, heads: int = 2, block: int = 8) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(block, d)
        self.ln1, self.qkv, self.proj = nn.LayerNorm(d), nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.ln2, self.fc, self.mlp_proj = nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.ln_f, self.head, self.heads = nn.LayerNorm(d), nn.Linear(d, vocab), heads
        self.register_buffer("causal", torch.tril(torch.ones(block, block, dtype=torch.bool)))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        B, T = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(T))
        q, k, v = self.qkv(self.ln1(x)).split(x.shape[-1], dim=-1)
        q, k, v = (t.view(B, T, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(~self.causal[:T, :T], float("-inf"))
        x = x + self.proj((att.softmax(-1) @ v).transpose(1, 2).reshape(B, T, -1))
        x = x + self.mlp_proj(F.gelu(self.fc(self.ln2(x))))
        return self.head(self.ln_f(x))


def gpt_loss(model: nn.Module, idx: torch.Tensor) -> torch.Tensor:
    logits = model(idx[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), idx[:, 1:].reshape(-1))


class CNN(nn.Module):
    """conv -> batch norm -> ReLU -> max pool -> conv -> ReLU -> average pool -> linear."""

    def __init__(self, classes: int = 4) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4)
        self.conv2, self.fc = nn.Conv2d(4, 4, 3, padding=1), nn.Linear(4 * 2 * 2, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        h = F.avg_pool2d(F.relu(self.conv2(h)), 2)
        return self.fc(h.flatten(1))


def cnn_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(x), y)


class TinyHead(nn.Module):
    """Two tanh layers and a head whose weights are 1e-5: the gradient the head sends back is the incoming 1e-4
    times 1e-5, about 1e-9 -- below float16's smallest subnormal (6e-8), so it underflows to 0 at scale 1, and is
    about 6.6e-5 (a normal float16) at scale 2**16."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh())
        self.head = nn.Linear(8, 1)
        with torch.no_grad():
            self.head.weight.fill_(1e-5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x)).float().sum() * 1e-4  # the loss in float32, as autocast's losses are


class Forced(nn.Module):
    """A linear layer and a head, and a term `boost` times the mean of the hidden layer: with a large boost the
    gradient that multiplication sends back is boost times the scaled incoming one, so a float16 backward overflows
    there first, and the inf reaches the first layer's parameters only."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.head = nn.Linear(4, 8), nn.Linear(8, 1)
        self.boost = 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.first(x))
        return self.head(h).pow(2).mean() + h.mean() * self.boost  # the forced overflow
