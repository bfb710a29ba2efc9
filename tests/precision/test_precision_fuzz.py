"""A differential fuzzer of tt.precision (API.md 5e) against torch.autocast and torch.amp.GradScaler on plain tensors:
the dtype of each op, the underflow / overflow shares counted by hand, the low-precision run's gradients bit for bit
(with and without loss scaling), the same random masks in both runs, the model's state left alone, and the scale and
skip decisions of a GradScaler loop with randomly placed overflows."""
import contextlib
import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchtrace as tt

LOW = (torch.float16, torch.bfloat16)


def _leaf(t):
    return tt.tracer(t, requires_grad=True)


def _autocast(dtype, fn, *args):
    with torch.autocast("cpu", dtype=dtype):
        return fn(*args)


@pytest.mark.parametrize("dtype", LOW, ids=str)
def test_matmul_underflow_share_is_the_one_autocast_gives(dtype):
    a = torch.full((4, 3), 1e-5)
    b = torch.full((3, 5), 1e-5)
    b[:, 0] = 1.0  # one column of five stays representable
    report = tt.precision(lambda a, b: (a @ b).sum(), _leaf(a), b, dtype=dtype)
    forward = [r for r in report.rows if r.phase == "forward"]
    matmul = forward[0]
    low, reference = _autocast(dtype, torch.matmul, a, b), a @ b
    assert matmul.dtype == low.dtype == dtype and matmul.why == "lower-precision list"
    direct = float(((reference != 0) & (low == 0)).double().mean())
    assert matmul.underflow == pytest.approx(direct)
    assert direct == (0.8 if dtype == torch.float16 else 0.0)  # 3e-10: below float16's subnormals, not bfloat16's
    assert matmul.overflow == 0


def test_matmul_overflow_share_and_the_inf_it_carries():
    a = torch.full((4, 3), 200.0)
    b = torch.full((3, 5), 1.0)
    b[:, 1], b[:, 2] = -200.0, 0.5
    report = tt.precision(lambda a, b: (a @ b).float().mean(), _leaf(a), b, dtype=torch.float16)
    matmul, mean = [r for r in report.rows if r.phase == "forward"][:2]
    low = _autocast(torch.float16, torch.matmul, a, b)
    assert matmul.overflow == pytest.approx(float((torch.isinf(low) & torch.isfinite(a @ b)).double().mean()))
    assert matmul.overflow == pytest.approx(0.2) and matmul.rel_error == float("inf")
    assert mean.overflow == 1.0  # the loss itself is -inf in the low run, finite in float32


def test_float64_inputs_are_left_alone_by_autocast_and_said_promoted():
    x, w = torch.randn(3, 4, dtype=torch.float64), torch.randn(4, 2, dtype=torch.float64)
    assert _autocast(torch.float16, torch.matmul, x, w).dtype == torch.float64
    report = tt.precision(lambda x, w: (x @ w).sum(), _leaf(x), w, dtype=torch.float16)
    assert report.rows and all(r.dtype == torch.float64 and r.why == "promoted" for r in report.rows)
    assert all(r.rel_error == 0 for r in report.rows)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(6, 8), nn.GELU(), nn.LayerNorm(8), nn.Linear(8, 8), nn.Softplus())
        self.conv = nn.Conv1d(1, 2, 3, padding=1)
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        h = self.body(x)
        return self.head(torch.relu(self.conv(h[:, None])).flatten(1))


@pytest.mark.parametrize("scale", [1.0, 2.0 ** 12], ids=["unscaled", "scaled"])
@pytest.mark.parametrize("dtype", LOW, ids=str)
def test_the_low_run_is_torch_autocasts_bit_for_bit(dtype, scale):
    torch.manual_seed(0)
    plain = Net()
    model = tt.port(copy.deepcopy(plain))
    x, y = torch.randn(5, 6), torch.randint(0, 4, (5,))
    report = tt.precision(lambda x, y: F.cross_entropy(model(x), y), x, y, dtype=dtype, scale=scale)
    with torch.autocast("cpu", dtype=dtype):
        loss = F.cross_entropy(plain(x), y)
    (loss * torch.tensor(scale)).backward()  # as GradScaler.scale multiplies it
    assert report.low.loss == pytest.approx(float(loss.detach()) * scale, rel=1e-6)
    for q, p in zip(model.parameters(), plain.parameters()):
        got = report.low.leaf_grads[("parameter", id(q))]
        assert got.dtype == p.grad.dtype and torch.equal(got, p.grad)
    fp32 = copy.deepcopy(plain)
    fp32.zero_grad()
    F.cross_entropy(fp32(x), y).backward()
    for q, p in zip(model.parameters(), fp32.parameters()):
        torch.testing.assert_close(report.reference.leaf_grads[("parameter", id(q))], p.grad, rtol=1e-6, atol=1e-7)
    forward = [r for r in report.rows if r.phase == "forward"]
    linears = [r for r in forward if r.rule == "LinearFunction"]
    assert len(linears) == 3 and all(r.dtype == dtype and r.why == "lower-precision list" for r in linears)
    assert all(0 <= r.underflow <= 1 and 0 <= r.overflow <= 1 for r in report.rows)


