"""tt.spectrum against the full Hessian (torch.func.hessian, torch.linalg.eigvalsh) of a 99-parameter MLP."""
import pytest
import torch

import torchtrace as tt
from curvature.models import cnn_with_batchnorm_eval, data, flat_hessian, loss_fn, mlp, twins


@pytest.fixture(scope="module")
def mlp_case():
    plain, ported = twins(mlp)
    batch = data("mlp", n=32)
    hessian = flat_hessian(plain, batch)
    return ported, batch, hessian, torch.linalg.eigvalsh(hessian).flip(0)


def test_lanczos_top_eigenvalues_and_vectors_are_the_hessians(mlp_case):
    model, batch, hessian, exact = mlp_case
    assert hessian.shape == (99, 99)
    s = tt.spectrum(loss_fn, model, batch, k=3, iterations=60, progress=False)
    torch.testing.assert_close(s.eigenvalues, exact[:3], rtol=0, atol=1e-8)
    for value, vector in zip(s.eigenvalues, s.eigenvectors):
        torch.testing.assert_close(hessian @ vector, value * vector, rtol=0, atol=1e-7)
    assert [tuple(t.shape) for t in s.vector(0)] == [tuple(p.shape) for p in model.parameters()]


def test_power_iteration_finds_the_largest_magnitude_eigenvalue(mlp_case):
    model, batch, _, exact = mlp_case
    s = tt.spectrum(loss_fn, model, batch, k=1, method="power", iterations=3000, progress=False)
    largest = exact[exact.abs().argmax()]
    torch.testing.assert_close(s.eigenvalues[0], largest, rtol=1e-6, atol=0)


def test_hutchinson_trace_is_within_three_standard_errors(mlp_case):
    model, batch, hessian, _ = mlp_case
    estimate = tt.spectrum(loss_fn, model, batch, k=1, iterations=5, progress=False).trace(samples=60)
    assert estimate.stderr > 0 and estimate.samples == 60
    assert abs(estimate.value - float(hessian.trace())) < 3 * estimate.stderr


def test_density_integrates_to_one_and_its_nodes_span_the_spectrum(mlp_case):
    model, batch, _, exact = mlp_case
    density = tt.spectrum(loss_fn, model, batch, k=1, iterations=5, progress=False).density(iterations=40, runs=2)
    torch.testing.assert_close(density.weights.sum(dim=1), torch.ones(2, dtype=torch.float64), rtol=0, atol=1e-10)
    t = density.grid(4000)
    assert abs(float(torch.trapezoid(density(t), t)) - 1.0) < 1e-6
    assert float(density.nodes.max()) == pytest.approx(float(exact[0]), abs=1e-8)  # Lanczos finds the extremes


def test_a_module_gives_its_diagonal_block_over_a_list_of_batches(mlp_case):
    model, batch, hessian, _ = mlp_case
    x, y = batch
    halves = [(x[:20], y[:20]), (x[20:], y[20:])]  # unequal batches: weighted by size, the full-batch Hessian
    s = tt.spectrum(loss_fn, model, halves, k=1, module="2", iterations=39, progress=False)
    block = hessian[-39:, -39:]  # the last Linear: weight (3×12) and bias (3)
    assert s.names == ["2.weight", "2.bias"]
    torch.testing.assert_close(s.eigenvalues[0], torch.linalg.eigvalsh(block)[-1], rtol=0, atol=1e-8)


def test_reverse_over_reverse_gives_the_same_spectrum_and_buffers_are_kept():
    plain, model = twins(cnn_with_batchnorm_eval)
    model.train()  # BatchNorm updates its running statistics on every forward: the spectrum must restore them
    before = [b.clone() for b in model.buffers()]
    batch = data("cnn", n=8)
    a = tt.spectrum(loss_fn, model, batch, k=2, iterations=20, progress=False)
    b = tt.spectrum(loss_fn, model, batch, k=2, iterations=20, progress=False, hvp_method="reverse-over-reverse")
    torch.testing.assert_close(a.eigenvalues, b.eigenvalues, rtol=0, atol=1e-9)
    assert all(torch.equal(x, y) for x, y in zip(before, model.buffers()))


