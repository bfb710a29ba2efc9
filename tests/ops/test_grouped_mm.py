"""torch._grouped_mm (Mixtral's experts kernel): forward as torch's kernel, gradients as torch autograd of the same
per-group matmuls in float64 (torch's CPU kernel takes float32 / bfloat16 / float16 only, and its own backward fails
on CPU for an expanded gradient) and as finite differences of that float64 form."""
import pytest
import torch

import torchtrace as tt

OFFS = torch.tensor([3, 4, 12], dtype=torch.int32)  # groups of 3, 1 and 8 (torch leaves rows past the last unset)


def per_group(a, b, offs):
    """The math of torch._grouped_mm written as plain matmuls, one per group."""
    if offs is None:
        return a @ b
    bounds = [0, *offs.tolist()]
    groups = list(zip(bounds, bounds[1:]))
    if a.dim() == 2 and b.dim() == 3:
        return torch.cat([a[s:e] @ b[i] for i, (s, e) in enumerate(groups)])
    if a.dim() == 3:
        return torch.cat([a[i] @ b[:, s:e] for i, (s, e) in enumerate(groups)], 1)
    return torch.stack([a[:, s:e] @ b[s:e] for s, e in groups])


LAYOUTS = {
    "2d_3d": ((12, 8), (3, 8, 4), OFFS),
    "3d_2d": ((3, 4, 8), (8, 12), OFFS),
    "2d_2d": ((4, 12), (12, 8), OFFS),
    "3d_3d": ((3, 4, 8), (3, 8, 4), None),
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_grouped_mm_as_torch(layout):
    shape_a, shape_b, offs = LAYOUTS[layout]
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(shape_a, generator=gen), torch.randn(shape_b, generator=gen)
    ours_a, ours_b = tt.tracer(a, requires_grad=True), tt.tracer(b, requires_grad=True)
    y = torch._grouped_mm(ours_a, ours_b, offs=offs)
    with torch.no_grad():
        torch.testing.assert_close(y.detach().as_subclass(torch.Tensor), torch._grouped_mm(a, b, offs=offs))
    cotangent = torch.randn(y.shape, generator=gen)
    y.backward(cotangent)

    theirs_a, theirs_b = a.double().requires_grad_(), b.double().requires_grad_()
    per_group(theirs_a, theirs_b, offs).backward(cotangent.double())
    torch.testing.assert_close(ours_a.grad.double(), theirs_a.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours_b.grad.double(), theirs_b.grad, rtol=1e-5, atol=1e-5)
    assert tt.gradcheck(lambda a, b: per_group(a, b, offs), a.double(), b.double())


def test_grouped_mm_second_derivative_runs_through_its_rules():
    a = tt.tracer(torch.randn(12, 8), requires_grad=True)
    b = tt.tracer(torch.randn(3, 8, 4), requires_grad=True)
    (grad_a,) = tt.grad(torch._grouped_mm(a, b, offs=OFFS).pow(2).sum(), a, create_graph=True)
    (second,) = tt.grad(grad_a.sum(), b)
    theirs_a, theirs_b = (t.detach().as_subclass(torch.Tensor).double().requires_grad_() for t in (a, b))
    (their_grad_a,) = torch.autograd.grad(per_group(theirs_a, theirs_b, OFFS).pow(2).sum(), theirs_a,
                                          create_graph=True)
    (their_second,) = torch.autograd.grad(their_grad_a.sum(), theirs_b)
    torch.testing.assert_close(second.double(), their_second, rtol=1e-4, atol=1e-4)


def test_grouped_mm_with_bias_is_refused_clearly():
    a, b = tt.tracer(torch.randn(12, 8), requires_grad=True), torch.randn(3, 8, 4)
    with pytest.raises(tt.UnsupportedOperationError, match="torch._grouped_mm: bias= and out_dtype="):
        torch._grouped_mm(a, b, offs=OFFS, out_dtype=torch.float32)
