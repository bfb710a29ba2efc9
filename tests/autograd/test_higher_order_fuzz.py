"""Higher-order differentiation hunted for silent wrong gradients: create_graph=True double and triple backward of
~60 ops and layers, seeded random programs (views, in-place ops on intermediate results), gradient-penalty training,
Hessian-vector products, tt.grad of intermediate values, hooks, retain_graph and no_grad blocks, each in eager
torchtrace and through tt.compile (its calls after the first replay the recorded program), against torch autograd on
float64 tensors, and against finite differences where torch itself is wrong (the third derivatives of its native
layer_norm / batch_norm / instance_norm kernels: torch 2.13 differentiates their double-backward formulas wrongly)."""
import copy
import random

import pytest
import torch
import torch.nn.functional as F

import torchtrace as tt

D = torch.float64
RTOL, ATOL = 1e-7, 1e-9


def plain(t):
    return None if t is None else t.detach().as_subclass(torch.Tensor)


def torch_leaf(x, needs):
    x = x.clone()
    return x.requires_grad_(True) if needs and x.is_floating_point() else x


def tt_leaf(x, needs):
    return tt.tracer(x.clone(), requires_grad=needs) if x.is_floating_point() else x


def derivatives(fn, inputs, grad, leaf, order, seed=0, last_scalar=False):
    """[<out, v>], then the gradient of the previous scalar w.r.t. every floating input, `order` times: each next
    scalar is <gradients, fresh random vectors>, so order k is a k-th derivative contracted with random directions.
    last_scalar: the scalar made of the last gradients instead (its derivative is the next order's)."""
    g = torch.Generator().manual_seed(seed)
    xs = [leaf(x, True) for x in inputs]
    ws = [x for x in xs if x.is_floating_point()]
    out = fn(*xs)
    outs = out if isinstance(out, (tuple, list)) else (out,)
    current = sum((o * torch.randn(o.shape, generator=g, dtype=o.dtype)).sum() for o in outs)
    results = [[plain(current)]]
    for k in range(order):
        if not current.requires_grad:  # the previous derivative is constant: this one is zero
            results.append([torch.zeros_like(plain(w)) for w in ws])
            current = torch.zeros((), dtype=D)
            continue
        grads = grad(current, ws, create_graph=k < order - 1, allow_unused=True)
        grads = [torch.zeros_like(plain(w)) if gr is None else gr for gr, w in zip(grads, ws)]
        results.append([plain(gr) for gr in grads])
        current = sum((gr * torch.randn(w.shape, generator=g, dtype=w.dtype)).sum() for gr, w in zip(grads, ws))
    return plain(current) if last_scalar else results


def assert_same(got, expected, what, rtol=RTOL, atol=ATOL):
    for k, (a, b) in enumerate(zip(got, expected)):
        for j, (x, y) in enumerate(zip(a, b)):
            torch.testing.assert_close(x, y, rtol=rtol, atol=atol, equal_nan=True,
                                       msg=lambda m: f"{what}: derivative of order {k}, input {j}: {m}")


def r(*shape):
    return torch.randn(*shape, dtype=D)


