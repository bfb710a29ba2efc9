"""Cases a probe from outside found wrong or unclear in the curvature lab: each result is compared with the exact
Hessian (torch.func, torch.linalg.eigh) or with torch.func's HVP; each bad argument gets an error naming it."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchtrace as tt
from curvature.models import data, loss_fn, mlp, twins

DTYPE = torch.float64


class Quadratic(nn.Module):
    """L(w) = ½ wᵀ A w: its Hessian is A (symmetric)."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.linspace(0.5, 1.5, n, dtype=DTYPE))


def quadratic(model: nn.Module, a: torch.Tensor) -> torch.Tensor:
    return 0.5 * model.w @ a @ model.w


def rotated(eigenvalues: torch.Tensor, seed: int = 0) -> torch.Tensor:
    q, _ = torch.linalg.qr(torch.randn(len(eigenvalues), len(eigenvalues), dtype=DTYPE,
                                       generator=torch.Generator().manual_seed(seed)))
    return q @ torch.diag(eigenvalues.to(DTYPE)) @ q.T


def test_power_iteration_refuses_a_plus_minus_pair_it_cannot_separate():
    """diag(3, −3, 1): it returned 2.79, no eigenvalue at all (a steady Rayleigh quotient of two flipping vectors)."""
    model = tt.port(Quadratic(3))
    with pytest.raises(RuntimeError, match="did not converge.*method='lanczos'"):
        tt.spectrum(quadratic, model, torch.diag(torch.tensor([3.0, -3.0, 1.0], dtype=DTYPE)), k=1, method="power")
    s = tt.spectrum(quadratic, model, torch.diag(torch.tensor([3.0, -3.0, 1.0], dtype=DTYPE)), k=2)
    torch.testing.assert_close(s.eigenvalues, torch.tensor([3.0, 1.0], dtype=DTYPE), rtol=0, atol=1e-12)


@pytest.mark.parametrize("eigenvalues", [[0.0, 0.0, 0.0, 0.0], [3.0, 0.0, 0.0, 0.0], [3.0, 0.0, 0.0, 0.0, 0.0, 0.0]],
                         ids=["zero", "diagonal rank one", "rotated rank one"])
def test_power_iteration_on_zero_curvature_gives_zero_and_orthogonal_eigenvectors(eigenvalues):
    """It gave NaN (0/0 normalising H v = 0), and after deflation a 'second eigenvector' mostly equal to the first."""
    values = torch.tensor(eigenvalues, dtype=DTYPE)
    a = rotated(values) if len(eigenvalues) == 6 else torch.diag(values)
    k = 2 if values.any() else 1
    s = tt.spectrum(quadratic, tt.port(Quadratic(len(eigenvalues))), a, k=k, method="power")
    torch.testing.assert_close(s.eigenvalues, values[:k], rtol=0, atol=1e-12)
    for value, vector in zip(s.eigenvalues, s.eigenvectors):
        torch.testing.assert_close(a @ vector, value * vector, rtol=0, atol=1e-7)
    torch.testing.assert_close(s.eigenvectors @ s.eigenvectors.T, torch.eye(k, dtype=DTYPE), rtol=0, atol=1e-10)
    assert (s.residuals <= 1e-7).all()


def test_lanczos_by_default_runs_until_the_top_k_have_converged():
    """Evenly spaced eigenvalues, k = 8 of 60: the default of max(2k, 20) + k steps left the 8th at 0.601 (0.763)."""
    values = torch.linspace(-1, 1, 60, dtype=DTYPE)
    a = rotated(values, seed=1)
    s = tt.spectrum(quadratic, tt.port(Quadratic(60)), a, k=8, progress=False)
    exact = torch.linalg.eigvalsh(a).flip(0)[:8]
    torch.testing.assert_close(s.eigenvalues, exact, rtol=0, atol=1e-10)
    for value, vector, residual in zip(s.eigenvalues, s.eigenvectors, s.residuals):
        actual = float((a @ vector - value * vector).norm())
        assert actual <= 1e-7 and residual == pytest.approx(actual, abs=1e-9)


