"""The checkers of the lesson "Debugging gradients": right answers pass, wrong ones are called wrong with a hint,
and a wrong rule is pointed at by tt.diff's first wrong step."""
import importlib.util
import re
from pathlib import Path

import torch
import torch.nn.functional as F
from lesson_training import train_watched

import torchtrace as tt

_path = Path(__file__).resolve().parents[2] / "examples" / "notebooks" / "checkers.py"
_spec = importlib.util.spec_from_file_location("checkers", _path)
checkers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(checkers)


def printed(capsys, check, *args) -> str:
    check(*args)
    return capsys.readouterr().out


def mlp(seed=0):
    torch.manual_seed(seed)
    return tt.port(torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8), torch.nn.ReLU(),
                                       torch.nn.Linear(8, 3)))


X, Y = torch.randn(32, 6, generator=torch.Generator().manual_seed(0)), torch.arange(32) % 3


def test_found_the_nan(capsys):
    def loss():
        logits = mlp()(X) * 500
        return (torch.log(1 + torch.exp(logits)) - logits.gather(1, Y[:, None])).mean()

    assert printed(capsys, checkers.found_the_nan, "Exp", loss).startswith("right")
    out = printed(capsys, checkers.found_the_nan, "Log", loss)
    assert out.startswith("wrong") and "\nhint: " in out
    assert printed(capsys, checkers.found_the_nan, None, loss).startswith("not done yet")
    assert "give the rule's name as a string" in printed(capsys, checkers.found_the_nan, 3, loss)


def test_dead_layer(capsys):
    net = mlp()
    with torch.no_grad():
        net[2].bias.fill_(-50.0)
    loss = lambda: F.cross_entropy(net(X), Y)  # noqa: E731
    assert printed(capsys, checkers.dead_layer, 3, net, loss).startswith("right")
    assert printed(capsys, checkers.dead_layer, 1, net, loss).startswith("wrong")
    assert "an int" in printed(capsys, checkers.dead_layer, "3", net, loss)


