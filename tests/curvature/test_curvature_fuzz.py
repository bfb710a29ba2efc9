"""A differential fuzzer of the curvature lab (API.md 5f): tt.hvp against torch.func's HVP (jvp of grad) and central
differences of torch autograd's gradient; tt.spectrum against torch.linalg.eigvalsh of the explicit Hessian; the
grids of tt.landscape against the loss recomputed by hand, with the model left exactly as it was.

The explicit Hessians are torch.autograd.functional.hessian (reverse over reverse) and are checked symmetric:
torch.func.hessian (jacfwd over jacrev) of a model with a LayerNorm or a train-mode BatchNorm after a Linear comes out
asymmetric in this torch (errors of 0.08 on a 39-parameter model), so it is not used as the reference here.
"""
import copy
import itertools

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchtrace as tt

DTYPE = torch.float64
METHODS = ["forward-over-reverse", "reverse-over-reverse"]


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _randn(shape, seed, dtype=DTYPE):
    return torch.randn(shape, generator=_gen(seed), dtype=dtype)


# ----------------------------------------------------------------------------------------------------------------
# tt.hvp
# ----------------------------------------------------------------------------------------------------------------

C1, C2, C3, C4, C5 = (_randn(s, 100 + i) for i, s in enumerate([(5, 3), (2, 2, 5, 5), (3, 4), (7, 3), (7, 2)]))
TARGETS = torch.tensor([0, 1, 2, 0, 1])

FUNCTIONS = {
    "a parameter the loss does not read": (lambda a, b: (a ** 3).sum(), [(3,), (2,)]),
    "relu": (lambda a: F.relu(a).pow(3).sum(), [(5,)]),
    "softplus of a matmul": (lambda a, b: F.softplus(a @ b).sum(), [(3, 4), (4, 2)]),
    "layer norm with affine": (lambda x, w, b: (F.layer_norm(x, (4,), w, b) ** 2 * C3[0]).sum(),
                               [(3, 4), (4,), (4,)]),
    "cross entropy": (lambda w: F.cross_entropy(C1 @ w, TARGETS), [(3, 4)]),
    "conv": (lambda w, b: torch.tanh(F.conv2d(C2, w, b)).pow(2).sum(), [(3, 2, 3, 3), (3,)]),
    "tied weight": (lambda w: ((torch.tanh(C3 @ w.t()) @ w) ** 2).sum(), [(5, 4)]),
    "0-d parameter": (lambda a: a ** 4 + a.exp(), [()]),
    "batch norm in train mode": (lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True).pow(3).sum(),
                                 [(6, 3), (3,), (3,)]),
    "logsumexp times norm": (lambda a: torch.logsumexp(a, 0) * a.norm(), [(6,)]),
    "max pool": (lambda a: F.max_pool1d(a.view(1, 1, -1), 2).pow(2).sum() * a.sum(), [(8,)]),
    "prod": (lambda a: a.prod(), [(5,)]),
    "gelu squared": (lambda a: F.gelu(a).sum() ** 2, [(5,)]),
    "silu mlp, squared error": (lambda w1, w2: (F.silu(C4 @ w1) @ w2 - C5).pow(2).mean(), [(3, 5), (5, 2)]),
    "softmax": (lambda a: (a.softmax(-1) ** 2).sum(), [(2, 5)]),
    "sqrt over a square": (lambda a, b: (a.abs().sqrt() / (b ** 2 + 1)).sum(), [(4,), (4,)]),
    "where": (lambda a: torch.where(a > 0, a ** 2, a ** 3).sum(), [(6,)]),
    "cumsum": (lambda a: a.cumsum(0).pow(2).sum(), [(6,)]),
    "repeated index": (lambda a: (a[[0, 0, 2]] ** 3).sum(), [(4,)]),
    "expand": (lambda a: (a.expand(3, 4) ** 2 * torch.arange(12.0, dtype=DTYPE).view(3, 4)).sum() * a[0], [(4,)]),
}


def _torch_hvp(f, xs, vs):
    return torch.func.jvp(torch.func.grad(f, argnums=tuple(range(len(xs)))), xs, vs)[1]