def test_batches_are_weighted_by_size_wherever_their_tensors_sit():
    """A batch whose first item is a dict of inputs counted as size 1: two batches of 8 and 2 gave 1.0835, not the
    full-data 0.66697. Every form of the same data now gives the full batch's eigenvalue."""
    plain, model = twins(mlp)
    x, y = data("mlp", n=10)
    dict_loss = lambda m, b: loss_fn(m, (b[0]["x"], b[1]))  # noqa: E731
    whole = tt.spectrum(loss_fn, model, (x, y), k=1, progress=False).eigenvalues
    as_dicts = tt.spectrum(dict_loss, model, [({"x": x[:8]}, y[:8]), ({"x": x[8:]}, y[8:])], k=1,
                           progress=False).eigenvalues
    torch.testing.assert_close(as_dicts, whole, rtol=1e-10, atol=0)
    exact = torch.linalg.eigvalsh(_flat_hessian_of(plain, x, y))[-1]
    torch.testing.assert_close(whole[0], exact, rtol=1e-8, atol=0)
    with pytest.raises(ValueError, match="batch 1 of data holds no tensor"):
        tt.spectrum(lambda m, b: loss_fn(m, (x, y)), model, [(x, "a"), ("no", "tensor")], k=1)


def _flat_hessian_of(plain: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    names = [n for n, _ in plain.named_parameters()]
    shapes = [p.shape for p in plain.parameters()]
    flat = torch.cat([p.detach().reshape(-1) for p in plain.parameters()])

    def loss_of(theta: torch.Tensor) -> torch.Tensor:
        pieces = dict(zip(names, [t.reshape(s) for t, s in zip(theta.split([s.numel() for s in shapes]), shapes)]))
        return loss_fn(lambda inputs: torch.func.functional_call(plain, pieces, (inputs,)), (x, y))

    return torch.func.hessian(loss_of)(flat)


def test_a_dataloader_batch_is_one_batch():
    """DataLoader yields [x, y] (a list): it was read as two batches, and loss_fn failed inside on b = x."""
    _, model = twins(mlp)
    x, y = data("mlp", n=10)
    loader_batch = next(iter(torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=10)))
    assert type(loader_batch) is list
    ce = lambda m, b: F.cross_entropy(m(b[0]), b[1])  # noqa: E731
    torch.testing.assert_close(tt.spectrum(ce, model, loader_batch, k=2, progress=False).eigenvalues,
                               tt.spectrum(ce, model, (x, y), k=2, progress=False).eigenvalues, rtol=1e-12, atol=0)


@pytest.mark.parametrize("method", ["forward-over-reverse", "reverse-over-reverse"])
def test_hvp_hessian_and_spectrum_work_inside_no_grad_as_torch_func(method):
    """An outer torch.no_grad() (evaluation code) made them raise "f's result does not depend on the parameters"."""
    x = torch.tensor([1.0, 2.0], dtype=DTYPE)
    v = torch.tensor([1.0, 0.0], dtype=DTYPE)
    f = lambda z: (z[0] ** 3 + z[0] * z[1])  # noqa: E731
    expected = torch.func.jvp(torch.func.grad(f), (x,), (v,))[1]
    with torch.no_grad():
        torch.testing.assert_close(tt.hvp(f, x, v, method=method), expected, rtol=0, atol=1e-12)
        torch.testing.assert_close(tt.hessian(f, x, method=method), torch.func.hessian(f)(x), rtol=0, atol=1e-12)
        s = tt.spectrum(quadratic, tt.port(Quadratic(2)), torch.diag(torch.tensor([2.0, 1.0], dtype=DTYPE)), k=1,
                        hvp_method=method)
    torch.testing.assert_close(s.eigenvalues, torch.tensor([2.0], dtype=DTYPE), rtol=0, atol=1e-12)


def test_a_function_of_nothing_has_a_zero_hessian_as_torch_func():
    x, v = torch.tensor([1.0, 2.0], dtype=DTYPE), torch.tensor([1.0, 0.0], dtype=DTYPE)
    constant = lambda z: torch.tensor(1.0, dtype=DTYPE)  # noqa: E731
    torch.testing.assert_close(tt.hvp(constant, x, v), torch.zeros(2, dtype=DTYPE))
    torch.testing.assert_close(tt.hessian(constant, x), torch.zeros(2, 2, dtype=DTYPE))