def _cases():
    torch.manual_seed(0)
    a, b = r(3, 4), r(3, 4)
    pos = torch.rand(3, 4, dtype=D) + 0.5
    unit = torch.rand(3, 4, dtype=D) * 1.6 - 0.8
    labels = torch.tensor([0, 3, 1])
    index = torch.tensor([[0, 0], [3, 1], [2, 2]])
    return {
        "mul_div": (lambda x, y: x * y / (y * y + 1), [a, b]),
        "pow_tensor": (lambda x, y: x.abs().add(0.5) ** y, [a, b]),
        "pow_scalar": (lambda x: x ** 3 + x.abs() ** 1.5, [a]),
        "rpow": (lambda x: 2.0 ** x, [a]),
        "tensor_where": (lambda x, y: x.where(x > 0, y) * x * y, [a, b]),
        "rsub_rdiv": (lambda x: (2.0 - x) ** 3 + 1.5 / (x * x + 1), [a]),
        "exp_log1p_expm1": (lambda x: torch.log(x.exp() + 1) + torch.log1p(x.abs()) * torch.expm1(x), [a]),
        "sqrt_rsqrt_reciprocal": (lambda x: torch.sqrt(x) + torch.rsqrt(x) + torch.reciprocal(x), [pos]),
        "trig": (lambda x: x.sin() * x.cos() + torch.tan(x * 0.3) + torch.asin(x * 0.5) + torch.atan(x), [unit]),
        "hyperbolic": (lambda x: torch.sinh(x) * torch.cosh(x) + torch.asinh(x) + torch.tanh(x), [a]),
        "atan2_hypot": (lambda x, y: torch.atan2(x, y) + torch.hypot(x, y), [a, b]),
        "activations": (lambda x: F.elu(x) + F.selu(x) + F.gelu(x) + F.gelu(x, approximate="tanh") + F.silu(x)
                        + F.mish(x) + F.softplus(x, beta=2.0, threshold=5.0) + F.logsigmoid(x) + F.softsign(x), [a]),
        "kinks": (lambda x: F.relu(x) ** 2 + F.leaky_relu(x, 0.1) ** 3 + F.hardtanh(x) * x + x.abs() * x
                  + torch.clamp(x, -0.5, 0.5) * x, [a]),
        "erf_erfinv_lgamma": (lambda x: torch.erf(x) + torch.erfinv(x) + torch.lgamma(x + 2) + torch.digamma(x + 2),
                              [unit]),
        "max_min_where": (lambda x, y: torch.maximum(x, y) * torch.minimum(x, y) ** 2
                          + torch.where(x > 0, x * y, y ** 2), [a, b]),
        "addcmul_addcdiv_lerp": (lambda x, y: torch.addcmul(x, y, x, value=0.5)
                                 * torch.addcdiv(x, y, x.abs() + 1, value=2) + torch.lerp(x, y, 0.3) ** 2, [a, b]),
        "xlogy_logaddexp": (lambda x, y: torch.xlogy(x, y.abs() + 0.5) + torch.logaddexp(x, y), [a, b]),
        "sum_mean_var_std": (lambda x: (x.sum(1) ** 2).sum() + x.mean(0) * x.var(1, keepdim=True) + x.std()
                             + torch.var(x, dim=0, correction=0), [a]),
        "prod_cumprod_cumsum": (lambda x: x.prod(1).sum() + x.cumsum(1) * x.cumprod(0), [a]),
        "prod_with_zeros": (lambda x: x.prod(1) + x.cumprod(1).sum(),
                            [torch.tensor([[0., 1., 2.], [0., 0., 3.]], dtype=D)]),
        "logcumsumexp_cummax": (lambda x: torch.logcumsumexp(x, 1) + torch.cummax(x, 1)[0] ** 2, [a]),
        "norms": (lambda x: x.norm() + x.norm(dim=1).pow(2).sum() + torch.linalg.vector_norm(x, 3, dim=0).sum()
                  + torch.linalg.vector_norm(x, float("inf"), dim=1).sum(), [a]),
        "logsumexp_amax": (lambda x: torch.logsumexp(x, 1) ** 2 + x.amax(1) * x.max(1).values + x.min() ** 2, [a]),
        "softmax_family": (lambda x: F.softmax(x, 1) ** 2 + F.log_softmax(x, 0) * x + F.softmin(x, 1), [a]),
        "matmul_family": (lambda x, y, v: (x @ y.T) ** 2 + (torch.mv(x, v) * torch.dot(v, v)).sum()
                          + torch.einsum("ij,kj->ik", x, y).tanh(), [a, b, r(4)]),
        "addmm_baddbmm": (lambda c, x, y: torch.addmm(c, x, y, beta=0.5, alpha=2) ** 2
                          + torch.baddbmm(c.unsqueeze(0), x.unsqueeze(0), y.unsqueeze(0), beta=0.3).sum() ** 2,
                          [r(3, 2), a, r(4, 2)]),
        "linear_bilinear": (lambda x, w, c, bw: F.linear(x, w, c).tanh().sum(0) + F.bilinear(x[:, :2], x, bw, c) ** 2,
                            [a, r(5, 4), r(5), r(5, 2, 4)]),
        "conv1d": (lambda x, w, c: F.conv1d(x, w, c, padding=1, stride=2).tanh(), [r(2, 3, 7), r(4, 3, 3), r(4)]),
        "conv2d_groups": (lambda x, w: F.conv2d(x, w, stride=2, groups=2, dilation=2) ** 2,
                          [r(1, 4, 7, 7), r(2, 2, 2, 2)]),
        "conv_transpose2d": (lambda x, w: F.conv_transpose2d(x, w, stride=2, padding=1) ** 2,
                             [r(1, 2, 3, 3), r(2, 3, 3, 3)]),
        "group_norm_rms_norm": (lambda x, w, c: F.group_norm(x, 2, w, c) ** 2 + F.rms_norm(x, (3,), w[:3]).pow(2).sum(),
                                [r(2, 4, 3), r(4), r(4)]),
        "normalize_cosine": (lambda x, y: F.normalize(x, dim=1) * x + F.cosine_similarity(x, y)[:, None] ** 2
                             + F.pairwise_distance(x, y)[:, None], [a, b]),
        "regression_losses": (lambda x, y: (F.mse_loss(x, y) + F.l1_loss(x, y) + F.smooth_l1_loss(x, y, beta=0.5)
                                            + F.huber_loss(x, y, delta=0.7)) * x.sum(), [a, b]),
        "classification_losses": (lambda x, y: F.cross_entropy(x, labels) * x.sum() + F.cross_entropy(x, y.softmax(1))
                                  + F.nll_loss(F.log_softmax(x, 1), labels, reduction="sum") ** 2
                                  + F.kl_div(F.log_softmax(x, 1), F.softmax(y, 1), reduction="batchmean"), [a, b]),
        "binary_losses": (lambda x, y: F.binary_cross_entropy(torch.sigmoid(x), torch.sigmoid(y))
                          + F.binary_cross_entropy_with_logits(x, y.sigmoid())
                          + F.soft_margin_loss(x, y.detach().sign())
                          + F.poisson_nll_loss(x, y.abs()) + F.gaussian_nll_loss(x, y, x.abs() + 0.1), [a, b]),
        "indexing": (lambda x: x[[0, 2]][:, [1, 1, 3]] ** 3 + x.index_select(1, torch.tensor([2, 0, 2]))[:2] ** 2
                     + x.gather(1, index)[:2, :1] ** 3 + x[x > 0].sum() ** 2, [a]),
        "scatter_family": (lambda x, s: x.scatter(1, index, s) ** 3 + x.scatter_add(1, index, s) ** 2
                           + x.scatter_reduce(1, index, s, "prod") ** 2 + x.scatter_reduce(1, index, s, "amax") ** 3
                           + x.index_add(0, torch.tensor([2, 0, 2]), x * s[:, :1], alpha=2.0) ** 2, [a, r(3, 2)]),
        "masked_put_take": (lambda x, s: x.masked_fill(x > 0.5, 2.0) ** 3 + x.masked_scatter(x > 0, s) ** 2
                            + x.index_put((torch.tensor([0, 0, 2]),), s.view(3, 4), accumulate=True) ** 3
                            + torch.take(x, torch.tensor([0, 5, 5, 11])).sum() ** 2, [a, r(12)]),
        "embedding": (lambda w: F.embedding(torch.tensor([[0, 2], [2, 2]]), w) ** 3, [r(4, 3)]),
        "shapes": (lambda x, y: torch.cat([x, y * x], 0).pow(2)[:3] * torch.stack([x, y]).sum(0)
                   + x.view(3, 2, 2).permute(2, 0, 1).transpose(0, 2).reshape(3, 4) ** 3 + x.roll(1, 1) * x.flip(0)
                   + x.split([1, 3], 1)[1].sum() * x.unbind(0)[1] + x.unfold(1, 2, 1).sum(-1).sum() * x.tril(), [a, b]),
        "sort_topk_median": (lambda x: x.sort(1)[0] ** 2 * x.topk(2, 1)[0].sum() + x.kthvalue(2, 1)[0][:, None] ** 3
                             + x.median(1)[0][:, None] ** 2, [a]),
        "padding": (lambda x: F.pad(x, (1, 2, 0, 1), value=0.5)[:3, :4] ** 3
                    + F.pad(x.view(1, 3, 4), (2, 1), mode="reflect")[0, :, :4] ** 2
                    + F.pad(x.view(1, 3, 4), (2, 1), mode="circular")[0, :, 1:5] ** 3, [a]),
        "pooling": (lambda x: F.max_pool2d(x, 2, 1) ** 3 + F.avg_pool2d(x, 2, 1, padding=0) ** 2
                    + F.adaptive_max_pool2d(x, 3) ** 3 + F.lp_pool2d(x.abs() + 0.1, 2, 1)[..., :3, :3] ** 2,
                    [r(1, 2, 4, 4)]),
        "interpolate_grid_sample": (lambda x, grid: F.interpolate(x, scale_factor=2, mode="bilinear").sum() ** 2
                                    + F.grid_sample(x, grid.tanh(), align_corners=False) ** 2,
                                    [r(1, 2, 4, 4), r(1, 3, 3, 2)]),
        "attention": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v) ** 2
                      + F.scaled_dot_product_attention(q, q, v[:, :3], is_causal=True) ** 3,
                      [r(1, 3, 4), r(1, 5, 4), r(1, 5, 2)]),
        "linalg": (lambda m, c: torch.linalg.det(m) * torch.linalg.inv(m).sum() + torch.linalg.solve(m, c).pow(2).sum()
                   + torch.linalg.slogdet(m)[1] + torch.linalg.cholesky(m @ m.T).sum(),
                   [r(3, 3) + 3 * torch.eye(3, dtype=D), r(3, 2)]),
        "ties": (lambda x: x.amax(1) ** 3 + x.max() ** 2 + x.sort(1).values[:, 0] ** 3 + x.median() ** 3,
                 [torch.tensor([[1., 2., 2.], [0., 0., 0.]], dtype=D)]),
        "kinks_at_the_kink": (lambda x: F.relu(x) ** 3 + x.abs() ** 3 + x.clamp(-1, 1) ** 3 + F.hardtanh(x) ** 2,
                              [torch.tensor([0., 1., -1., 2.], dtype=D)]),
        "broadcast_0d_and_rows": (lambda x, s, row: torch.tanh(x * s + row) ** 2 / (1 + s.exp()) + (row * s) ** 2,
                                  [a, torch.tensor(0.7, dtype=D), r(1, 4)]),
    }