def _central_difference(f, xs, vs, eps=1e-5):
    def gradient(sign):
        leaves = [(x + sign * eps * v).detach().requires_grad_() for x, v in zip(xs, vs)]
        return torch.autograd.grad(f(*leaves), leaves, allow_unused=True, materialize_grads=True)
    return tuple((a - b) / (2 * eps) for a, b in zip(gradient(1), gradient(-1)))


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("name", list(FUNCTIONS))
def test_hvp_equals_torch_func_and_central_differences(name, method):
    f, shapes = FUNCTIONS[name]
    seed = sorted(FUNCTIONS).index(name)
    xs = tuple(_randn(s, 10 * seed + i) for i, s in enumerate(shapes))
    vs = tuple(_randn(s, 10 * seed + 5 + i) for i, s in enumerate(shapes))
    got = tt.hvp(f, xs, vs, method=method)
    assert isinstance(got, tuple) and len(got) == len(xs)
    for h, e, d, x in zip(got, _torch_hvp(f, xs, vs), _central_difference(f, xs, vs), xs):
        assert type(h) is torch.Tensor and h.shape == x.shape and h.dtype == x.dtype
        torch.testing.assert_close(h, e, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(h, d, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("method", METHODS)
def test_hvp_of_non_contiguous_and_transposed_parameters(method):
    f = lambda w, u: (torch.tanh(w) ** 2).sum() * w[0, 1] + (u.sin() * u).sum() ** 2  # noqa: E731
    w, u = _randn((4, 3), 1).t(), _randn((4, 6), 2)[:, ::2]
    assert not w.is_contiguous() and not u.is_contiguous()
    vs = (_randn((4, 3), 3).t(), _randn((4, 3), 4))
    got = tt.hvp(f, (w, u), vs, method=method)
    for h, e in zip(got, _torch_hvp(f, (w, u), vs)):
        torch.testing.assert_close(h, e, rtol=1e-10, atol=1e-10)
    assert torch.equal(w, _randn((4, 3), 1).t()) and torch.equal(u, _randn((4, 6), 2)[:, ::2])  # not moved


@pytest.mark.parametrize("method", METHODS)
def test_hvp_in_float32_keeps_its_dtype_and_is_float64s_to_float32_resolution(method):
    g = lambda x: torch.tanh(x @ x.T).pow(2).sum()  # noqa: E731
    x, v = _randn((4, 3), 7, torch.float32), _randn((4, 3), 8, torch.float32)
    exact = _torch_hvp(g, (x.double(),), (v.double(),))[0]
    got = tt.hvp(g, x, v, method=method)
    assert got.dtype == torch.float32
    assert float((got.double() - exact).abs().max() / exact.abs().max()) < 1e-5
    torch.testing.assert_close(got, _torch_hvp(g, (x,), (v,))[0], rtol=1e-5, atol=1e-5)


def test_hvp_structures_lists_like_tuples_and_refuses_dicts():
    f = lambda a, b: (a.sin() * b).sum() ** 2  # noqa: E731
    a, b, va, vb = (_randn((3,), s) for s in range(4))
    expected = _torch_hvp(f, (a, b), (va, vb))
    for params, v in [([a, b], [va, vb]), ((a, b), [va, vb]), ([a, b], (va, vb))]:
        got = tt.hvp(f, params, v)
        assert len(got) == 2
        for h, e in zip(got, expected):
            torch.testing.assert_close(h, e, rtol=1e-12, atol=1e-12)
    with pytest.raises(TypeError, match="tensor or a tuple of tensors"):
        tt.hvp(lambda d: d["a"].pow(3).sum(), {"a": a}, {"a": va})
    with pytest.raises(ValueError, match="structure"):
        tt.hvp(lambda x: x.pow(3).sum(), (a,), va)
    with pytest.raises(ValueError, match="structure"):
        tt.hvp(f, (a, b), (va,))
    with pytest.raises(TypeError, match="floating-point"):
        tt.hvp(lambda x: x.pow(3).sum(), torch.tensor([1, 2]), torch.tensor([1.0, 2.0]))


def test_hvp_casts_a_tangent_of_another_float_dtype_to_the_parameters():
    x, v = _randn((3,), 1), _randn((3,), 2)
    got = tt.hvp(lambda z: z.pow(3).sum(), x, v.float())
    assert got.dtype == DTYPE
    torch.testing.assert_close(got, 6 * x * v.float().double(), rtol=1e-12, atol=1e-12)


def test_a_gradient_through_hvp_to_its_primal_is_never_silently_none():
    """tt.hvp runs on fresh leaves of its primals: its refusing result hangs on the caller's primal too, so a
    gradient asked of x meets the refusal instead of reading 'x unused' (torch.func's would carry the third-derivative
    term)."""
    f = lambda z: (z.sin() * z).sum() ** 2  # noqa: E731
    x, v = _randn((3,), 1).requires_grad_(), _randn((3,), 2)
    expected = torch.autograd.grad(_torch_hvp(f, (x,), (v,))[0].sum(), x)[0]
    hv = tt.hvp(f, x, v)
    try:
        (got,) = torch.autograd.grad(hv.sum(), x, allow_unused=True)
    except Exception as error:  # refusing, naming what to do, as .backward() does, is fine too
        assert "outside the graph" in str(error)
        return
    assert got is not None
    torch.testing.assert_close(got, expected)


# ----------------------------------------------------------------------------------------------------------------
# tt.spectrum
# ----------------------------------------------------------------------------------------------------------------

def ce(model, batch):
    return F.cross_entropy(model(batch[0]), batch[1])


def _explicit_hessian(plain, loss_fn, batch):
    """The full Hessian over the parameters that require grad (named_parameters order), buffers cloned so a
    train-mode BatchNorm's update does not touch the model; checked symmetric."""
    named = [(n, p.detach().clone()) for n, p in plain.named_parameters() if p.requires_grad]
    sizes = [p.numel() for _, p in named]

    def flat_loss(theta):
        pieces = {n: t.view(p.shape) for (n, p), t in zip(named, theta.split(sizes))}
        pieces.update({n: b.clone() for n, b in plain.named_buffers()})
        return loss_fn(lambda *a: torch.func.functional_call(plain, pieces, a), batch)

    h = torch.autograd.functional.hessian(flat_loss, torch.cat([p.reshape(-1) for _, p in named]))
    torch.testing.assert_close(h, h.T, rtol=0, atol=1e-10)
    return h


class ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.fc = nn.Conv2d(1, 2, 2), nn.Linear(8, 3)

    def forward(self, x):
        return self.fc(torch.tanh(self.conv(x)).flatten(1))


MODELS = {
    "relu": (lambda: nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 3)), (10, 3)),
    "softplus": (lambda: nn.Sequential(nn.Linear(3, 4), nn.Softplus(), nn.Linear(4, 3)), (10, 3)),
    "layer norm": (lambda: nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4), nn.Tanh(), nn.Linear(4, 3)), (10, 3)),
    "batch norm train": (lambda: nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Tanh(), nn.Linear(4, 3)),
                         (10, 3)),
    "dropout eval": (lambda: nn.Sequential(nn.Linear(3, 5), nn.Dropout(0.5), nn.Tanh(), nn.Linear(5, 3)).eval(),
                     (10, 3)),
    "conv": (ConvNet, (6, 1, 3, 3)),
}