def test_dropout_in_train_mode_draws_the_same_masks_at_every_evaluation():
    """Each HVP drew new masks: the same seed gave [0.6976, 0.6575], then [1.3103, 0.6700] (Lanczos on a different
    matrix each step), and the caller's random state moved. Now the masks are fixed per batch, as torch.func's HVP of
    the loss with those masks, which is what the result is compared with."""
    torch.manual_seed(0)
    model = tt.port(nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5), nn.Tanh(), nn.Linear(8, 3)).to(DTYPE))
    x, y = torch.randn(16, 4, dtype=DTYPE), torch.randint(0, 3, (16,))
    ce = lambda m, b: F.cross_entropy(m(b[0]), b[1])  # noqa: E731
    state = torch.get_rng_state()
    first = tt.spectrum(ce, model, (x, y), k=2, seed=3, progress=False)
    second = tt.spectrum(ce, model, (x, y), k=2, seed=3, progress=False)
    assert torch.equal(torch.get_rng_state(), state)
    torch.testing.assert_close(first.eigenvalues, second.eigenvalues, rtol=0, atol=0)
    for value, vector in zip(first.eigenvalues, first.eigenvectors):  # eigenpairs of one symmetric matrix
        torch.testing.assert_close(first.hvp(vector), value * vector, rtol=0, atol=1e-7)
    landscapes = [tt.landscape(ce, model, (x, y), dims=1, steps=5, seed=3, progress=False).losses for _ in range(2)]
    torch.testing.assert_close(landscapes[0], landscapes[1], rtol=0, atol=0)


def test_a_direction_given_per_parameter_must_have_each_parameters_shape():
    """(randn(3), randn(12)) for a Linear(4, 3)'s (weight, bias) was accepted: the pieces were flattened and re-split,
    the bias's direction landing in the weight."""
    model = tt.port(nn.Linear(4, 3).to(DTYPE))
    x, y = torch.randn(6, 4, dtype=DTYPE), torch.randint(0, 3, (6,))
    ce = lambda m, b: F.cross_entropy(m(b[0]), b[1])  # noqa: E731
    with pytest.raises(ValueError, match=r"piece for weight has shape \(3,\), the parameter \(3, 4\)"):
        tt.landscape(ce, model, (x, y), directions=[(torch.randn(3), torch.randn(12))], dims=1, steps=3)
    good = (torch.randn(3, 4, dtype=DTYPE), torch.randn(3, dtype=DTYPE))
    L = tt.landscape(ce, model, (x, y), directions=[good], dims=1, steps=3, progress=False)
    torch.testing.assert_close(L.directions[0][0], good[0])


def _setup():
    model = tt.port(nn.Linear(4, 3).to(DTYPE))
    batch = (torch.randn(6, 4, dtype=DTYPE), torch.randint(0, 3, (6,)))
    ce = lambda m, b: F.cross_entropy(m(b[0]), b[1])  # noqa: E731
    return model, batch, ce


