"""Small float64 models for the curvature tests, each with its loss as a function of its parameters (for
torch.func, on the plain twin) and as loss_fn(model, batch) (for tt.spectrum and tt.landscape, on the ported one)."""
import copy

import torch
from torch import nn

import torchtrace as tt

DTYPE = torch.float64


def mlp(hidden: int = 12) -> nn.Module:
    """4 -> hidden -> 3 with tanh: 99 parameters for hidden = 12."""
    return nn.Sequential(nn.Linear(4, hidden), nn.Tanh(), nn.Linear(hidden, 3)).to(DTYPE)


def cnn_with_batchnorm_eval() -> nn.Module:
    torch.manual_seed(1)
    model = nn.Sequential(nn.Conv2d(2, 3, 3), nn.BatchNorm2d(3), nn.ReLU(), nn.Flatten(), nn.Linear(12, 3))
    model = model.to(DTYPE)
    with torch.no_grad():  # statistics that differ from the defaults, so eval mode's normalisation shows
        model[1].running_mean.normal_()
        model[1].running_var.uniform_(0.5, 2.0)
    return model.eval()


class TinyTransformer(nn.Module):
    """A linear embedding, one encoder layer (self-attention, feed-forward, layer norms), mean pool, a head."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(3, 8)
        self.block = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(self.embed(x)).mean(dim=1))


def transformer() -> nn.Module:
    return TinyTransformer().to(DTYPE)


def data(model_name: str, n: int = 6, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    shape = {"mlp": (n, 4), "cnn": (n, 2, 4, 4), "transformer": (n, 5, 3)}[model_name]
    return torch.randn(shape, generator=g, dtype=DTYPE), torch.randint(0, 3, (n,), generator=g)


def loss_fn(model: nn.Module, batch) -> torch.Tensor:
    x, y = batch
    return nn.functional.cross_entropy(model(x), y)


def twins(make, seed: int = 0):
    """(plain torch model, ported copy with the same values)."""
    torch.manual_seed(seed)
    plain = make()
    return plain, tt.port(copy.deepcopy(plain))


def functional_loss(model: nn.Module, batch):
    """(f(*params) for torch.func or tt.hvp, the parameters' current values as a tuple)."""
    names = [n for n, _ in model.named_parameters()]
    values = tuple(p.detach().as_subclass(torch.Tensor).clone() for p in model.parameters())

    def f(*params):
        return loss_fn(lambda x: torch.func.functional_call(model, dict(zip(names, params)), (x,)), batch)

    return f, values


def flat_hessian(model: nn.Module, batch) -> torch.Tensor:
    """The full Hessian of the loss over all parameters, flattened in named_parameters order (torch.func)."""
    f, values = functional_loss(model, batch)
    sizes = [v.numel() for v in values]

    def flat_f(theta):
        return f(*(t.view(v.shape) for t, v in zip(theta.split(sizes), values)))

    return torch.func.hessian(flat_f)(torch.cat([v.reshape(-1) for v in values]))
