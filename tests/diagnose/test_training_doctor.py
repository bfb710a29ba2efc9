"""tt.diagnose.training: the per-layer table over a loop, the plot (matplotlib, Agg) and the flags' thresholds."""
import sys

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
import torch  # noqa: E402

import torchtrace as tt  # noqa: E402
from torchtrace.doctor import training  # noqa: E402


def train(lr, steps=8, dead=False, optimizer=tt.optim.SGD):
    torch.manual_seed(0)
    model = tt.port(torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2)))
    if dead:
        with torch.no_grad():
            model[0].bias.fill_(-100.0)
    x, y = tt.randn(32, 4), tt.randn(32, 2)
    opt = optimizer(model.parameters(), lr=lr)
    with tt.diagnose.training(model, opt) as doc:
        for _ in range(steps):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
    return model, doc


def test_the_table_has_one_row_per_layer_with_the_columns_over_the_run():
    model, doc = train(0.05)
    assert list(doc.history) == ["0", "1", "2"]
    assert all(len(h.steps) == 8 for h in doc.history.values())
    first = doc.history["0"].steps[0]
    # the update/weight ratio is what SGD did: lr * |grad| / |w| at the first step
    assert first.update_ratio == pytest.approx(0.05 * first.grad_norm / first.weight_norm, rel=1e-5)
    assert doc.history["1"].steps[0].grad_norm is None  # ReLU has no parameters: activations only
    assert 0 <= doc.history["1"].steps[-1].dead_share <= 1
    text = doc.table()
    assert text.splitlines()[0].split()[:3] == ["layer", "|grad|", "first"] and "8 optimizer steps" in text
    assert doc.findings == []


def test_a_learning_rate_1000_times_too_large_is_flagged():
    _, doc = train(0.05 * 1e3)
    flags = {(f.module, f.message.split(":")[0]) for f in doc.findings}
    assert ("0", "large updates") in flags and ("2", "large updates") in flags
    assert any(f.kind == "nonfinite" for f in doc.findings) or any("growing" in f.message for f in doc.findings)


def test_a_dead_layer_is_flagged_at_its_activation():
    _, doc = train(0.05, dead=True)
    assert [(f.kind, f.module) for f in doc.findings] == [("killed", "1")]
    assert doc.history["1"].steps[-1].dead_share == 1.0


def test_the_plot_draws_four_panels_and_saves(tmp_path):
    _, doc = train(0.05, steps=3)
    figure = doc.plot(tmp_path / "health.png")
    assert len(figure.axes) == 4 and (tmp_path / "health.png").stat().st_size > 0
    assert [ax.get_title() for ax in figure.axes] == ["|grad|", "update / weight", "activation std", "dead-unit share"]


def test_hooks_are_removed_when_the_block_ends():
    torch.manual_seed(0)
    model = tt.port(torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU()))
    opt = tt.optim.SGD(model.parameters(), lr=0.1)
    before = [len(m._forward_hooks) for m in model.modules()]
    with tt.diagnose.training(model, opt):
        assert [len(m._forward_hooks) for m in model.modules()] == [before[0], before[1] + 1, before[2] + 1]
    assert [len(m._forward_hooks) for m in model.modules()] == before
    assert not opt._optimizer_step_pre_hooks and not opt._optimizer_step_post_hooks
    assert training is tt.diagnose.training
    assert not any(getattr(w, "__self__", None) is not None for w in tt.autograd.engine.BACKWARD_WATCHERS)


def regression_run(lr, steps=30):
    """Full-batch least squares with SGD: stable below lr = 2 / lambda_max of the Hessian, diverging above it."""
    torch.manual_seed(0)
    x = torch.randn(64, 3, dtype=torch.float64)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5]], dtype=torch.float64)
    model = tt.port(torch.nn.Linear(3, 1, bias=False).double())
    hessian = 2 * x.T @ x / len(x)  # of mean((x w - y)^2)
    lam = float(torch.linalg.eigvalsh(hessian)[-1])
    opt = tt.optim.SGD(model.parameters(), lr=lr / lam)
    losses = []
    with tt.diagnose.training(model, opt) as doc:
        for _ in range(steps):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(tt.tracer(x)), tt.tracer(y))
            losses.append(loss.item())
            loss.backward()
            opt.step()
    return doc, losses


def test_a_loss_that_rises_every_step_past_the_stable_learning_rate_is_flagged():
    doc, losses = regression_run(2.2)  # past 2 / lambda_max: each step overshoots by more than it corrects
    assert doc.losses == pytest.approx(losses)
    assert all(b > a for a, b in zip(losses[1:], losses[2:])) and losses[-1] > 100 * losses[1]
    (finding,) = [f for f in doc.findings if f.message.startswith("diverging loss: it rose at each of the last")]
    assert finding.kind == "exploding" and finding.module == ""
    assert "lower the learning rate" in finding.advice and "diverging loss" in doc.table()


def test_a_loss_that_falls_is_not_flagged_and_a_short_rise_is_not_either():
    doc, losses = regression_run(1.0)
    assert losses[-1] < losses[0] and doc.findings == []
    rising_streak = sys.modules["torchtrace.doctor.training"].rising_streak  # (the package's `training`: the function)
    assert rising_streak([3.0, 1.0, 2.0, 4.0]) == 2 and rising_streak([1.0, 2.0, 1.5]) == 0


def small_output_layer_run(lr, steps=30):
    """A tanh MLP whose output layer starts at 1e-4 of its initialisation: the first layer's gradient, scaled by the
    output weights, starts tiny and grows as they do."""
    torch.manual_seed(0)
    model = tt.port(torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)))
    with torch.no_grad():
        model[2].weight.mul_(1e-4)
        model[2].bias.zero_()
    opt = tt.optim.SGD(model.parameters(), lr=lr)
    x = torch.randn(64, 4)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
    with tt.diagnose.training(model, opt) as doc:
        for _ in range(steps):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(tt.tracer(x)), tt.tracer(y)).backward()
            opt.step()
    return doc


def test_a_gradient_growing_while_the_loss_falls_is_not_flagged_and_one_growing_while_it_rises_is():
    healthy = small_output_layer_run(0.05)
    first = healthy.history["0"].steps
    assert max(s.grad_norm for s in first) > 1e3 * first[0].grad_norm  # grew past the threshold ...
    assert all(b < a for a, b in zip(healthy.losses, healthy.losses[1:])) and healthy.findings == []  # ... as it fell
    diverging = small_output_layer_run(0.5)
    flags = {(f.module, f.message.split(":")[0]) for f in diverging.findings}
    assert ("0", "growing gradients") in flags and diverging.losses[-1] > diverging.losses[0]