def test_spectrum_refuses_a_plain_model_and_a_one_shot_iterator():
    with pytest.raises(TypeError, match="tt.port"):
        tt.spectrum(loss_fn, mlp(), data("mlp"), k=1)
    _, model = twins(mlp)
    with pytest.raises(TypeError, match="iterator"):
        tt.spectrum(loss_fn, model, iter([data("mlp")]), k=1)
    with pytest.raises(ValueError, match="method"):
        tt.spectrum(loss_fn, model, data("mlp"), k=1, method="arnoldi")


def test_a_data_loader_gives_the_full_batch_spectrum(mlp_case):
    model, batch, _, exact = mlp_case
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(*batch), batch_size=10)  # 10, 10, 10, 2
    s = tt.spectrum(loss_fn, model, loader, k=1, iterations=60, progress=False)
    torch.testing.assert_close(s.eigenvalues[0], exact[0], rtol=0, atol=1e-8)


def test_long_runs_show_a_progress_bar_and_short_ones_do_not(mlp_case, capsys):
    model, batch, _, _ = mlp_case
    tt.spectrum(loss_fn, model, batch, k=1, iterations=60)  # 60 passes over the data: long
    assert "Lanczos" in capsys.readouterr().err
    tt.spectrum(loss_fn, model, batch, k=1, iterations=10).trace(samples=10)
    assert capsys.readouterr().err == ""
    tt.spectrum(loss_fn, model, batch, k=1, iterations=10, progress=True)
    assert "Lanczos" in capsys.readouterr().err


def test_the_density_plot_draws_the_smoothed_density(mlp_case):
    import matplotlib

    matplotlib.use("Agg")
    model, batch, _, _ = mlp_case
    density = tt.spectrum(loss_fn, model, batch, k=1, iterations=5, progress=False).density(iterations=20, runs=1)
    ax = density.plot()
    (line,) = ax.get_lines()
    assert line.get_xydata().shape == (1000, 2) and ax.get_yscale() == "log"


def _mse_case(scale: float = 1.0):
    """A linear layer under MSE: H = 2/(N m) I_m ⊗ XᵀX, so every eigenvalue occurs once per output (twice here)."""
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(8, 3, generator=g, dtype=torch.float64), torch.randn(8, 2, generator=g, dtype=torch.float64)
    torch.manual_seed(0)
    layer = torch.nn.Linear(3, 2, bias=False).double()
    w = layer.weight.detach().clone()

    def flat_loss(theta):
        return scale * torch.nn.functional.mse_loss(x @ theta.view(2, 3).T, y)

    exact = torch.linalg.eigvalsh(torch.autograd.functional.hessian(flat_loss, w.reshape(-1))).flip(0)
    model = tt.port(layer)
    return model, (x, y), (lambda m, b: scale * torch.nn.functional.mse_loss(m(b[0]), b[1])), exact


def test_repeated_eigenvalues_come_back_as_often_as_they_occur():
    """A Krylov space holds each distinct eigenvalue once: Lanczos goes on from a new vector where it closes."""
    model, batch, loss, exact = _mse_case()
    assert torch.allclose(exact[0], exact[1]) and torch.allclose(exact[2], exact[3])  # each eigenvalue twice
    for k in (2, 4, 6):
        s = tt.spectrum(loss, model, batch, k=k, progress=False)
        torch.testing.assert_close(s.eigenvalues, exact[:k], rtol=1e-10, atol=1e-12)
        gram = s.eigenvectors @ s.eigenvectors.T
        torch.testing.assert_close(gram, torch.eye(k, dtype=torch.float64), rtol=0, atol=1e-8)


@pytest.mark.parametrize("scale", [1.0, 1e-9, 1e-12])
def test_lanczos_stopping_scales_with_the_hessian(scale):
    model, batch, loss, exact = _mse_case(scale)
    s = tt.spectrum(loss, model, batch, k=3, progress=False)
    torch.testing.assert_close(s.eigenvalues / scale, exact[:3] / scale, rtol=1e-8, atol=0)