BAD_CALLS = {
    "seed=1.5": (lambda m, b, f: tt.spectrum(f, m, b, k=1, seed=1.5), TypeError, "seed must be an integer"),
    "landscape seed=None": (lambda m, b, f: tt.landscape(f, m, b, seed=None), TypeError, "seed must be an integer"),
    "dims=2.0": (lambda m, b, f: tt.landscape(f, m, b, dims=2.0), TypeError, "dims must be an integer"),
    "dims=True": (lambda m, b, f: tt.landscape(f, m, b, dims=True), TypeError, "dims must be an integer"),
    "module=3": (lambda m, b, f: tt.spectrum(f, m, b, k=1, module=3), TypeError, "module names a sub-module"),
    "module='nope'": (lambda m, b, f: tt.spectrum(f, m, b, k=1, module="nope"), ValueError, "module='nope' names no"),
    "hvp_method='x'": (lambda m, b, f: tt.spectrum(f, m, b, k=1, hvp_method="x"), ValueError, "hvp_method must be"),
    "data=None": (lambda m, b, f: tt.spectrum(f, m, None, k=1), TypeError, "data is a batch"),
    "model='m'": (lambda m, b, f: tt.spectrum(f, "m", b, k=1), TypeError, "model must be a torch.nn.Module"),
    "directions=None": (lambda m, b, f: tt.landscape(f, m, b, directions=None), TypeError, "directions is one of"),
    "directions=['eigen']": (lambda m, b, f: tt.landscape(f, m, b, directions=["eigen"], dims=1), TypeError,
                             "a direction is a flat tensor"),
    "loss_fn returns a vector": (lambda m, b, f: tt.landscape(lambda m, b: m(b[0]).sum(1), m, b, steps=2), ValueError,
                                 "loss_fn.*must return the batch's scalar loss"),
    "loss_fn returns None": (lambda m, b, f: tt.landscape(lambda m, b: None, m, b, steps=2), ValueError,
                             "loss_fn.*must return the batch's scalar loss; it returned NoneType"),
    "hvp of the wrong length": (lambda m, b, f: tt.spectrum(f, m, b, k=1).hvp(torch.ones(3)), ValueError,
                                "flat vector of the 15 parameter elements"),
    "vector(5) of 1": (lambda m, b, f: tt.spectrum(f, m, b, k=1).vector(5), IndexError, "counts the 1 eigenvectors"),
    "project([])": (lambda m, b, f: tt.landscape(f, m, b, dims=1, steps=2).project([]), ValueError, "at least one"),
    "project(3)": (lambda m, b, f: tt.landscape(f, m, b, dims=1, steps=2).project(3), ValueError,
                   "a list of the checkpoints"),
    "project a flat vector of the wrong length": (
        lambda m, b, f: tt.landscape(f, m, b, dims=1, steps=2).project([torch.ones(5)]), ValueError,
        r"a flat checkpoint has one entry per parameter element \(15\), not 5"),
    "project a parameter list without the bias": (
        lambda m, b, f: tt.landscape(f, m, b, dims=1, steps=2).project([[m.weight.detach()]]), ValueError,
        r"a checkpoint given per parameter has one tensor for each of the 2 parameters \['weight', 'bias'\], not 1"),
    "project a number": (lambda m, b, f: tt.landscape(f, m, b, dims=1, steps=2).project([3]), TypeError,
                         "a checkpoint is a flat tensor or one tensor per parameter"),
    "filter-normalized directions of 1-D parameters only": (
        lambda m, b, f: tt.landscape(f, tt.port(nn.LayerNorm(4).to(DTYPE)), b, steps=2), ValueError,
        r"every parameter moved \(weight, bias\) is 1-D.*directions='eigen'"),
    "eigen directions of more dims than parameter elements": (
        lambda m, b, f: tt.landscape(quadratic, tt.port(Quadratic(1)), torch.eye(1, dtype=DTYPE), directions="eigen",
                                     dims=2, steps=2), ValueError, "dims=2 needs 2 eigenvectors.*1 element.*dims=1"),
    "hvp of an integer v": (
        lambda m, b, f: tt.hvp(lambda w: (w ** 3).sum(), torch.ones(2, dtype=DTYPE), torch.tensor([1, 0])), ValueError,
        r"tt.hvp: v\[0\]: expected a floating-point tangent"),
    "hvp of a complex v for real params": (
        lambda m, b, f: tt.hvp(lambda w: (w ** 3).sum(), torch.ones(2, dtype=DTYPE), torch.ones(2, dtype=torch.cfloat)),
        ValueError, r"tt.hvp: v\[0\] is complex .* params\[0\] is real .* call tt.hvp with the real part"),
    "a batch holding NaN": (
        lambda m, b, f: tt.spectrum(f, m, (b[0].index_fill(0, torch.tensor([2]), float("nan")), b[1]), k=1),
        ValueError, r"tt.spectrum: the Hessian-vector product on batch 0 is not finite \(its loss is nan\)"),
}


@pytest.mark.parametrize("case", list(BAD_CALLS))
def test_bad_arguments_are_named(case):
    call, error, message = BAD_CALLS[case]
    with pytest.raises(error, match=message):
        call(*_setup())
