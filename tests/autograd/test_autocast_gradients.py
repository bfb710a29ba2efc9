"""Gradients of ops recorded under torch.autocast equal torch autograd's under the same autocast, bit for bit.

torch casts a listed op's inputs before it runs and records its backward on the cast copies, outside autocast
(torchtrace/autograd/autocast.py). Ops that are on no list (mv, addr, outer, bilinear) keep their float32 backward;
lower-precision ops whose backward is elementwise (a 1-D matmul, prelu's weight) read the cast copies; float32-list
ops (linalg.inv, cross_entropy, grid_sample) run in float32 on a low-precision input. float64 inputs are never cast by
autocast: the same functions in float64 under autocast are checked against central differences too.
"""
import contextlib

import pytest
import torch
import torch.nn.functional as F

import torchtrace as tt

CASES = {
    "mv": (lambda a, v: torch.mv(a.t(), v), [(2, 3), (2,)]),
    "addr": (lambda v, u: torch.addr(torch.zeros(2, 3, dtype=v.dtype), v, u), [(2,), (3,)]),
    "outer": (lambda v, u: torch.outer(v, u), [(2,), (3,)]),
    "matmul_1d": (lambda a, b: a @ b, [(4,), (4,)]),
    "prelu": (lambda x, w: F.prelu(x, w), [(3, 4), (1,)]),
    "inv": (lambda a: torch.linalg.inv(a @ a.t() + 3 * torch.eye(3, dtype=a.dtype)), [(3, 3)]),
    "bilinear": (lambda a, b, w: F.bilinear(a, b, w), [(3, 4), (3, 5), (2, 4, 5)]),
    "cross_entropy_of_a_product": (lambda a, b: F.cross_entropy(a @ b, torch.tensor([0, 2, 1])), [(3, 4), (4, 5)]),
    "cat_of_a_product_and_input": (lambda a, b, c: torch.cat([a @ b, c]), [(3, 4), (4, 5), (2, 5)]),
    "grid_sample_of_a_product": (lambda a, b, g: F.grid_sample((a @ b).reshape(1, 1, 3, 3), g.tanh(),
                                                               align_corners=False), [(3, 4), (4, 3), (1, 2, 2, 2)]),
    "einsum": (lambda a, b: torch.einsum("ij,jk->ik", a, b), [(3, 4), (4, 5)]),
    "linear_relu_mse": (lambda x, w, b: F.mse_loss(F.relu(F.linear(x, w, b)), torch.ones(3, 2, dtype=x.dtype)),
                        [(3, 4), (2, 4), (2,)]),
}
# torch's fused float32 kernels for these sum in another order than their formulas (1 ulp apart without autocast too):
# float32's default tolerance; before autocast was followed their gradients were 0.02-0.5% off
FUSED_KERNELS = {"bilinear", "grid_sample_of_a_product"}


def _gradients(f, inputs, make, dtype, upstream_seed=3):
    leaves = [make(x.clone()) for x in inputs]
    with torch.autocast("cpu", dtype=dtype):
        out = f(*leaves)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(upstream_seed)).to(out.dtype)
    out.backward(g)
    return out, [leaf.grad for leaf in leaves]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", sorted(CASES))
def test_gradients_under_autocast_equal_torchs(name, dtype):
    f, shapes = CASES[name]
    torch.manual_seed(1)
    inputs = [torch.randn(*s) for s in shapes]
    theirs, their_grads = _gradients(f, inputs, lambda t: t.requires_grad_(), dtype)
    ours, our_grads = _gradients(f, inputs, lambda t: tt.tracer(t, requires_grad=True), dtype)
    assert ours.dtype == theirs.dtype
    torch.testing.assert_close(ours.detach().as_subclass(torch.Tensor), theirs.detach(), rtol=0, atol=0)
    for mine, reference in zip(our_grads, their_grads):
        assert type(mine) is torch.Tensor and mine.dtype == reference.dtype == torch.float32
        if name in FUSED_KERNELS:
            torch.testing.assert_close(mine, reference)
        else:
            torch.testing.assert_close(mine, reference, rtol=0, atol=0)