CASES = _cases()


@pytest.mark.parametrize("name", sorted(CASES))
def test_first_to_third_derivatives_match_torch_eager_and_compiled(name):
    fn, inputs = CASES[name]
    expected = derivatives(fn, inputs, torch.autograd.grad, torch_leaf, 3)
    assert_same(derivatives(fn, inputs, tt.grad, tt_leaf, 3), expected, f"{name} eager")
    compiled = tt.compile(fn, tuple(tt_leaf(x, True) for x in inputs))
    for call, order in enumerate((3, 3, 1, 3)):  # a first-order call between two create_graph ones
        got = derivatives(compiled, inputs, tt.grad, tt_leaf, order)
        assert_same(got, expected[:order + 1], f"{name} compiled call {call}")
    assert compiled.replayed >= 3


def test_a_reordered_rule_keeps_its_calls_needs_input_grad_on_a_replayed_create_graph_call():
    """2.0 ** x (Tensor.__rpow__, reflected(Pow)) and x.where(c, y) (reordered(Where)): the rule's forward put its own
    argument order into ctx.needs_input_grad and left it there; a replayed compiled statement's traced forward builds
    its Context from the call's mask and replays only the ctx's __dict__ (compiler/tracing/judge.py reads vars(ctx)),
    so the create_graph backward (Segment.backward, which calls the rule's backward on that Context) read the flags in
    the wrong order from the second replayed call on: d(2^x)/dx was None (x.grad left empty, zeros with allow_unused),
    and x.where(c, y) sent y's gradient to x. Fixed in ops/rule_tables.py: reordered keeps the call's flags on ctx."""
    x0 = torch.tensor([0.3, -1.0, 2.0], dtype=D)
    y0 = torch.tensor([1.5, 0.5, -0.7], dtype=D)
    compiled_pow = tt.compile(lambda x: 2.0 ** x, (tt.tracer(x0, requires_grad=True),))
    compiled_where = tt.compile(lambda x, y: x.where(x > 0, y) * 3, (tt.tracer(x0, requires_grad=True),
                                                                     tt.tracer(y0, requires_grad=True)))
    for _ in range(4):
        x = tt.tracer(x0.clone(), requires_grad=True)
        (g,) = tt.grad(compiled_pow(x).sum(), [x], create_graph=True)
        torch.testing.assert_close(plain(g), 2.0 ** x0 * torch.log(torch.tensor(2.0, dtype=D)))
        (h,) = tt.grad(g.sum(), [x])
        torch.testing.assert_close(plain(h), 2.0 ** x0 * torch.log(torch.tensor(2.0, dtype=D)) ** 2)
        x, y = tt.tracer(x0.clone(), requires_grad=True), tt.tracer(y0.clone(), requires_grad=True)
        gx, gy = tt.grad(compiled_where(x, y).sum(), [x, y], create_graph=True)
        torch.testing.assert_close(plain(gx), 3.0 * (x0 > 0).to(D))
        torch.testing.assert_close(plain(gy), 3.0 * (x0 <= 0).to(D))