@pytest.fixture(scope="module", params=list(MODELS))
def model_case(request):
    make, shape = MODELS[request.param]
    torch.manual_seed(sorted(MODELS).index(request.param))
    plain = make().to(DTYPE)
    ported = tt.port(copy.deepcopy(plain))
    ported.train(plain.training)
    g = _gen(5)
    batch = (torch.randn(shape, generator=g, dtype=DTYPE), torch.randint(0, 3, (shape[0],), generator=g))
    h = _explicit_hessian(plain, ce, batch)
    assert h.shape[0] <= 60
    return ported, batch, h, torch.linalg.eigvalsh(h).flip(0)


def _state(model):
    return [t.detach().as_subclass(torch.Tensor).clone() for t in [*model.parameters(), *model.buffers()]]


def _same(a, b):
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("method", ["lanczos", "power"])
def test_top_eigenpairs_are_the_explicit_hessians(model_case, method):
    model, batch, h, exact = model_case
    before = _state(model)
    if method == "power":
        s = tt.spectrum(ce, model, batch, k=1, method="power", iterations=5000, progress=False)
        torch.testing.assert_close(s.eigenvalues[0], exact[exact.abs().argmax()], rtol=1e-6, atol=1e-8)
    else:
        s = tt.spectrum(ce, model, batch, k=3, progress=False)
        torch.testing.assert_close(s.eigenvalues, exact[:3], rtol=0, atol=1e-9)
        torch.testing.assert_close(s.eigenvectors @ s.eigenvectors.T, torch.eye(3, dtype=DTYPE), rtol=0, atol=1e-8)
    for value, vector in zip(s.eigenvalues, s.eigenvectors):
        torch.testing.assert_close(h @ vector, value * vector, rtol=0, atol=1e-6)
    assert _same(before, _state(model))


