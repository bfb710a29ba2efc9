"""aten-level norms and samplers (torchtrace/nn/native.py) against torch autograd and finite differences."""
import pytest
import torch
from helpers import check_op, double_backward_matches

import torchtrace as tt

aten = torch.ops.aten
_gen = torch.Generator().manual_seed(0)
X = torch.randn(4, 6, 5, generator=_gen, dtype=torch.float64)
W = torch.randn(6, generator=_gen, dtype=torch.float64)
B = torch.randn(6, generator=_gen, dtype=torch.float64)
OUT_W = torch.randn(4, 6, 5, generator=_gen, dtype=torch.float64)


def stats():
    return torch.zeros(6, dtype=torch.float64), torch.ones(6, dtype=torch.float64)


@pytest.mark.parametrize("affine", [True, False])
def test_native_layer_norm(affine):
    if affine:
        check_op(lambda x, w, b: torch.native_layer_norm(x, [5], w, b, 1e-5)[0] * OUT_W, X, W[:5], B[:5])
    else:
        check_op(lambda x: torch.native_layer_norm(x, [6, 5], None, None, 1e-5)[0] * OUT_W, X)
    double_backward_matches(lambda x: torch.native_layer_norm(x, [5], None, None, 1e-5)[0] * OUT_W, X)


@pytest.mark.parametrize("groups", [1, 2, 6])
def test_native_group_norm_all_three_outputs(groups):
    def fn(x, w, b):
        y, mean, rstd = torch.native_group_norm(x, w, b, 4, 6, 5, groups, 1e-5)
        return (y * OUT_W).sum() + (mean * W[:groups]).sum() + (rstd * 0.3).sum()
    check_op(fn, X, W, B)
    double_backward_matches(lambda x: torch.native_group_norm(x, None, None, 4, 6, 5, groups, 1e-5)[0] * OUT_W, X)


@pytest.mark.parametrize("training", [True, False])
def test_native_batch_norm_and_its_running_stats(training):
    def fn(x, w, b):
        return torch.native_batch_norm(x, w, b, *stats(), training, 0.1, 1e-5)[0] * OUT_W
    check_op(fn, X, W, B)
    ours, theirs = stats(), stats()
    torch.native_batch_norm(tt.tracer(X, requires_grad=True), W, B, *ours, training, 0.1, 1e-5)
    torch.native_batch_norm(X, W, B, *theirs, training, 0.1, 1e-5)
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs))


@pytest.mark.parametrize("form", ["legit", "legit_no_stats", "with_update"])
def test_native_batch_norm_spellings(form):
    calls = {
        "legit": lambda x, w, b: torch._native_batch_norm_legit(x, w, b, *stats(), True, 0.1, 1e-5),
        "legit_no_stats": lambda x, w, b: torch._native_batch_norm_legit(x, w, b, True, 0.1, 1e-5),
        "with_update": lambda x, w, b: aten._batch_norm_with_update(x, w, b, *stats(), 0.1, 1e-5),
    }
    check_op(lambda x, w, b: calls[form](x, w, b)[0] * OUT_W, X, W, B)


@pytest.mark.parametrize("form", ["native_batch_norm", "native_layer_norm", "with_update"])
def test_norm_statistics_outputs_are_constants_as_torch(form):
    """torch marks the statistics outputs non-differentiable (requires_grad False: constants in a loss); torchtrace
    refused a loss that used them. The gradient equals torch's (finite differences would see the statistics move)."""
    calls = {"native_batch_norm": lambda x, w, b: torch.native_batch_norm(x, w, b, None, None, True, 0.1, 1e-5),
             "native_layer_norm": lambda x, w, b: torch.native_layer_norm(x, list(X.shape[1:]), None, None, 1e-5),
             "with_update": lambda x, w, b: aten._batch_norm_with_update(x, w, b, *stats(), 0.1, 1e-5)}
    outputs = calls[form](tt.tracer(X, requires_grad=True), W, B)
    assert outputs[0].requires_grad and not any(t.requires_grad for t in outputs[1:])
    assert tt.check(lambda x, w, b: (lambda o: (o[0] * OUT_W).sum() + (o[1] * o[2]).sum())(calls[form](x, w, b)),
                    X, W, B).ok


@pytest.mark.parametrize("mode", [0, 1, 2])
@pytest.mark.parametrize("padding", [0, 1, 2])
@pytest.mark.parametrize("align_corners", [False, True])
def test_grid_sampler_2d(mode, padding, align_corners):
    x = torch.randn(2, 3, 4, 5, generator=_gen, dtype=torch.float64)
    grid = torch.rand(2, 3, 2, 2, generator=_gen, dtype=torch.float64) * 2.4 - 1.2
    grads = dict(gradcheck=mode != 1)  # nearest: piecewise constant in the grid
    check_op(lambda a, g: torch.grid_sampler_2d(a, g, mode, padding, align_corners).sin(), x, grid, **grads)


def test_grid_sampler_3d():
    x = torch.randn(1, 2, 3, 3, 3, generator=_gen, dtype=torch.float64)
    grid = torch.rand(1, 2, 2, 1, 3, generator=_gen, dtype=torch.float64) * 2 - 1
    check_op(lambda a, g: torch.grid_sampler_3d(a, g, 0, 0, False).sin(), x, grid)


@pytest.mark.parametrize("size, scales", [((3, 4), None), ((7, 9), None), (None, (0.5, 0.7))])
def test_upsample_bilinear2d_aa(size, scales):
    x = torch.randn(2, 2, 6, 8, generator=_gen, dtype=torch.float64)
    check_op(lambda a: aten._upsample_bilinear2d_aa(a, output_size=size, align_corners=False,
                                                    scale_factors=scales).sin(), x)
    if size is not None:
        check_op(lambda a: aten._upsample_bilinear2d_aa.default(a, size, True).sin(), x)
        check_op(lambda a: aten._upsample_bilinear2d_aa(a, size, False, scales_h=None, scales_w=None).sin(), x)
        check_op(lambda a: aten._upsample_bilinear2d_aa(a, size, False, None, None).sin(), x)  # (a TypeError)