@pytest.mark.parametrize("dtype", LOW, ids=str)
def test_dropout_draws_the_same_mask_in_both_runs_and_the_state_is_kept(dtype):
    torch.manual_seed(1)
    model = tt.port(nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5), nn.BatchNorm1d(8), nn.Linear(8, 1)))
    x = torch.randn(16, 4)
    for p in model.parameters():
        p.grad = torch.full(p.shape, 3.0)
    before = [t.detach().as_subclass(torch.Tensor).clone() for t in [*model.parameters(), *model.buffers()]]
    report = tt.precision(lambda x: model(x).pow(2).mean(), x, dtype=dtype, scale=1024.0)
    dropout = next(r for r in report.rows if r.phase == "forward" and r.rule == "DropoutFunction")
    assert dropout.rel_error < 0.05  # another mask would differ by about 1 (elements zeroed in one run only)
    assert torch.equal(dropout.value == 0, dropout.reference == 0)
    after = [t.detach().as_subclass(torch.Tensor) for t in [*model.parameters(), *model.buffers()]]
    assert all(torch.equal(a, b) for a, b in zip(before, after))
    assert all(torch.equal(p.grad, torch.full(p.shape, 3.0)) for p in model.parameters())


@pytest.mark.parametrize("bad", [torch.float32, torch.float64, "float16"], ids=str)
def test_a_dtype_that_is_not_a_low_float_is_refused(bad):
    with pytest.raises(ValueError, match="dtype must be torch.bfloat16 or torch.float16"):
        tt.precision(lambda x: (x * 2).sum(), _leaf(torch.ones(2)), dtype=bad)


@pytest.mark.parametrize("scale", [0.0, -1.0, float("nan"), float("inf")])
def test_a_scale_that_is_not_positive_and_finite_is_refused(scale):
    with pytest.raises(ValueError, match="scale"):
        tt.precision(lambda x: (x * 2).sum(), _leaf(torch.ones(2)), dtype=torch.float16, scale=scale)


class Boosted(nn.Module):
    """A hidden layer's mean times `boost`: a large boost makes the float16 backward overflow there."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.head = nn.Linear(4, 8), nn.Linear(8, 1)
        self.boost = 1.0

    def forward(self, x):
        h = torch.tanh(self.first(x))
        return self.head(h).pow(2).mean() + h.mean() * self.boost


def _loop(model, boosts, init_scale, watch=False):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=3)
    called, seen = [], []
    real_step = optimizer.step
    optimizer.step = lambda *a, **k: (called.append(1), real_step(*a, **k))[1]
    g = torch.Generator().manual_seed(4)
    context = tt.precision.training(model, optimizer, scaler) if watch else contextlib.nullcontext()
    with context as p:
        for boost in boosts:
            model.boost = boost
            x = torch.randn(8, 4, generator=g)
            optimizer.zero_grad()
            with torch.autocast("cpu", dtype=torch.float16):
                loss = model(x)
            before, scale = len(called), float(scaler.get_scale())
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            seen.append((scale, len(called) == before))
    return seen, p, [t.detach().as_subclass(torch.Tensor).clone() for t in model.parameters()]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_scales_and_skips_equal_gradscalers_with_random_overflows(seed):
    g = torch.Generator().manual_seed(seed)
    boosts = [1e5 if float(u) < 0.25 else 1.0 for u in torch.rand(16, generator=g)]
    init_scale = 2.0 ** int(torch.randint(4, 14, (1,), generator=g))
    torch.manual_seed(seed)
    plain = Boosted()
    expected, _, expected_params = _loop(copy.deepcopy(plain), boosts, init_scale)
    assert any(skipped for _, skipped in expected) and not all(skipped for _, skipped in expected)
    seen, p, params = _loop(tt.port(copy.deepcopy(plain)), boosts, init_scale, watch=True)
    assert seen == expected
    assert [(s.scale, s.skipped) for s in p.steps] == expected
    assert p.skipped == [i for i, (_, skipped) in enumerate(expected) if skipped]
    for step in p.steps:
        assert (step.first_inf is not None) == step.skipped
        if step.skipped:
            assert step.first_inf.parameters and all(n.startswith("first.") for n in step.first_inf.parameters)
    for a, b in zip(params, expected_params):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