NORMALISATIONS = {
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (4,), w, b) ** 2, [(3, 4), (4,), (4,)]),
    "batch_norm_train": (lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True) ** 2, [(5, 3), (3,), (3,)]),
    "instance_norm": (lambda x: F.instance_norm(x) ** 2, [(2, 3, 5)]),
    "group_norm": (lambda x, w, b: F.group_norm(x, 2, w, b) ** 2, [(2, 4, 3), (4,), (4,)]),
}


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("name", sorted(NORMALISATIONS))
def test_third_derivatives_of_normalisations_match_finite_differences(name, compiled):
    """Orders 1 and 2 against torch; order 3 against central differences of torch's (right) second derivative,
    since torch's own third derivative of its native layer/batch/instance norm is wrong (off by up to 200%)."""
    fn, shapes = NORMALISATIONS[name]
    torch.manual_seed(1)
    inputs = [torch.randn(*s, dtype=D) for s in shapes]
    expected = derivatives(fn, inputs, torch.autograd.grad, torch_leaf, 2)
    f = tt.compile(fn, tuple(tt_leaf(x, True) for x in inputs)) if compiled else fn
    for _ in range(3 if compiled else 1):
        got = derivatives(f, inputs, tt.grad, tt_leaf, 3)
        assert_same(got[:3], expected, name)
        for j in range(len(inputs)):
            u = torch.randn_like(inputs[j])

            def second(eps, j=j, u=u):
                moved = [x + eps * u if i == j else x for i, x in enumerate(inputs)]
                return derivatives(fn, moved, torch.autograd.grad, torch_leaf, 2, last_scalar=True)
            numeric = (second(1e-5) - second(-1e-5)) / 2e-5
            torch.testing.assert_close((got[3][j] * u).sum(), numeric, rtol=1e-6, atol=1e-6)