def test_fewer_iterations_than_eigenvalues_asked_for_is_refused():
    model, batch, loss, _ = _mse_case()
    with pytest.raises(ValueError, match="iterations >= k"):
        tt.spectrum(loss, model, batch, k=4, iterations=2, progress=False)


def test_parameters_of_two_dtypes_keep_their_own_dtype():
    """A float32 layer feeding a float64 one: each parameter's piece of a direction is cast to its dtype."""
    torch.manual_seed(0)
    first, second = torch.nn.Linear(3, 3), torch.nn.Linear(3, 2).double()
    g = torch.Generator().manual_seed(2)
    x, y = torch.randn(6, 3, generator=g), torch.randn(6, 2, generator=g, dtype=torch.float64)
    values = [p.detach().clone() for p in (*first.parameters(), *second.parameters())]
    sizes = [v.numel() for v in values]

    def flat_loss(theta):  # θ in float64; each piece used in its parameter's dtype, as in the model
        w1, b1, w2, b2 = (t.view(v.shape).to(v.dtype) for t, v in zip(theta.split(sizes), values))
        return torch.nn.functional.mse_loss(torch.tanh(x @ w1.T + b1).double() @ w2.T + b2, y)

    theta = torch.cat([v.reshape(-1).double() for v in values])
    exact = torch.linalg.eigvalsh(torch.autograd.functional.hessian(flat_loss, theta)).flip(0)
    model = tt.port(torch.nn.ModuleDict({"first": first, "second": second}))

    def loss(m, batch):
        hidden = torch.tanh(m["first"](batch[0])).double()
        return torch.nn.functional.mse_loss(hidden @ m["second"].weight.T + m["second"].bias, batch[1])

    s = tt.spectrum(loss, model, (x, y), k=2, progress=False)
    assert s.eigenvectors.dtype == torch.float64
    torch.testing.assert_close(s.eigenvalues, exact[:2], rtol=1e-5, atol=1e-6)


def test_data_without_a_batch_is_refused_with_what_is_wrong():
    model, _, loss, _ = _mse_case()
    with pytest.raises(ValueError, match="no batch"):
        tt.spectrum(loss, model, [], k=1, progress=False)
    with pytest.raises(ValueError, match="no batch"):
        tt.landscape(loss, model, [], steps=3)


@pytest.mark.parametrize("call, error, message", [
    (lambda m, d: tt.spectrum(loss_fn, m, d, k=2.5, progress=False), TypeError, "k must be an integer"),
    (lambda m, d: tt.spectrum(loss_fn, m, d, k="3", progress=False), TypeError, "k must be an integer"),
    (lambda m, d: tt.spectrum(loss_fn, m, d, k=2, iterations=3.5, progress=False), TypeError, "iterations"),
    (lambda m, d: tt.spectrum(loss_fn, m, d, k=2, method="power", iterations=0, progress=False), ValueError,
     "iterations must be at least 1"),
    (lambda m, d: tt.spectrum(loss_fn, m, d, k=1, progress=False).density(iterations=0), ValueError, "iterations"),
    (lambda m, d: tt.spectrum(loss_fn, m, d, k=1, progress=False).density(runs=-1), ValueError, "runs"),
    (lambda m, d: tt.spectrum(loss_fn, m, d, k=1, progress=False).density(sigma=0), ValueError, "sigma"),
    (lambda m, d: tt.spectrum(loss_fn, m, d, k=1, progress=False).trace(samples=2.7), TypeError, "samples"),
    (lambda m, d: tt.landscape(loss_fn, m, d, steps=3.5, dims=1, progress=False), TypeError, "steps"),
    (lambda m, d: tt.landscape(loss_fn, m, d, span=float("nan"), dims=1, progress=False), ValueError, "span"),
    (lambda m, d: tt.landscape(loss_fn, m, d, span=0, dims=1, progress=False), ValueError, "span"),
])
def test_counts_and_scales_of_the_wrong_kind_are_refused_by_name(call, error, message):
    """Each failed deep inside (slicing, torch.zeros, a division by sigma = 0) or returned nothing."""
    _, model = twins(mlp)
    with pytest.raises(error, match=message):
        call(model, data("mlp"))