def test_all_eigenvalues_both_ends_and_the_trace(model_case):
    model, batch, h, exact = model_case
    n = h.shape[0]
    s = tt.spectrum(ce, model, batch, k=n, progress=False)
    torch.testing.assert_close(s.eigenvalues, exact, rtol=0, atol=1e-9)  # the bottom end included
    v = _randn((n,), 9)
    torch.testing.assert_close(s.hvp(v), h @ v, rtol=0, atol=1e-10)
    density = s.density(iterations=n, runs=1)
    assert float(density.nodes.min()) == pytest.approx(float(exact[-1]), abs=1e-8)
    assert float(density.nodes.max()) == pytest.approx(float(exact[0]), abs=1e-8)
    estimate = s.trace(samples=40)
    assert estimate.samples == 40 and estimate.stderr > 0
    assert abs(estimate.value - float(h.trace())) < 4 * estimate.stderr


class Vector(nn.Module):
    def __init__(self, values) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.as_tensor(values, dtype=DTYPE))


def quadratic(model, a):
    return 0.5 * model.w @ a @ model.w


def test_a_zero_hessian_gives_zeros_everywhere():
    model = tt.port(Vector([1.0, 2.0, 3.0]))
    linear = lambda m, b: (m.w * b).sum()  # noqa: E731
    ones = torch.ones(3, dtype=DTYPE)
    for k, method in [(1, "lanczos"), (3, "lanczos"), (2, "power")]:
        s = tt.spectrum(linear, model, ones, k=k, method=method, progress=False)
        assert torch.equal(s.eigenvalues, torch.zeros(k, dtype=DTYPE))
        assert torch.isfinite(s.eigenvectors).all()
    estimate = tt.spectrum(linear, model, ones, k=1, progress=False).trace(samples=5)
    assert (estimate.value, estimate.stderr) == (0.0, 0.0)
    assert torch.equal(tt.hvp(lambda w: (w * ones).sum(), ones, ones), torch.zeros(3, dtype=DTYPE))


def test_one_zero_dimensional_parameter():
    model = tt.port(Vector(0.7))
    quartic = lambda m, b: (m.w ** 4 * b).sum()  # noqa: E731  (H = 12 w² · 2)
    data = torch.ones(2, dtype=DTYPE)
    for method in ("lanczos", "power"):
        s = tt.spectrum(quartic, model, data, k=1, method=method, progress=False)
        torch.testing.assert_close(s.eigenvalues, torch.tensor([24 * 0.49], dtype=DTYPE), rtol=1e-12, atol=0)
        assert s.vector(0)[0].shape == ()
    estimate = tt.spectrum(quartic, model, data, k=1, progress=False).trace(samples=3)
    assert estimate.value == pytest.approx(24 * 0.49, rel=1e-12) and estimate.stderr == 0
    with pytest.raises(ValueError, match="k must be between 1 and the 1 parameters, not 2"):
        tt.spectrum(quartic, model, data, k=2)
    L = tt.landscape(quartic, model, data, directions="eigen", dims=1, steps=3, progress=False)
    sign = float(L.directions[0][0])
    assert abs(sign) == pytest.approx(1.0)
    expected = [2 * (0.7 + a * sign) ** 4 for a in (-1.0, 0.0, 1.0)]
    torch.testing.assert_close(L.losses, torch.tensor(expected, dtype=DTYPE), rtol=1e-12, atol=0)


@pytest.mark.parametrize("k", [4, 10])
def test_k_larger_than_the_parameter_count_is_refused_by_name(k):
    model = tt.port(Vector([1.0, 2.0, 3.0]))
    for method in ("lanczos", "power"):
        with pytest.raises(ValueError, match=f"k must be between 1 and the 3 parameters, not {k}"):
            tt.spectrum(quadratic, model, torch.eye(3, dtype=DTYPE), k=k, method=method)
    with pytest.raises(ValueError, match="at least 1"):
        tt.spectrum(quadratic, model, torch.eye(3, dtype=DTYPE), k=0)


