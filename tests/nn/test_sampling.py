"""F.affine_grid and F.grid_sample rules against torch autograd, finite differences, and at pixel borders."""
import itertools

import pytest
import torch
import torch.nn.functional as F
from helpers import check_op, double_backward_matches, non_contiguous

import torchtrace as tt

pytestmark = pytest.mark.filterwarnings("ignore:Since version 1.3.0, affine_grid")

torch.manual_seed(0)
X = torch.randn(2, 2, 5, 4)
GRID = torch.rand(2, 3, 4, 2) * 2.6 - 1.3  # generic points, some outside [-1, 1]
X3 = torch.randn(1, 2, 4, 3, 5)
GRID3 = torch.rand(1, 3, 2, 2, 3) * 2.6 - 1.3
OPTIONS = list(itertools.product(["bilinear", "nearest", "bicubic"], ["zeros", "border", "reflection"], [False, True]))


@pytest.mark.parametrize("corners", [False, True])
@pytest.mark.parametrize("fn, theta", [
    (lambda t, c: F.affine_grid(t, [2, 3, 4, 5], align_corners=c), torch.randn(2, 2, 3)),
    (lambda t, c: F.affine_grid(t, (1, 1, 1, 6), c), torch.randn(1, 2, 3)),
    (lambda t, c: F.affine_grid(t, torch.Size([2, 3, 4, 5, 3]), align_corners=c), torch.randn(2, 3, 4)),
    (lambda t, c: F.affine_grid(t * t.sum(), [2, 3, 4, 5], align_corners=c), non_contiguous(torch.randn(2, 2, 3))),
])
def test_affine_grid(fn, theta, corners):
    check_op(lambda t: fn(t, corners), theta)


@pytest.mark.parametrize("mode, padding_mode, corners", OPTIONS, ids=str)
def test_grid_sample_2d(mode, padding_mode, corners):
    fn = lambda x, grid: F.grid_sample(x, grid, mode, padding_mode, corners)  # noqa: E731
    check_op(fn, X, GRID, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mode, padding_mode, corners", [o for o in OPTIONS if o[0] != "bicubic"], ids=str)
def test_grid_sample_3d(mode, padding_mode, corners):
    fn = lambda x, grid: F.grid_sample(x, grid, mode, padding_mode, corners)  # noqa: E731
    check_op(fn, X3, GRID3, rtol=1e-4, atol=1e-5)


def _border_grid(width: int) -> torch.Tensor:
    """Points exactly on pixel centres, pixel borders, the [-1, 1] ends and the reflection/clipping kinks."""
    xs = torch.tensor([-1.5, -1.25, -1.0, -0.5, 0.0, 0.5, 1.0, 1.25, 1.5, -1 - 2 / width, -1 + 1 / width,
                       1 - 1 / width, 1 + 1 / width, -1 + 2 / (width - 1), 1 + 2 / (width - 1)], dtype=torch.float64)
    gx, gy = torch.meshgrid(xs, xs, indexing="ij")
    return torch.stack([gx, gy], -1)[None].expand(2, -1, -1, -1).contiguous()


@pytest.mark.parametrize("mode, padding_mode, corners", OPTIONS, ids=str)
def test_grid_sample_at_non_differentiable_points_follows_torch(mode, padding_mode, corners):
    """At kinks (pixel borders, clipping edges) finite differences are meaningless: compare with torch autograd."""
    fn = lambda x, grid: F.grid_sample(x, grid, mode, padding_mode, corners)  # noqa: E731
    check_op(fn, X.double(), _border_grid(4), gradcheck=False)
    grid3 = _border_grid(4)
    grid3 = torch.stack([grid3[..., 0], grid3[..., 1], grid3[..., 0].flip(1)], -1)[:1, None]
    if mode != "bicubic":
        check_op(fn, X3.double(), grid3, gradcheck=False)


@pytest.mark.parametrize("fn, inputs", [
    (lambda x, g: F.grid_sample(x, g, align_corners=False), (X, GRID)),  # defaults: bilinear, zeros
    (lambda x, g: F.grid_sample(x, g * 1.5, "bilinear", "reflection", True) * x.sum(), (non_contiguous(X), GRID)),
    (lambda x, g: F.grid_sample(x, g, "bicubic", align_corners=True), (torch.randn(0, 2, 5, 4), GRID[:0])),
    (lambda x, g: F.grid_sample(x, F.affine_grid(g, [2, 2, 6, 5], False), align_corners=False),
     (X, torch.randn(2, 2, 3) * 0.7)),  # a spatial transformer
    (lambda x, g: F.grid_sample(x, g, "bilinear", "border", False), (X.double(), GRID.double())),
])
def test_grid_sample_forms(fn, inputs):
    check_op(fn, *inputs, rtol=1e-4, atol=1e-5)


def test_grid_sample_only_one_needs_a_gradient():
    x, grid = tt.tracer(X, requires_grad=True), tt.tracer(GRID)
    F.grid_sample(x, grid, align_corners=False).sum().backward()
    assert x.grad is not None and grid.grad is None
    x, grid = tt.tracer(X), tt.tracer(GRID, requires_grad=True)
    F.grid_sample(x, grid, "bicubic", align_corners=False).sum().backward()
    assert grid.grad.shape == GRID.shape


def test_grid_sample_second_derivative_matches_finite_differences():
    """create_graph=True through the grid_sample rule (torch has no double backward for grid_sampler)."""
    x, grid = X.double()[:1, :2, :4, :4], GRID.double()[:1, :2, :2]

    def gradient_norm(grid_values: torch.Tensor) -> tuple:
        a, b = tt.tracer(x, requires_grad=True), tt.tracer(grid_values, requires_grad=True)
        ga, gb = tt.grad((F.grid_sample(a, b, "bicubic", "zeros", False) ** 2).sum(), [a, b], create_graph=True)
        return ga.sum() + (gb * gb).sum(), b

    value, b = gradient_norm(grid)
    (analytic,) = tt.grad(value, [b])
    numeric = torch.zeros_like(grid).reshape(-1)
    for i in range(grid.numel()):
        step = torch.zeros_like(grid).reshape(-1)
        step[i] = 1e-6
        up, down = (gradient_norm(grid + sign * step.reshape(grid.shape))[0].item() for sign in (1, -1))
        numeric[i] = (up - down) / 2e-6
    torch.testing.assert_close(analytic.as_subclass(torch.Tensor), numeric.reshape(grid.shape), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mode, padding_mode, corners", OPTIONS, ids=str)
def test_grid_sample_double_backward(mode, padding_mode, corners):
    double_backward_matches(lambda x, grid: F.grid_sample(x, grid, mode, padding_mode, corners) ** 2,
                            X.double()[:1], GRID.double()[:1] * 1.5)
    double_backward_matches(lambda theta: F.affine_grid(theta, [1, 1, 3, 4], corners) ** 3,
                            torch.randn(1, 2, 3).double())
