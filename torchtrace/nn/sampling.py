"""Spatial sampling: F.affine_grid (a linear map of theta) and F.grid_sample (interpolation at given points).

affine_grid:  grid[n, s, i] = sum_j theta[n, i, j] b[s, j]   (b: the base grid (x, y[, z], 1) of the output)
              ->  dtheta[n, i, j] = sum_s g[n, s, i] b[s, j]

grid_sample:  the grid's coordinates are unnormalised to pixel positions c_k (per padding_mode clipped or
              reflected), then  y[n, c, q] = sum over taps t of  w_t(c(q)) x[n, c, p_t(q)]   (taps outside x are 0)
              bilinear / trilinear: the 2^n corners around c, w = prod_k (1 - |c_k - p_k|)
              nearest:  the one pixel round(c) (half to even), w = 1, no gradient for the grid
              bicubic:  the 4 x 4 pixels around c, w = cubic convolution weights (A = -0.75); padding applies to
                        each tap's position, not to c
    ->  dx[n, c, p] = sum_{q, t: p_t(q) = p} w_t g[n, c, q]                              (a scatter_add)
        dgrid[n, q, k] = (dc_k / dgrid_k) sum_{c, t} g[n, c, q] x[n, c, p_t(q)] dw_t / dc_k
    with dc_k / dgrid_k = (size_k - 1) / 2 (align_corners) or size_k / 2, times 0 or +-1 where padding clips or
    reflects (torch's convention: 0 exactly on a clipping border).
"""
import itertools
import math
import warnings
from typing import List, Tuple

import torch
import torch.nn.functional as F

from torchtrace.autograd.function import Function, register
from torchtrace.errors import UnsupportedOperationError

CUBIC_A = -0.75


@register(F.affine_grid)
class AffineGrid(Function):
    """grid = b theta^T (b: the output's base grid, rows (x, y[, z], 1))  ->  dtheta = g^T b"""

    @staticmethod
    def forward(ctx, theta, size, align_corners=None):
        ctx.base = _base_grid(theta, list(size), align_corners)
        return F.affine_grid(theta, size, align_corners)

    @staticmethod
    def backward(ctx, g):
        n, k = g.shape[0], g.shape[-1]
        base = ctx.base.to(g.dtype)  # (j, points)
        return g.reshape(n, -1, k).transpose(1, 2) @ base.transpose(0, 1), None, None


def _base_grid(theta: torch.Tensor, size: List[int], align_corners: object) -> torch.Tensor:
    """b[j, s]: affine_grid of the unit matrices E_0j (row 0 = e_j), which picks column j of the base grid."""
    columns = theta.shape[-1]
    units = torch.zeros((columns, *theta.shape[1:]), dtype=theta.dtype, device=theta.device)
    units[torch.arange(columns), 0, torch.arange(columns)] = 1
    with warnings.catch_warnings():  # the user's own call has already warned about unit-size grids
        warnings.simplefilter("ignore")
        grid = F.affine_grid(units, [columns, *size[1:]], align_corners)
    return grid[..., 0].reshape(columns, -1)


def _unnormalize(coord: torch.Tensor, size: int, align_corners: bool) -> Tuple[torch.Tensor, float]:
    """Grid coordinate in [-1, 1] -> pixel position, and its derivative (torch's formula, same rounding)."""
    if align_corners:
        return ((coord + 1) / 2) * (size - 1), (size - 1) / 2
    return ((coord + 1) * size - 1) / 2, size / 2