def test_negative_definite_diagonal_top_largest_first_and_exact_trace():
    model = tt.port(Vector(torch.linspace(0.5, 1.5, 4)))
    a = torch.diag(torch.tensor([-1.0, -2.0, -3.0, -4.0], dtype=DTYPE))
    torch.testing.assert_close(tt.spectrum(quadratic, model, a, k=2, progress=False).eigenvalues,
                               torch.tensor([-1.0, -2.0], dtype=DTYPE), rtol=0, atol=1e-12)
    power = tt.spectrum(quadratic, model, a, k=2, method="power", progress=False).eigenvalues
    torch.testing.assert_close(power, torch.tensor([-4.0, -3.0], dtype=DTYPE), rtol=1e-8, atol=0)  # largest |λ|
    estimate = tt.spectrum(quadratic, model, a, k=1, progress=False).trace(samples=7)  # Rademacher: exact on diag
    assert estimate.value == pytest.approx(-10.0, abs=1e-12) and estimate.stderr == pytest.approx(0.0, abs=1e-12)


def test_unused_parameters_have_zero_curvature_and_frozen_ones_are_left_out():
    class Unused(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Parameter(torch.tensor([1.0, 2.0], dtype=DTYPE))
            self.unused = nn.Parameter(torch.ones(2, dtype=DTYPE))
            self.frozen = nn.Parameter(torch.full((2,), 0.5, dtype=DTYPE), requires_grad=False)

    model = tt.port(Unused())
    s = tt.spectrum(lambda m, b: (m.a ** 3).sum() * m.frozen.sum(), model, torch.ones(1, dtype=DTYPE), k=4,
                    progress=False)
    assert s.names == ["a", "unused"]
    torch.testing.assert_close(s.eigenvalues, torch.tensor([12.0, 6.0, 0.0, 0.0], dtype=DTYPE), rtol=0, atol=1e-12)
    top = s.vector(0)
    assert float(top[0].abs()[1]) == pytest.approx(1.0) and float(top[1].abs().max()) < 1e-12


def test_tied_weights_are_one_parameter():
    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.l1, self.l2 = nn.Linear(3, 3, bias=False), nn.Linear(3, 3, bias=False)
            self.l2.weight = self.l1.weight

        def forward(self, x):
            return self.l2(torch.tanh(self.l1(x)))

    torch.manual_seed(0)
    plain = Tied().to(DTYPE)
    model = tt.port(copy.deepcopy(plain))
    x = _randn((5, 3), 4)
    loss = lambda m, b: m(b).pow(2).mean()  # noqa: E731
    w = plain.l1.weight.detach().clone().reshape(-1)
    h = torch.autograd.functional.hessian(lambda t: loss(lambda b: torch.tanh(b @ t.view(3, 3).T) @ t.view(3, 3).T, x),
                                          w)
    s = tt.spectrum(loss, model, x, k=3, progress=False)
    assert s.names == ["l1.weight"]
    torch.testing.assert_close(s.eigenvalues, torch.linalg.eigvalsh(h).flip(0)[:3], rtol=0, atol=1e-10)


def test_a_float32_model_to_float32_resolution_and_seeds_repeat():
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    model = tt.port(copy.deepcopy(plain))
    x, y = _randn((8, 3), 1, torch.float32), _randn((8, 2), 2, torch.float32)
    mse = lambda m, b: F.mse_loss(m(b[0]), b[1])  # noqa: E731
    h = _explicit_hessian(copy.deepcopy(plain).double(), mse, (x.double(), y.double()))
    s = tt.spectrum(mse, model, (x, y), k=3, seed=5, progress=False)
    assert s.eigenvalues.dtype == torch.float32
    torch.testing.assert_close(s.eigenvalues.double(), torch.linalg.eigvalsh(h).flip(0)[:3], rtol=1e-4, atol=1e-5)
    again = tt.spectrum(mse, model, (x, y), k=3, seed=5, progress=False)
    assert torch.equal(s.eigenvalues, again.eigenvalues) and torch.equal(s.eigenvectors, again.eigenvectors)
    assert s.trace(samples=10).value == again.trace(samples=10).value
    other = tt.spectrum(mse, model, (x, y), k=3, seed=6, progress=False)
    torch.testing.assert_close(other.eigenvalues, s.eigenvalues, rtol=1e-4, atol=1e-5)  # the seed moves only rounding
    assert other.trace(samples=10).value != s.trace(samples=10).value  # and the probes


def test_a_dataloader_batch_of_same_shaped_inputs_and_targets_is_not_silently_two_batches():
    """A DataLoader's [x, y] with x and y alike (regression, an autoencoder) reads as a list of two batches as well:
    refused, naming both ways to say which; tuple(batch) gives the (x, y) result."""
    torch.manual_seed(0)
    model = tt.port(nn.Linear(3, 3).to(DTYPE))
    x, y = _randn((6, 3), 1), _randn((6, 3), 2)
    mse = lambda m, b: F.mse_loss(m(b[0]), b[1])  # noqa: E731
    loader_batch = next(iter(torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=6)))
    assert type(loader_batch) is list
    expected = tt.spectrum(mse, model, (x, y), k=1, progress=False).eigenvalues
    with pytest.raises(ValueError, match="one DataLoader batch"):
        tt.spectrum(mse, model, loader_batch, k=1, progress=False)
    with pytest.raises(ValueError, match="one DataLoader batch"):
        tt.landscape(mse, model, loader_batch, steps=3)
    got = tt.spectrum(mse, model, tuple(loader_batch), k=1, progress=False).eigenvalues
    torch.testing.assert_close(got, expected)