class Gated(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.features, self.gate, self.head = torch.nn.Linear(6, 8), torch.nn.Linear(6, 8), torch.nn.Linear(8, 3)

    def forward(self, x):  # the lesson's bug: the gate's weights detached (the values are those of the repair)
        return self.head(torch.relu(self.features(x)) * torch.sigmoid(self.gate(x)).detach())


def test_detached_branch_checks_every_parameter_against_torch_autograd(capsys):
    torch.manual_seed(0)
    model = tt.port(Gated())

    def fixed(x):
        return F.cross_entropy(model.head(torch.relu(model.features(x)) * torch.sigmoid(model.gate(x))), Y)

    def still_detached(x):
        return F.cross_entropy(model.head(torch.relu(model.features(x)) * torch.sigmoid(model.gate(x)).detach()), Y)

    right = printed(capsys, checkers.detached_branch, fixed, model, tt.as_tracer(X), Y)
    assert right.startswith("right") and "7 gradients" in right  # the input and the six parameters
    wrong = printed(capsys, checkers.detached_branch, still_detached, model, tt.as_tracer(X), Y)
    assert wrong.startswith("wrong") and "gate.weight, gate.bias" in wrong and ".detach()" in wrong
    other_loss = printed(capsys, checkers.detached_branch, lambda x: 2 * fixed(x), model, tt.as_tracer(X), Y)
    assert other_loss.startswith("wrong") and "not the model's cross entropy" in other_loss  # gradients alone agree
    assert all(isinstance(p, torch.nn.Parameter) for p in model.parameters())  # the parameters are put back


def test_learning_rate(capsys):
    def train(lr):
        return train_watched(mlp(), X, Y, lr, steps=6)

    assert printed(capsys, checkers.learning_rate, 0.1, train).startswith("right")
    too_large = printed(capsys, checkers.learning_rate, 100.0, train)
    assert too_large.startswith("wrong") and "large updates" in too_large
    assert "too small" in printed(capsys, checkers.learning_rate, 1e-9, train)
    assert "too small" in printed(capsys, checkers.learning_rate, 1e-4, train)  # the loss moves, by 1e-5
    ascent = printed(capsys, checkers.learning_rate, -1, train)
    assert "positive number" in ascent and "gradient ascent" in ascent
    assert "never move" in printed(capsys, checkers.learning_rate, 0, train)


class TanhGelu(tt.Function):
    @staticmethod
    def forward(ctx, a):
        ctx.save_for_backward(a)
        return F.gelu(a, approximate="tanh")

    @staticmethod
    def backward(ctx, grad):
        (a,) = ctx.saved_tensors
        u = (2 / torch.pi) ** 0.5 * (a + 0.044715 * a ** 3)
        phi = 0.5 * (1 + torch.tanh(u))
        return grad * phi  # forgets x * phi'(x)


class RightTanhGelu(TanhGelu):
    @staticmethod
    def backward(ctx, grad):
        (a,) = ctx.saved_tensors
        u = (2 / torch.pi) ** 0.5 * (a + 0.044715 * a ** 3)
        dphi = 0.5 * (1 - torch.tanh(u) ** 2) * (2 / torch.pi) ** 0.5 * (1 + 3 * 0.044715 * a ** 2)
        return grad * (0.5 * (1 + torch.tanh(u)) + a * dphi)


def test_a_wrong_rule_is_pointed_at_by_tt_diff(capsys):
    assert printed(capsys, checkers.repaired_rule, RightTanhGelu).startswith("right")
    out = printed(capsys, checkers.repaired_rule, TanhGelu)
    assert out.startswith("wrong")
    where = re.search(r"the first wrong step \(tt.diff\): TanhGelu at your TanhGelu.backward, "
                      r"test_lesson_checkers.py:(\d+) ", out)
    assert where, out
    shown = Path(__file__).read_text(encoding="utf-8").splitlines()[int(where.group(1)) - 1]
    assert shown.strip() in ("@staticmethod", "def backward(ctx, grad):")  # TanhGelu's backward, in this file
    assert "checkers.py:" not in out.replace("test_lesson_checkers.py:", "")  # not the checker's own line
    assert "it received the right gradient, so this step is wrong" in out


def test_first_wrong_step_when_nothing_differs():
    x = tt.randn(3, requires_grad=True)
    assert "no step" in checkers.first_wrong_step(lambda v: v.sin().sum(), lambda v: v.sin().sum(), x)


def _standardisations():
    def deviation(h):
        return h - h.mean(-1, keepdim=True)

    def variance(h):
        return deviation(h).pow(2).mean(-1, keepdim=True)

    return {
        "right": lambda h: deviation(h) / (variance(h) + 1e-5).sqrt(),
        "clamped": lambda h: deviation(h) / variance(h).clamp_min(1e-5).sqrt(),
        "no eps": lambda h: deviation(h) / variance(h).sqrt(),
        "eps after the root": lambda h: deviation(h) / (variance(h).sqrt() + 1e-5),
        "unbiased": lambda h: deviation(h) / (h.var(-1, keepdim=True) + 1e-5).sqrt(),
        "detached": lambda h: (h - h.mean(-1, keepdim=True).detach()) / (variance(h).detach() + 1e-5).sqrt(),
        "eps too large": lambda h: deviation(h) / (variance(h) + 0.1).sqrt(),
        "no keepdim": lambda h: h - h.mean(-1),
        "no centring": lambda h: h / (variance(h) + 1e-5).sqrt(),
    }


def test_standardised(capsys):
    forms = _standardisations()
    assert printed(capsys, checkers.standardised, forms["right"]).startswith("right")
    assert printed(capsys, checkers.standardised, forms["clamped"]).startswith("right")
    expected = {"no eps": ("gives NaN", "inside the root"),
                "eps after the root": ("the gradient at row 2 is not", "an eps added after the root"),
                "unbiased": ("differ from F.layer_norm", "n - 1"),
                "detached": ("the gradient differs", "cut from the graph"),
                "eps too large": ("differ from F.layer_norm", "keep it small"),
                "no keepdim": ("raised RuntimeError", "keepdim=True"),
                "no centring": ("differ from F.layer_norm", "subtract its mean")}
    for name, (what, hint) in expected.items():
        out = printed(capsys, checkers.standardised, forms[name])
        assert out.startswith("wrong") and what in out and hint in out.split("\nhint: ")[1], (name, out)

    def unfinished(h):
        raise NotImplementedError

    assert printed(capsys, checkers.standardised, unfinished).startswith("not done yet")