@pytest.mark.parametrize("name", sorted(CASES))
def test_float64_under_autocast_is_not_cast_and_matches_central_differences(name):
    f, shapes = CASES[name]
    torch.manual_seed(2)
    inputs = [torch.randn(*s, dtype=torch.float64) for s in shapes]
    out, grads = _gradients(f, inputs, lambda t: tt.tracer(t, requires_grad=True), torch.bfloat16)
    assert out.dtype == torch.float64
    upstream = torch.randn(out.shape, generator=torch.Generator().manual_seed(3)).to(torch.float64)
    eps = 1e-6
    for i, x in enumerate(inputs):
        numeric = torch.zeros_like(x)
        for j in range(x.numel()):
            values = []
            for sign in (1, -1):
                moved = [y.clone() for y in inputs]
                moved[i].view(-1)[j] += sign * eps
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    values.append((f(*moved) * upstream).sum())
            numeric.view(-1)[j] = (values[0] - values[1]) / (2 * eps)
        torch.testing.assert_close(grads[i], numeric, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("readable", [False, True])
def test_a_second_derivative_through_autocasts_copy_of_a_saved_input_equals_torchs(readable):
    """matmul under autocast saves bf16 copies of its inputs; a backward with create_graph=True computes with them, so
    the second derivative has a term through each copy back to its input (torch records the cast: ToCopyBackward).
    h = x . w, g = dh^2/dw = 2 h x, d(sum g)/dx = 2 sum(x) w + 2 h: [7, -5] here (the 2h term came through the copy)."""
    x0, w0 = torch.tensor([0.5, 1.5]), torch.tensor([2.0, -1.0])
    results = []
    for make, grad in ((lambda t: tt.as_tracer(t.clone(), requires_grad=True), tt.grad),
                       (lambda t: t.clone().requires_grad_(), torch.autograd.grad)):
        x, w = make(x0), make(w0)
        with tt.readable() if readable else contextlib.nullcontext():
            with torch.autocast("cpu", dtype=torch.bfloat16):
                h = x @ w
            g, = grad(h * h, w, create_graph=True)
            r, = grad(g.sum(), x)
        results.append(r.as_subclass(torch.Tensor))
    assert results[0].tolist() == results[1].tolist() == [7.0, -5.0]
    penalty = []  # a gradient penalty on a Linear layer trained under autocast
    for make, grad in ((lambda t: tt.as_tracer(t.clone(), requires_grad=True), tt.grad),
                       (lambda t: t.clone().requires_grad_(), torch.autograd.grad)):
        x, w = make(torch.tensor([[0.5, 1.5]])), make(torch.tensor([[2.0, -1.0], [0.25, 0.75]]))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = F.linear(x, w).float().pow(2).sum()
        gx, = grad(y, x, create_graph=True)
        penalty.append(grad(gx.pow(2).sum(), w)[0].as_subclass(torch.Tensor))
    assert penalty[0].tolist() == penalty[1].tolist() == [[-8.5, -39.5], [-3.25, 25.25]]  # = central differences


PROMOTED = [  # (autocast dtype, the inputs' dtypes in order): torch's promote list decides in order
    (torch.bfloat16, [torch.float32, torch.float16]), (torch.bfloat16, [torch.float16, torch.float32]),
    (torch.bfloat16, [torch.bfloat16, torch.float32]), (torch.float16, [torch.bfloat16, torch.bfloat16]),
    (torch.bfloat16, [torch.bfloat16, torch.float16]), (torch.bfloat16, [torch.float64, torch.bfloat16]),
    (torch.float16, [torch.float16, torch.float16])]


@pytest.mark.parametrize("op", [torch.cat, torch.stack])
@pytest.mark.parametrize("low, dtypes", PROMOTED)
def test_the_promote_list_gives_torchs_dtype_or_torchs_error(op, low, dtypes):
    """float32 once a float32 input came first, the autocast dtype for its own; another low dtype met before any
    float32 input raises in torch: here too, never a silent float32."""
    def run(make):
        leaves = [make(torch.ones(2, dtype=d)) for d in dtypes]
        with torch.autocast("cpu", dtype=low):
            return op(leaves)

    try:
        expected = run(lambda t: t.requires_grad_())
    except RuntimeError:
        with pytest.raises(RuntimeError, match="Unexpected floating ScalarType in at::autocast::prioritize"):
            run(lambda t: tt.tracer(t, requires_grad=True))
        return
    assert run(lambda t: tt.tracer(t, requires_grad=True)).dtype == expected.dtype


def test_a_weight_used_twice_in_a_region_sums_its_gradients_in_float32_where_torch_sums_in_the_low_dtype():
    """torch's cast cache gives both uses one bfloat16 copy: the two gradients meet in bfloat16, then one cast.
    torchtrace casts each use's gradient to float32 and sums there (docs/precision.md): exactly the float32 sum of
    torch's gradients of the two uses apart, and torch's own within bfloat16's rounding."""
    torch.manual_seed(0)
    w, x = torch.randn(16, 16), torch.randn(4, 16)

    def twice(x, w):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return F.linear(torch.tanh(F.linear(x, w)), w).float().sum()

    ours = tt.tracer(w.clone(), requires_grad=True)
    twice(tt.tracer(x), ours).backward()
    theirs = w.clone().requires_grad_(True)
    twice(x, theirs).backward()
    apart = [w.clone().requires_grad_(True) for _ in range(2)]  # each use with its own leaf: one cast each
    twice_apart = lambda x, a, b: F.linear(torch.tanh(F.linear(x, a)), b).float().sum()  # noqa: E731
    with torch.autocast("cpu", dtype=torch.bfloat16):
        twice_apart(x, *apart).backward()
    torch.testing.assert_close(ours.grad, apart[0].grad + apart[1].grad, rtol=0, atol=0)
    torch.testing.assert_close(ours.grad, theirs.grad, rtol=1e-2, atol=1e-2)
