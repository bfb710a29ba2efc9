"""tt.landscape: the grid's losses are the loss at θ* + α d₁ + β d₂ (computed here with plain torch), the
directions are filter-normalised or Hessian eigenvectors, and the model is left exactly as it was."""
import matplotlib
import pytest
import torch

import torchtrace as tt
from curvature.models import cnn_with_batchnorm_eval, data, flat_hessian, loss_fn, mlp, twins

matplotlib.use("Agg")


def moved_loss(plain, batch, directions, coefficients):
    """The loss of the plain twin at θ* + Σ c_i d_i."""
    with torch.no_grad():
        saved = [p.clone() for p in plain.parameters()]
        for c, direction in zip(coefficients, directions):
            for p, d in zip(plain.parameters(), direction):
                p.add_(c * d)
        value = float(loss_fn(plain, batch))
        for p, s in zip(plain.parameters(), saved):
            p.copy_(s)
    return value


def test_two_dimensional_filter_normalized_grid_and_the_model_left_as_it_was():
    plain, model = twins(cnn_with_batchnorm_eval)
    batch = data("cnn", n=8)
    before = [t.clone() for t in [*model.parameters(), *model.buffers()]]
    L = tt.landscape(loss_fn, model, batch, steps=5, span=0.5, progress=False)
    assert L.losses.shape == (5, 5) and L.alphas.shape == (5,)
    assert all(torch.equal(a, b) for a, b in zip(before, [*model.parameters(), *model.buffers()]))
    for i, j in [(0, 0), (1, 3), (4, 2), (2, 2)]:
        expected = moved_loss(plain, batch, L.directions, (L.alphas[i], L.alphas[j]))
        assert float(L.losses[i, j]) == pytest.approx(expected, abs=1e-12)
    assert float(L.losses[2, 2]) == pytest.approx(float(loss_fn(plain, batch).detach()), abs=1e-12)
    conv_weight, conv_bias = L.directions[0][0], L.directions[0][1]
    filters = conv_weight.reshape(3, -1).norm(dim=1)
    torch.testing.assert_close(filters, plain[0].weight.detach().reshape(3, -1).norm(dim=1))  # filter-normalised
    assert torch.equal(conv_bias, torch.zeros_like(conv_bias))


def test_one_dimensional_eigen_direction_curves_as_the_top_eigenvalue_says():
    plain, model = twins(mlp)
    batch = data("mlp", n=32)
    L = tt.landscape(loss_fn, model, batch, directions="eigen", dims=1, steps=5, span=1e-3, progress=False)
    top = torch.linalg.eigvalsh(flat_hessian(plain, batch))[-1]
    h = float(L.alphas[3] - L.alphas[2])
    curvature = (L.losses[3] - 2 * L.losses[2] + L.losses[1]) / h ** 2  # d²L/dα² along a unit eigenvector
    assert float(curvature) == pytest.approx(float(top), rel=1e-4)


def test_a_training_path_projects_onto_its_coordinates_and_plots():
    plain, model = twins(mlp)
    batch = data("mlp", n=16)
    L = tt.landscape(loss_fn, model, batch, steps=3, progress=False)
    origin = {n: p.detach().clone() for n, p in plain.named_parameters()}
    path = [{n: origin[n] + a * d1 + b * d2 for n, d1, d2 in zip(origin, *L.directions)}
            for a, b in [(0.1, -0.2), (0.5, 0.25)]]
    torch.testing.assert_close(L.project(path), torch.tensor([[0.1, -0.2], [0.5, 0.25]], dtype=torch.float64))
    ax = L.plot(path=path)
    assert ax.get_lines()[-1].get_xydata().shape == (2, 2)


def test_given_directions_must_fit():
    _, model = twins(mlp)
    with pytest.raises(ValueError, match="one entry per parameter"):
        tt.landscape(loss_fn, model, data("mlp"), directions=[torch.ones(3)], dims=1)
    with pytest.raises(ValueError, match="directions must be"):
        tt.landscape(loss_fn, model, data("mlp"), directions="random")


@pytest.mark.parametrize("steps", [1, 0, -3])
def test_fewer_than_two_steps_are_refused(steps):
    _, model = twins(mlp)
    with pytest.raises(ValueError, match="steps must be at least 2"):
        tt.landscape(loss_fn, model, data("mlp"), steps=steps, dims=1)


def test_one_dimensional_plot_marks_the_path_on_the_curve():
    plain, model = twins(mlp)
    batch = data("mlp", n=16)
    L = tt.landscape(loss_fn, model, batch, dims=1, steps=5, span=0.5, progress=False)
    assert L.losses.shape == (5,)
    origin = {n: p.detach().clone() for n, p in plain.named_parameters()}
    path = [{n: origin[n] + a * d for n, d in zip(origin, L.directions[0])} for a in (0.25, -0.5)]
    torch.testing.assert_close(L.project(path)[:, 0], torch.tensor([0.25, -0.5], dtype=torch.float64))
    marked = L.plot(path=path).get_lines()[-1].get_xydata()
    assert marked[:, 0].tolist() == pytest.approx([0.25, -0.5])
    assert marked[1, 1] == pytest.approx(float(L.losses[0]))  # α = -0.5 is the first grid point