# Seeded random programs: unary ops, binary ops with the two inputs, in-place ops and views on intermediate results.
_INDEX = torch.tensor([[0, 3], [2, 2], [1, 0]])
UNARY = [
    lambda h: torch.tanh(h), lambda h: torch.sigmoid(h) * 2, lambda h: h.sin(), lambda h: F.softplus(h),
    lambda h: h ** 3 * 0.3, lambda h: F.gelu(h), lambda h: F.silu(h), lambda h: F.elu(h),
    lambda h: F.log_softmax(h, -1), lambda h: F.softmax(h, 0) * 3, lambda h: F.group_norm(h[None], 3)[0],
    lambda h: (h * h).log1p(), lambda h: h.cumsum(1) * 0.5, lambda h: h.flip(0), lambda h: h.t().reshape(3, 4),
    lambda h: h.roll(1, 1), lambda h: h / (1 + h * h), lambda h: torch.where(h > 0, h, h * h),
    lambda h: h.clamp(-1, 1) * h, lambda h: h - h.mean(0, keepdim=True), lambda h: h - h.amax(1, keepdim=True),
    lambda h: h / (h.norm(dim=1, keepdim=True) + 1), lambda h: torch.cat([h.gather(1, _INDEX), h[:, :2]], 1),
    lambda h: h.index_select(1, torch.tensor([3, 0, 0, 1])), lambda h: 1.5 ** h, lambda h: h.where(h < 0.5, h.cos()),
    lambda h: 1.0 - h * h, lambda h: h * h.std(1, keepdim=True), lambda h: h * h.var(0, unbiased=False),
    lambda h: h - torch.logsumexp(h, 1, keepdim=True), lambda h: h * h.prod(0) * 0.1,
    lambda h: h * h.max(1, keepdim=True).values, lambda h: h.sort(1).values,
    lambda h: F.pad(h, (1, 1))[:, 1:5] + F.pad(h, (0, 1))[:, 1:], lambda h: h * F.mse_loss(h, h.flip(1)),
]


def _row(h, a, b):
    h = h.clone()
    h[1] = h[1].clone() * a[0]
    return h


def _mul_(h, a, b):
    h = h * 1
    h.mul_(b)
    return h


def _slice_add_(h, a, b):
    h = h + 0
    h[:, 1:3].add_(a[:, :2] * b[:, 2:])
    return h


def _exp_(h, a, b):
    h = h * 0.5
    h.exp_()
    return h * a


def _sigmoid_(h, a, b):
    h = h - 0
    h.mul_(3)
    h.sigmoid_()
    return h


def _t_(h, a, b):
    h = h.clone()
    h.t_()
    h.mul_(a.t())
    return h.t()


def _diagonal_(h, a, b):
    h = h.clone()
    h.diagonal().mul_(a[0, :3])
    return h


def _index_put(h, a, b):
    h = h.clone()
    h[torch.tensor([0, 2])] = a[:2] * h[1].clone()
    return h


def _masked_fill_(h, a, b):
    h = h.clone()
    h.masked_fill_(a > 1.0, 0.3)
    return h


def _addcmul_(h, a, b):
    h = h.clone()
    h.addcmul_(a, b, value=0.5)
    return h


BINARY = [
    lambda h, a, b: h * a, lambda h, a, b: h + b, lambda h, a, b: h / (b * b + 1),
    lambda h, a, b: h @ (b.t() @ a) * 0.3, lambda h, a, b: torch.maximum(h, a),
    lambda h, a, b: torch.atan2(h, b.abs() + 0.5), lambda h, a, b: torch.lerp(h, a, 0.3),
    lambda h, a, b: h * b[0], lambda h, a, b: torch.addcdiv(h, a, b.abs() + 1, value=0.5),
    _row, _mul_, _slice_add_, _exp_, _sigmoid_, _t_, _diagonal_, _index_put, _masked_fill_, _addcmul_,
]


def random_program(seed, length=7):
    rng = random.Random(seed)
    steps = [(rng.choice(UNARY), None) if rng.random() < 0.5 else (None, rng.choice(BINARY)) for _ in range(length)]

    def program(a, b):
        h = a
        for unary, binary in steps:
            h = unary(h) if unary is not None else binary(h, a, b)
        return h
    return program