# ----------------------------------------------------------------------------------------------------------------
# tt.landscape
# ----------------------------------------------------------------------------------------------------------------

def _conv_bn(train=True):
    torch.manual_seed(2)
    plain = nn.Sequential(nn.Conv2d(2, 3, 3), nn.BatchNorm2d(3), nn.ReLU(), nn.Flatten(), nn.Linear(12, 3)).to(DTYPE)
    with torch.no_grad():
        plain[1].running_mean.normal_()
        plain[1].running_var.uniform_(0.5, 2.0)
    plain.train(train)
    model = tt.port(copy.deepcopy(plain))
    model.train(train)
    g = _gen(11)
    return plain, model, (torch.randn(8, 2, 4, 4, generator=g, dtype=DTYPE), torch.randint(0, 3, (8,), generator=g))


def _by_hand(plain, batches, directions, coefficients):
    """Σ n_b L_b / Σ n_b at θ* + Σ c_i d_i on a fresh copy of the plain twin (its buffers as before)."""
    moved = copy.deepcopy(plain)
    with torch.no_grad():
        for p, *ds in zip(moved.parameters(), *directions):
            p.add_(sum(c * d for c, d in zip(coefficients, ds)))
        sizes = [len(b[1]) for b in batches]
        return sum(float(ce(copy.deepcopy(moved), b)) * n for b, n in zip(batches, sizes)) / sum(sizes)


@pytest.mark.parametrize("train", [True, False], ids=["batchnorm train", "batchnorm eval"])
def test_every_grid_point_is_the_loss_by_hand_and_the_model_is_left_bit_for_bit(train):
    plain, model, (x, y) = _conv_bn(train)
    batches = [(x[:5], y[:5]), (x[5:], y[5:])]  # unequal: weighted by size
    before = _state(model)
    L = tt.landscape(ce, model, batches, steps=3, span=0.7, progress=False)
    assert _same(before, _state(model)) and model.training == train
    assert L.losses.shape == (3, 3)
    torch.testing.assert_close(L.alphas, torch.tensor([-0.7, 0.0, 0.7], dtype=DTYPE), rtol=0, atol=1e-15)
    for i, j in itertools.product(range(3), repeat=2):  # losses[i, j]: alphas[i] along d1, alphas[j] along d2
        expected = _by_hand(plain, batches, L.directions, (L.alphas[i], L.alphas[j]))
        assert float(L.losses[i, j]) == pytest.approx(expected, rel=1e-12, abs=1e-12), (i, j)
    for p, d1, d2 in zip(plain.parameters(), *L.directions):  # filter-normalised, 1-D parameters still
        if p.dim() <= 1:
            assert not d1.any() and not d2.any()
        else:
            for d in (d1, d2):
                norms = p.detach().reshape(len(p), -1).norm(dim=1)
                torch.testing.assert_close(d.reshape(len(d), -1).norm(dim=1), norms)


def test_a_filter_of_zero_norm_gets_a_zero_direction():
    layer = nn.Linear(3, 2).to(DTYPE)
    with torch.no_grad():
        layer.weight[0].zero_()
    model = tt.port(layer)
    mse = lambda m, b: F.mse_loss(m(b[0]), b[1])  # noqa: E731
    L = tt.landscape(mse, model, (_randn((6, 3), 1), _randn((6, 2), 2)), dims=1, steps=3, progress=False)
    d = L.directions[0][0]
    assert torch.isfinite(d).all() and not d[0].any()
    assert float(d[1].norm()) == pytest.approx(float(layer.weight[1].detach().norm()))


