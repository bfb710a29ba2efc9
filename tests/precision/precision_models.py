"""Small models for the mixed-precision tests, in torch.nn (ported with tt.port where torchtrace runs them): a
one-block GPT, a CNN, a model whose head underflows float16 gradients at scale 1, and one with an op that can be
forced to overflow in the backward."""
import torch
import torch.nn.functional as F
from torch import nn

from torchtrace.precision.__main__ import SmallGPT, gpt_loss  # noqa: F401 (gpt_loss: the tests' too)


class GPT(SmallGPT):
    """python -m torchtrace.precision's GPT, smaller: 11 tokens, width 16, 2 heads, blocks of 8."""

    def __init__(self, vocab: int = 11, d: int = 16, heads: int = 2, block: int = 8) -> None:
        super().__init__(vocab, d, heads, block)


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