@pytest.mark.parametrize("block", range(8))
def test_random_programs_eager_and_compiled(block):
    for seed in range(block * 12, block * 12 + 12):
        program = random_program(seed)
        generator = torch.Generator().manual_seed(1000 + seed)
        inputs = [torch.randn(3, 4, generator=generator, dtype=D) for _ in range(2)]
        expected = derivatives(program, inputs, torch.autograd.grad, torch_leaf, 3, seed)
        assert_same(derivatives(program, inputs, tt.grad, tt_leaf, 3, seed), expected, f"program {seed} eager")
        compiled = tt.compile(program, tuple(tt_leaf(x, True) for x in inputs))
        for call, order in enumerate((3, 1, 3, 2)):
            got = derivatives(compiled, inputs, tt.grad, tt_leaf, order, seed)
            assert_same(got, expected[:order + 1], f"program {seed} compiled call {call}")


def _critic():
    return torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 8), torch.nn.LayerNorm(8),
                               torch.nn.SiLU(), torch.nn.Linear(8, 1)).double()


def _gradient_penalty_run(kind, optimizer, critic, batches):
    """WGAN-GP critic steps: loss = D(fake) - D(real) + 10 (|d D(x)/dx| - 1)^2 at random interpolates, then
    loss.backward() and an optimizer step: the parameters after each step."""
    model = copy.deepcopy(critic)
    if kind != "torch":
        tt.port(model)
    make = {"sgd": (torch.optim.SGD, tt.optim.SGD), "adam": (torch.optim.Adam, tt.optim.Adam)}[optimizer]
    opt = make[0 if kind == "torch" else 1](model.parameters(), lr=0.02)
    grad = torch.autograd.grad if kind == "torch" else tt.grad

    def loss_of(real, fake, eps):
        mixed = eps * real + (1 - eps) * fake
        x = mixed.requires_grad_(True) if kind == "torch" else tt.tracer(mixed, requires_grad=True)
        (g,) = grad(model(x).sum(), x, create_graph=True)
        penalty = ((g.norm(2, dim=1) - 1) ** 2).mean()
        return model(fake).mean() - model(real).mean() + 10 * penalty

    step = tt.compile(loss_of, batches[0]) if kind == "compiled" else loss_of
    history = []
    for real, fake, eps in batches * 2:
        loss = step(real, fake, eps)
        opt.zero_grad()
        loss.backward()
        opt.step()
        history.append((float(plain(loss)), [plain(p).clone() for p in model.parameters()]))
    return history


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_gradient_penalty_training_matches_torch(optimizer):
    torch.manual_seed(0)
    critic = _critic()
    batches = [(torch.randn(6, 3, dtype=D), torch.randn(6, 3, dtype=D) + 1, torch.rand(6, 1, dtype=D))
               for _ in range(3)]
    expected = _gradient_penalty_run("torch", optimizer, critic, batches)
    for kind in ("eager", "compiled"):
        for step, ((loss, params), (loss_t, params_t)) in enumerate(zip(_gradient_penalty_run(kind, optimizer, critic,
                                                                                               batches), expected)):
            assert loss == pytest.approx(loss_t, rel=1e-10, abs=1e-12), (kind, step)
            for p, q in zip(params, params_t):
                torch.testing.assert_close(p, q, rtol=1e-10, atol=1e-12, msg=lambda m: f"{kind} step {step}: {m}")


@pytest.mark.parametrize("compiled", [False, True])
def test_hessian_vector_products_by_two_tt_grads_give_torchs_hessian(compiled):
    torch.manual_seed(0)
    x0, w0 = torch.randn(4, 3, dtype=D), torch.randn(3, 3, dtype=D)

    def loss(x, w):
        z = x @ w
        return (F.softplus(z) ** 2).sum() + torch.logsumexp(z, 1).sum() + (F.layer_norm(z, (3,)) * z).sum()
    hessian = torch.autograd.functional.hessian(lambda w: loss(x0, w), w0).reshape(9, 9)
    f = tt.compile(loss, (tt.tracer(x0), tt.tracer(w0, requires_grad=True))) if compiled else loss
    for k in range(9):
        w = tt.tracer(w0.clone(), requires_grad=True)
        (g,) = tt.grad(f(tt.tracer(x0), w), [w], create_graph=True)
        v = torch.zeros(9, dtype=D)
        v[k] = 1
        (hv,) = tt.grad(g, [w], grad_outputs=v.view(3, 3))
        torch.testing.assert_close(plain(hv).reshape(9), hessian[:, k], rtol=1e-10, atol=1e-12)
    functional = torch.autograd.functional.hessian(lambda w: loss(tt.tracer(x0), w), tt.tracer(w0))
    torch.testing.assert_close(plain(functional).reshape(9, 9), hessian, rtol=1e-10, atol=1e-12)


X0 = torch.randn(4, 3, generator=torch.Generator().manual_seed(5), dtype=D)
W0 = torch.randn(3, 3, generator=torch.Generator().manual_seed(6), dtype=D)


