"""float16 / bfloat16 gradients as accurate as torch's: rules whose backward squares, sums or subtracts low-precision
values compute in float32 (ops/opmath.py), as torch's kernels do. Each case is one that lost its gradient before: an
overflow to inf (an exact 0, or NaN from 0 * inf), an underflow, or a cancellation (30% off). Each gradient is
compared with torch autograd's in the same dtype and with a float64 reference (torch autograd on float64 copies,
itself checked against central differences)."""
import pytest
import torch
import torch.nn.functional as F

import torchtrace as tt

H, B = torch.float16, torch.bfloat16
GROUPED = torch.tensor([[[300.0], [-300.0], [10.0], [0.0]]], dtype=H)  # one group of 4 channels, deviations of 300


def _sdpa_inputs():
    generator = torch.Generator().manual_seed(0)
    return [(torch.randn(shape, generator=generator) * 5).to(B) for shape in ((4, 3, 8), (4, 6, 8), (4, 6, 8))]


CASES = {
    "rms_norm": (lambda x, w: F.rms_norm(x, (4,), w), lambda: [torch.tensor([[300.0, -200, 100, 50]], dtype=H),
                                                                torch.ones(4, dtype=H)], [[1.0, 0, 0, 0]]),
    "group_norm": (lambda x: F.group_norm(x, 1), lambda: [GROUPED.clone()], [[[1.0], [0], [0], [0]]]),
    "native_group_norm": (lambda x: torch.native_group_norm(x, None, None, 1, 4, 1, 1, 1e-5)[0],
                          lambda: [GROUPED.clone()], [[[1.0], [0], [0], [0]]]),
    "gelu_tanh": (lambda x: F.gelu(x, approximate="tanh"), lambda: [torch.tensor([1000.0, -1000.0, 300.0, 1.0],
                                                                                 dtype=H)], None),
    "gaussian_nll": (lambda x, t, v: F.gaussian_nll_loss(x, t, v, reduction="sum"),
                     lambda: [torch.tensor([0.01], dtype=H), torch.tensor([0.0], dtype=H),
                              torch.tensor([2e-4], dtype=H)], None),
    "weight_norm": (lambda v, g: torch._weight_norm(v, g, 0),
                    lambda: [torch.full((1, 8), 100.0, dtype=H) + torch.arange(8, dtype=H), torch.ones(1, 1, dtype=H)],
                    [[0.5, -1.0, 0.25, 2.0, -0.75, 1.5, -0.5, 1.0]]),
    "normalize": (lambda x: F.normalize(x, dim=-1), lambda: [torch.tensor([[300.0, 200.0, 100.0]], dtype=H)],
                  [[1.0, 0, 0]]),
    "rsqrt": (torch.rsqrt, lambda: [torch.tensor([1e-3], dtype=H)], [3.0]),
    "softmax_bf16": (lambda x: torch.softmax(x, 0), lambda: [torch.tensor([-0.0674, 4.8125, -7.4062, -6.625, -3.4688],
                                                                          dtype=B)],
                     [0.6602, 0.2676, 0.0618, 0.6211, -0.4512]),
    "log_softmax_bf16": (lambda x: torch.log_softmax(x, 0),
                         lambda: [torch.tensor([-0.0674, 4.8125, -7.4062, -6.625], dtype=B)],
                         [0.6602, 0.2676, 0.0618, -2.0]),
    "sdpa_bf16_causal": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), _sdpa_inputs, None),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_low_precision_gradient_is_as_accurate_as_torchs(name):
    fn, make, upstream = CASES[name]
    values = make()
    dtype = values[0].dtype
    ours = [tt.tracer(v.clone(), requires_grad=True) for v in values]
    theirs = [v.clone().requires_grad_() for v in values]
    exact = [v.double().requires_grad_() for v in values]
    out = fn(*theirs)
    g = torch.ones_like(out) if upstream is None else torch.tensor(upstream, dtype=dtype)
    if name == "sdpa_bf16_causal":
        g = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(dtype)
    ours_grads = tt.grad(fn(*ours), ours, g)
    theirs_grads = torch.autograd.grad(out, theirs, g)
    exact_grads = torch.autograd.grad(fn(*exact), exact, g.double())
    eps = torch.finfo(dtype).eps
    for mine, torchs, reference in zip(ours_grads, theirs_grads, exact_grads):
        mine = mine.as_subclass(torch.Tensor)
        assert mine.dtype == torchs.dtype == dtype
        assert mine.isfinite().all() and reference.isfinite().all()
        error, torch_error = ((t.double() - reference).abs().max() for t in (mine, torchs))
        assert error <= 4 * torch_error + 4 * eps * reference.abs().max(), (float(error), float(torch_error))


def test_the_float64_references_agree_with_central_differences():
    """The references above are torch autograd in float64; spot-check two against central differences."""
    x = torch.tensor([[300.0, -200, 100, 50]], dtype=torch.float64, requires_grad=True)
    (grad,) = torch.autograd.grad(F.rms_norm(x, (4,))[0, 0], x)
    numeric = torch.stack([(F.rms_norm(x.detach() + e, (4,))[0, 0] - F.rms_norm(x.detach() - e, (4,))[0, 0]) / 2e-6
                           for e in torch.eye(4, dtype=torch.float64).unsqueeze(1) * 1e-6])
    torch.testing.assert_close(grad[0], numeric, rtol=1e-6, atol=1e-9)
    v = torch.tensor([2e-4], dtype=torch.float64, requires_grad=True)
    x, t = torch.tensor([0.01], dtype=torch.float64), torch.tensor([0.0], dtype=torch.float64)
    (grad,) = torch.autograd.grad(F.gaussian_nll_loss(x, t, v, reduction="sum"), v)
    numeric = (F.gaussian_nll_loss(x, t, v.detach() + 1e-9, reduction="sum")
               - F.gaussian_nll_loss(x, t, v.detach() - 1e-9, reduction="sum")) / 2e-9
    torch.testing.assert_close(grad, numeric.reshape(1), rtol=1e-5, atol=1e-3)


FUSED = {"tanh": torch.tanh, "sigmoid": torch.sigmoid, "silu": F.silu, "mish": F.mish, "selu": F.selu,
         "celu": lambda x: F.celu(x, 0.7), "elu": lambda x: F.elu(x, 1.3), "hardswish": F.hardswish,
         "softplus": lambda x: F.softplus(x, beta=2.0)}


@pytest.mark.parametrize("dtype", [B, H])
@pytest.mark.parametrize("name", sorted(FUSED))
def test_activations_round_their_gradient_where_torchs_kernels_do(name, dtype):
    """torch's fused backward kernels (tanh_backward, silu_backward, ...) compute a float16 / bfloat16 gradient in
    float32 and round it once; torchtrace's formulas do too (in_float32): bit for bit. (Before, each step rounded to
    the low dtype: up to 4 bfloat16 ulps off. In float32 / float64 torch's vectorised kernels differ from the
    formulas by an ulp at most.) The formulas are checked against central differences in float64 by their own
    tests (tests/nn/test_activation.py, tests/ops/test_pointwise.py)."""
    f = FUSED[name]
    generator = torch.Generator().manual_seed(3)
    x = (torch.randn(6, 8, generator=generator) * 3).to(dtype)
    g = torch.randn(6, 8, generator=generator).to(dtype)
    theirs = x.clone().requires_grad_()
    f(theirs).backward(g)
    ours = tt.tracer(x, requires_grad=True)
    f(ours).backward(g)
    assert ours.grad.dtype == dtype
    assert torch.equal(ours.grad, theirs.grad), (ours.grad - theirs.grad).abs().max()