@pytest.mark.parametrize("where", ["grid", "eigen", "spectrum"])
def test_an_exception_midway_leaves_parameters_buffers_and_grads_bit_for_bit(where):
    _, model, batch = _conv_bn(train=True)
    for p in model.parameters():
        p.grad = torch.full(p.shape, 7.0, dtype=DTYPE)
    before = _state(model)
    calls = []

    def failing(m, b):
        calls.append(1)
        if len(calls) == 6:
            raise RuntimeError("fails on the 6th call")
        return ce(m, b)

    with pytest.raises(RuntimeError, match="6th call"):
        if where == "spectrum":
            tt.spectrum(failing, model, batch, k=2, progress=False)
        else:
            tt.landscape(failing, model, batch, directions="eigen" if where == "eigen" else "filter-normalized",
                         steps=3, progress=False)
    assert _same(before, _state(model))
    assert all(torch.equal(p.grad, torch.full(p.shape, 7.0, dtype=DTYPE)) for p in model.parameters())
    assert model.training and all(m.training for m in model.modules())


def test_eigen_directions_are_orthonormal_eigenvectors_and_the_grid_follows_them():
    plain, model, batch = _conv_bn(train=False)
    h = _explicit_hessian(plain, ce, batch)
    L = tt.landscape(ce, model, batch, directions="eigen", steps=3, span=0.2, progress=False)
    flat = torch.stack([torch.cat([t.reshape(-1) for t in d]) for d in L.directions])
    torch.testing.assert_close(flat @ flat.T, torch.eye(2, dtype=DTYPE), rtol=0, atol=1e-10)
    exact = torch.linalg.eigvalsh(h).flip(0)[:2]
    for d, value in zip(flat, exact):
        torch.testing.assert_close(h @ d, value * d, rtol=0, atol=1e-6)
    for i, j in [(0, 2), (2, 1)]:
        expected = _by_hand(plain, [batch], L.directions, (L.alphas[i], L.alphas[j]))
        assert float(L.losses[i, j]) == pytest.approx(expected, rel=1e-12, abs=1e-12)


def test_given_directions_flat_or_per_parameter_and_a_module_moves_only_its_parameters():
    plain, model, batch = _conv_bn(train=False)
    before = _state(model)
    shapes = [p.shape for p in plain.parameters()]
    per_parameter = [tuple(_randn(s, 20 + i) for i, s in enumerate(shapes)),
                     tuple(_randn(s, 40 + i) for i, s in enumerate(shapes))]
    flat = [torch.cat([t.reshape(-1) for t in d]) for d in per_parameter]
    a = tt.landscape(ce, model, batch, directions=per_parameter, steps=3, span=0.1, progress=False)
    b = tt.landscape(ce, model, batch, directions=flat, steps=3, span=0.1, progress=False)
    assert torch.equal(a.losses, b.losses)
    assert float(a.losses[0, 2]) == pytest.approx(_by_hand(plain, [batch], per_parameter, (-0.1, 0.1)), rel=1e-12)
    head = tt.landscape(ce, model, batch, module="4", dims=1, steps=3, span=0.5, progress=False)
    assert head.names == ["4.weight", "4.bias"]
    zeros = tuple(torch.zeros(s, dtype=DTYPE) for s in shapes[:-2])
    assert float(head.losses[2]) == pytest.approx(_by_hand(plain, [batch], [zeros + head.directions[0]], (0.5,)),
                                                  rel=1e-12)
    assert _same(before, _state(model))


def test_a_float32_grid_is_the_loss_by_hand_to_float32_rounding():
    torch.manual_seed(3)
    plain = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    model = tt.port(copy.deepcopy(plain))
    x, y = _randn((8, 3), 1, torch.float32), torch.tensor([0, 1] * 4)
    before = _state(model)
    L = tt.landscape(ce, model, (x, y), steps=4, span=0.3, progress=False)
    assert _same(before, _state(model))
    for i, j in [(0, 0), (1, 3), (3, 2)]:
        expected = _by_hand(plain, [(x, y)], L.directions, (L.alphas[i], L.alphas[j]))
        assert float(L.losses[i, j]) == pytest.approx(expected, rel=1e-5)