def _intermediate_inputs(grad, x, w, forward):
    h, v, h2, y = forward(x, w)
    gv, gh2, gh = grad(y, [v, h2, h], create_graph=True)
    return [gv, gh2, gh, *grad((gv ** 2).sum() + (gh2 * gh).sum() + (gh * h).sum(), [x, w])]


def _views_and_inplace(x, w):
    h = x @ w
    v = h[1:3]
    h2 = h * 1
    h2.mul_(2.5)
    return h, v, h2, (torch.sin(v) * h2[:2]).sum() + h2.exp().sum() + (h * h.sum(0)).tanh().sum()


SEEN = []


def _differentiable_hooks(grad, x, w, forward):
    SEEN.clear()
    x.register_hook(lambda g: g * x.sin())
    h, y = forward(x, w)
    gx, gw = grad(y, [x, w], create_graph=True)
    return [gx, gw, *grad((gx ** 2).sum() + gw.sin().sum(), [x, w]), torch.stack(SEEN)]  # h's hook ran in both


def _hooked(x, w):
    h = torch.sigmoid(x @ w)
    h.register_hook(lambda g: (SEEN.append(g.detach().clone()), g * h)[1])  # its result depends on h
    k = h.exp()
    k.register_hook(lambda g: g * 2)
    return h, (k * h).sum()


def _retain_graph(grad, x, w, forward):
    y = forward(x, w)
    y.backward(create_graph=True)  # keeps the graph
    first = x.grad
    y.backward(create_graph=True)  # accumulates: x.grad is now a graph of 2 dy/dx
    s = (x.grad ** 2).sum() + (w.grad * w).sum()
    x.grad = w.grad = None
    s.backward(retain_graph=True)
    out = [first, x.grad, w.grad]
    w.grad = None
    s.backward(inputs=[w])
    return out + [w.grad]


def _loss(x, w):
    return (torch.tanh(x @ w) ** 3).sum() + (x.exp() @ w).pow(2).mean()


def _no_grad_mix(grad, x, w, forward):
    with torch.no_grad():
        c = (x * 2).sum(0)
    (gx,) = grad(forward(x, w), [x], create_graph=True)
    with torch.no_grad():
        scale = gx.abs().mean()  # a constant
        with torch.enable_grad():
            z = (gx * c).sum() * scale
    (gw,) = grad(z, [w], retain_graph=True)
    with torch.no_grad():
        (gw_no_graph,) = grad(z, [w], create_graph=True)  # no graph is made under no_grad, as torch
    return [gx, gw, gw_no_graph, torch.tensor(float(gw_no_graph.requires_grad))]


def _inside_no_grad(x, w):
    h = torch.tanh(x @ w)
    with torch.no_grad():
        s = h.sum(0) * 2
        with torch.enable_grad():
            k = h * h
    return (k * s + h.detach() * h).sum()


def _second_through_inside_no_grad(grad, x, w, forward):
    gx, gw = grad(forward(x, w), [x, w], create_graph=True)
    return [gx, gw, *grad((gx * gw.sum()).sum(), [x, w])]


SCENARIOS = {
    "tt.grad of views and in-place intermediates": (_intermediate_inputs, _views_and_inplace),
    "differentiable tensor hooks": (_differentiable_hooks, _hooked),
    "retain_graph and create_graph accumulation": (_retain_graph, _loss),
    "no_grad around a double backward": (_no_grad_mix, _loss),
    "no_grad inside the function": (_second_through_inside_no_grad, _inside_no_grad),
}


@pytest.mark.filterwarnings("ignore:Using backward\\(\\) with create_graph=True")
@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_engine_scenarios_match_torch_eager_and_compiled(name):
    body, forward = SCENARIOS[name]
    expected = [plain(t) for t in body(torch.autograd.grad, X0.clone().requires_grad_(), W0.clone().requires_grad_(),
                                       forward)]
    compiled = tt.compile(forward, (tt.tracer(X0, requires_grad=True), tt.tracer(W0, requires_grad=True)))
    runs = [("eager", forward)] + [(f"compiled call {i}", compiled) for i in range(3)]
    for label, f in runs:
        got = [plain(t) for t in body(tt.grad, tt.tracer(X0.clone(), requires_grad=True),
                                      tt.tracer(W0.clone(), requires_grad=True), f)]
        assert len(got) == len(expected)
        for i, (a, b) in enumerate(zip(got, expected)):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12, msg=lambda m: f"{label}, result {i}: {m}")