def _clip(c: torch.Tensor, size: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Clip to [0, size - 1]; slope 1 strictly inside, 0 on and beyond the borders (torch's convention)."""
    inside = (c > 0) & (c < size - 1)
    return c.clamp(0, size - 1), inside.to(c.dtype)


def _reflect(c: torch.Tensor, twice_low: int, twice_high: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Reflect c into [low, high] (mirror images repeat); slope +-1.

    Which mirror image c falls in is found on c's value (fmod, floor); the result is that image plus
    slope * (c - value), which is exactly the image and carries slope +-1 when create_graph records this.
    """
    if twice_low == twice_high:
        return torch.zeros_like(c), torch.zeros_like(c)
    value = c.detach()
    low, span = twice_low / 2, (twice_high - twice_low) / 2
    shifted = value - low
    sign = torch.where(shifted < 0, -1.0, 1.0).to(c.dtype)
    shifted = shifted.abs()
    extra, flips = torch.fmod(shifted, span), torch.floor(shifted / span)
    odd = torch.remainder(flips, 2) == 1
    slope = torch.where(odd, -sign, sign)
    return torch.where(odd, span - extra + low, extra + low) + slope * (c - value), slope


def _pad_coordinate(c: torch.Tensor, size: int, padding_mode: str, align_corners: bool
                    ) -> Tuple[torch.Tensor, torch.Tensor]:
    """torch's compute_source_index: padding applied to a pixel position, and its slope."""
    if padding_mode == "border":
        return _clip(c, size)
    if padding_mode == "reflection":
        c, slope = _reflect(c, 0, 2 * (size - 1)) if align_corners else _reflect(c, -1, 2 * size - 1)
        c, clip_slope = _clip(c, size)
        return c, slope * clip_slope
    return c, torch.ones_like(c)


def _cubic_weights(t: torch.Tensor) -> Tuple[list, list]:
    """Cubic convolution weights of the taps at floor - 1 .. floor + 2, and their derivatives in t."""
    a = CUBIC_A

    def near(x: torch.Tensor) -> torch.Tensor:
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x: torch.Tensor) -> torch.Tensor:
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    def near_slope(x: torch.Tensor) -> torch.Tensor:
        return (3 * (a + 2) * x - 2 * (a + 3)) * x

    def far_slope(x: torch.Tensor) -> torch.Tensor:
        return (3 * a * x - 10 * a) * x + 8 * a

    weights = [far(t + 1), near(t), near(1 - t), far(2 - t)]
    slopes = [far_slope(t + 1), near_slope(t), -near_slope(1 - t), -far_slope(2 - t)]
    return weights, slopes


def _taps(coord: torch.Tensor, size: int, mode: str, padding_mode: str, align_corners: bool) -> list:
    """Along one dim: [(pixel index, inside x?, weight, d weight / d grid coordinate)] per tap."""
    c, unnorm_slope = _unnormalize(coord, size, align_corners)
    if mode == "bicubic":  # padding applies to each tap, not to c
        low = torch.floor(c)
        weights, slopes = _cubic_weights(c - low)
        taps = []
        for i in range(4):
            position, _ = _pad_coordinate(low + (i - 1), size, padding_mode, align_corners)
            taps.append((position, weights[i], slopes[i] * unnorm_slope))
    else:
        c, pad_slope = _pad_coordinate(c, size, padding_mode, align_corners)
        slope = pad_slope * unnorm_slope
        if mode == "nearest":
            taps = [(torch.round(c), torch.ones_like(c), torch.zeros_like(c))]
        else:
            low = torch.floor(c)
            taps = [(low, (low + 1) - c, -slope), (low + 1, c - low, slope)]
    return [(p.long().clamp(0, size - 1), (p >= 0) & (p <= size - 1), w, dw) for p, w, dw in taps]


@register(F.grid_sample)
class GridSample(Function):
    """y[n, c, q] = sum_t w_t(c(q)) x[n, c, p_t(q)]  ->  dx = scatter_add of w_t g at p_t,
    dgrid_k = (dc_k/dgrid_k) sum_{c,t} g x[p_t] dw_t/dc_k  (bilinear / trilinear corners, nearest, bicubic 4 x 4);
    c(q) = grid point q in pixels, p_t(q) = its corners, w_t = their interpolation weights"""

    @staticmethod
    def forward(ctx, input, grid, mode="bilinear", padding_mode="zeros", align_corners=None):
        if mode not in ("bilinear", "nearest", "bicubic") or padding_mode not in ("zeros", "border", "reflection"):
            raise UnsupportedOperationError(
                f"torch.nn.functional.grid_sample: mode={mode!r}, padding_mode={padding_mode!r} has no gradient rule"
                " — use mode 'bilinear', 'nearest' or 'bicubic' and padding_mode 'zeros', 'border' or 'reflection'")
        ctx.options = (mode, padding_mode, bool(align_corners))
        ctx.save_for_backward(input, grid)
        return F.grid_sample(input, grid, mode, padding_mode, align_corners)

    @staticmethod
    def backward(ctx, g):
        x, grid = ctx.saved_tensors
        mode, padding_mode, align_corners = ctx.options
        n_batch, channels, *sizes = x.shape
        dims = len(sizes)
        points = grid.reshape(n_batch, math.prod(grid.shape[1:-1]), dims)
        # grid coordinate k addresses spatial dim dims - 1 - k (x: width, the last dim)
        taps = [_taps(points[..., k], sizes[dims - 1 - k], mode, padding_mode, align_corners) for k in range(dims)]
        strides = [math.prod(sizes[dims - k:]) for k in range(dims)]  # stride of grid coordinate k's dim
        flat_x = x.reshape(n_batch, channels, math.prod(sizes))
        flat_g = g.reshape(n_batch, channels, points.shape[1])
        need_x, need_grid = ctx.needs_input_grad[:2]
        dx = torch.zeros_like(flat_x) if need_x else None
        dgrid = [torch.zeros_like(points[..., 0]) for _ in range(dims)] if need_grid else None
        for combination in itertools.product(*taps):
            index = sum(p * s for (p, _, _, _), s in zip(combination, strides))
            inside = combination[0][1]
            for _, ok, _, _ in combination[1:]:
                inside = inside & ok
            weights = [w * inside for _, _, w, _ in combination]
            index = index.unsqueeze(1).expand(n_batch, channels, -1)
            if need_x:
                dx = dx.scatter_add(2, index, flat_g * math.prod(weights).unsqueeze(1))
            if need_grid and mode != "nearest":
                seen = (flat_g * flat_x.gather(2, index)).sum(1)
                for k in range(dims):
                    others = math.prod(w for j, w in enumerate(weights) if j != k) if dims > 1 else 1
                    dgrid[k] = dgrid[k] + seen * (combination[k][3] * inside) * others
        grad_grid = torch.stack(dgrid, -1).reshape(grid.shape) if need_grid else None
        return (dx.reshape(x.shape) if need_x else None), grad_grid