FLOAT_FNS = {
    "pow": lambda x, p: x ** p,
    "rpow": lambda x, p: p ** x,
    "leaky_relu": lambda x, p: F.leaky_relu(x - 0.6, p) ** 2,
    "clamp": lambda x, p: torch.clamp(x, -p, p) * x,
    "softplus": lambda x, p: F.softplus(x, beta=p),
    "elu": lambda x, p: F.elu(x - 0.6, alpha=p),
    "add_alpha": lambda x, p: torch.add(x, x ** 2, alpha=p) ** 2,
    "lerp": lambda x, p: torch.lerp(x, x ** 2, p) ** 2,
    "smooth_l1": lambda x, p: F.smooth_l1_loss(x, x.flip(0) * 0.5, beta=p) * x,
    "label_smoothing": lambda x, p: F.cross_entropy(x, torch.tensor([0, 1, 3]), label_smoothing=p / 10) * x,
    "normalize_p": lambda x, p: F.normalize(x, p=p, dim=1),
    "threshold": lambda x, p: F.threshold(x, p / 3, -1.0) * x,
    "logit_eps": lambda x, p: torch.logit(x / 3, eps=p / 10),
    "group_norm_eps": lambda x, p: F.group_norm(x[None], 3, eps=p) ** 2,
}


@pytest.mark.parametrize("name", sorted(FLOAT_FNS))
def test_python_floats_read_on_every_compiled_call_in_higher_derivatives(name):
    """A float argument changes between compiled calls: every order uses this call's value, not the recorded one."""
    x0 = torch.rand(3, 4, generator=torch.Generator().manual_seed(3), dtype=D) + 0.2
    fn = FLOAT_FNS[name]
    compiled = tt.compile(fn, (tt.tracer(x0, requires_grad=True), 1.5))
    for p in (1.5, 2.5, 0.7, 3.0, 1.5):
        expected = derivatives(lambda x: fn(x, p), [x0], torch.autograd.grad, torch_leaf, 3)
        assert_same(derivatives(lambda x: fn(x, p), [x0], tt.grad, tt_leaf, 3), expected, f"{name} eager p={p}")
        got = derivatives(lambda x: compiled(x, p), [x0], tt.grad, tt_leaf, 3)
        assert_same(got, expected, f"{name} compiled p={p}")
    assert compiled.replayed >= 4


LAYERS = {
    "Linear": ((3, 4), (5, 3)), "Conv2d": ((2, 3, 3, 2, 1), (2, 2, 5, 5)),
    "ConvTranspose2d": ((2, 3, 3, 2, 1), (1, 2, 3, 3)),
    "BatchNorm1d": ((3,), (5, 3)), "BatchNorm2d": ((2,), (3, 2, 2, 2)), "LayerNorm": ((4,), (3, 4)),
    "GroupNorm": ((2, 4), (2, 4, 3)), "InstanceNorm1d": ((3, 1e-5, 0.1, True), (2, 3, 5)), "RMSNorm": ((4,), (3, 4)),
    "PReLU": ((), (3, 4)), "LSTM": ((3, 4), (5, 2, 3)), "GRU": ((3, 4, 2), (5, 2, 3)), "RNNCell": ((3, 4), (2, 3)),
    "LocalResponseNorm": ((2,), (2, 4, 3)), "LPPool2d": ((2, 2), (1, 2, 4, 4)), "Mish": ((), (3, 4)),
}


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_tt_nn_layers_second_derivatives_match_torch_modules(name):
    """d/d(x, parameters) of <d <tanh(layer(x)), v>/d(x, parameters), u>, by a tt.nn layer (eager and compiled) and
    by torch's module with the same parameters."""
    args, shape = LAYERS[name]
    torch.manual_seed(0)
    theirs, ours = getattr(torch.nn, name)(*args).double(), getattr(tt.nn, name)(*args).double()
    with torch.no_grad():
        for p, q in zip(theirs.parameters(), ours.parameters()):
            p.copy_(torch.randn_like(p))
            q.copy_(p)
    x0 = torch.randn(*shape, dtype=D)

    def second(layer, x, params, grad):
        y = layer(x)
        y = y[0] if isinstance(y, tuple) else y
        g = torch.Generator().manual_seed(0)
        first = grad((torch.tanh(y) * torch.randn(y.shape, generator=g, dtype=D)).sum(), [x, *params],
                     create_graph=True, allow_unused=True)
        s = sum((f * torch.randn(f.shape, generator=g, dtype=D)).sum() for f in first if f is not None)
        return [plain(f) for f in first] + [plain(h) for h in grad(s, [x, *params], allow_unused=True)]
    expected = second(theirs, x0.clone().requires_grad_(), list(theirs.parameters()), torch.autograd.grad)
    compiled = tt.compile(lambda x: ours(x), (tt.tracer(x0, requires_grad=True),))
    for label, layer in [("eager", ours)] + [(f"compiled call {i}", compiled) for i in range(3)]:
        got = second(layer, tt.tracer(x0.clone(), requires_grad=True), list(ours.parameters()), tt.grad)
        for i, (a, b) in enumerate(zip(got, expected)):
            assert (a is None) == (b is None), (label, i)
            if a is not None:
                torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11, msg=lambda m: f"{label}, result {i}: {m}")
