"""Edge values where a gradient rule must follow torch's convention, not just the textbook formula: masks meeting
an infinite or NaN incoming gradient, NaN inputs, second derivatives at a kink, empty pieces. Each case is one the
differential fuzzer (tests/fuzz) found; every one is compared with torch autograd."""
import pytest
import torch
import torch.nn.functional as F

import torchtrace as tt

NAN, INF = float("nan"), float("inf")
POINTS = torch.tensor([-4.0, -3.0, -1.0, -0.5, 0.0, 0.5, 1.0, 3.0, 6.0, 7.0, NAN, INF, -INF], dtype=torch.float64)
TABLE = torch.tensor([[3.0, 1.0, 3.0, NAN], [2.0, 2.0, -1.0, 0.0], [INF, 1.0, -INF, 0.0]], dtype=torch.float64)

MASKED = {
    "relu": torch.relu, "relu6": F.relu6, "hardtanh": F.hardtanh,
    "hardtanh(-0.5, 0.5)": lambda t: F.hardtanh(t, -0.5, 0.5), "hardsigmoid": F.hardsigmoid,
    "softshrink": F.softshrink, "hardshrink": F.hardshrink,
    "threshold": lambda t: F.threshold(t, 0.5, 2.0), "leaky_relu": F.leaky_relu, "elu": F.elu, "selu": F.selu,
    "celu": F.celu, "hardswish": F.hardswish, "clamp": lambda t: t.clamp(-1, 1),
}
SELECTING = {
    "max": lambda t: t.max(), "min": lambda t: t.min(), "max(dim)": lambda t: t.max(1).values,
    "min(dim)": lambda t: t.min(0)[0], "median": lambda t: t.median(), "amax(dim)": lambda t: t.amax(1),
    "sort": lambda t: t.sort(1).values, "topk": lambda t: t.topk(2, 1).values, "cummax": lambda t: t.cummax(1).values,
    "kthvalue": lambda t: t.kthvalue(2, 1).values, "where": lambda t: torch.where(t > 1, t, t * 2),
}


def _grads(fn, values, fill):
    theirs = values.clone().requires_grad_(True)
    out = fn(theirs)
    seed = torch.full_like(out, fill)
    out.backward(seed)
    ours = tt.tracer(values.clone(), requires_grad=True)
    fn(ours).backward(seed)
    return ours.grad.as_subclass(torch.Tensor), theirs.grad


@pytest.mark.parametrize("fill", [1.0, INF, -INF, NAN])
@pytest.mark.parametrize("name", list(MASKED))
def test_masks_meeting_infinite_or_nan_gradients_and_nan_inputs(name, fill):
    ours, theirs = _grads(MASKED[name], POINTS, fill)
    torch.testing.assert_close(ours, theirs, equal_nan=True)


@pytest.mark.parametrize("fill", [1.0, INF, NAN])
@pytest.mark.parametrize("name", list(SELECTING))
def test_selections_give_exactly_zero_off_the_selected_elements(name, fill):
    ours, theirs = _grads(SELECTING[name], TABLE, fill)
    torch.testing.assert_close(ours, theirs, equal_nan=True)


@pytest.mark.parametrize("fn", [F.elu, lambda t: F.elu(t, 0.5), F.selu, F.celu, lambda t: F.celu(t, 0.5)])
def test_elu_family_second_derivative_at_the_kink(fn):
    x = torch.tensor([-1.0, -0.0, 0.0, 1.0], dtype=torch.float64)
    theirs = x.clone().requires_grad_(True)
    (first,) = torch.autograd.grad(fn(theirs).sum(), theirs, create_graph=True)
    first.sum().backward()
    ours = tt.tracer(x, requires_grad=True)
    (our_first,) = tt.grad(fn(ours).sum(), ours, create_graph=True)
    our_first.sum().backward()
    torch.testing.assert_close(our_first.detach().as_subclass(torch.Tensor), first.detach())
    torch.testing.assert_close(ours.grad.as_subclass(torch.Tensor), theirs.grad)


@pytest.mark.parametrize("cut", [lambda t: t.split(0, 2), lambda t: torch.split(t, [0, 0], 2),
                                 lambda t: t.chunk(2, 1), lambda t: t.tensor_split(2, 2)])
def test_cutting_empty_tensors_along_their_empty_dim(cut):
    x = torch.zeros(2, 2, 0, dtype=torch.float64)

    def program(t):
        return sum((2 ** p).sum() for p in cut(torch.cat([t, t], 2)))

    theirs = x.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(program(theirs), theirs, create_graph=True)
    ours = tt.tracer(x, requires_grad=True)
    (h,) = tt.grad(program(ours), ours, create_graph=True)
    assert h.shape == g.shape == x.shape


def test_retain_grad_of_a_view_after_its_base_changed_in_place():
    def program(a, b, retained):
        base = torch.maximum(a, b)
        view = base[None][0]
        out = view * 3
        F.relu(base, inplace=True)
        view.retain_grad()  # the view of the new value, which `out` never used
        retained.append(view)
        return out + view

    values = (torch.tensor([-0.5, 2.0], dtype=torch.float64), torch.tensor([0.5, -1.0], dtype=torch.float64))
    theirs, ours = [], []
    leaves = [v.clone().requires_grad_(True) for v in values]
    program(*leaves, theirs).sum().backward()
    tracers = [tt.tracer(v, requires_grad=True) for v in values]
    program(*tracers, ours).sum().backward()
    torch.testing.assert_close(ours[0].grad.as_subclass(torch.Tensor), theirs[0].grad)
    for mine, reference in zip(tracers, leaves):
        torch.testing.assert_close(mine.grad.as_subclass(torch.Tensor), reference.grad)


@pytest.mark.parametrize("call", [lambda t: F.dropout(t, 0.0, True, True), lambda t: F.dropout(t, 0.5, False, True),
                                  lambda t: F.alpha_dropout(t, 0.3, inplace=True)])
def test_identity_dropout_with_inplace_leaves_a_leaf_view_alone(call):
    x = tt.tracer(torch.tensor([[1.0, -2.0]], dtype=torch.float64), requires_grad=True)
    view = x[0]
    assert call(view) is view
    (view * 2).sum().backward()
    assert torch.equal(x.grad.as_subclass(torch.Tensor), torch.full((1, 2), 2.0, dtype=torch.float64))


def _retained_view_changed_by_elu(x0):
    t0 = x0.mT @ x0
    t1 = t0[1:]
    t1.retain_grad()
    F.elu(t1, inplace=True)
    return [t0], [t1]


def _retained_view_added_to(x0):
    t0 = x0 * 2
    t1 = t0[None]
    t1.retain_grad()
    t1 += x0
    return [t0], [t1]


def _retained_view_used_after_its_change(x0):
    t0 = x0 * 2
    t1 = t0[1:]
    t1.retain_grad()
    t1.mul_(3)
    return [t1 * 5, t0], [t1]


@pytest.mark.parametrize("program", [_retained_view_changed_by_elu, _retained_view_added_to,
                                     _retained_view_used_after_its_change])
def test_retain_grad_then_an_inplace_change_of_the_view_itself(program):
    """.grad of a retained view is that of its value after the change (torch: zero when only the base is used)."""
    from fuzz.runner import assert_same

    assert_same(program, [torch.tensor([[1.0, 2.0, -0.75], [-0.5, 1.5, 0.0], [1.0, 1.5, -1.0]], dtype=torch.float64)],
                double=False)


def test_retain_grad_on_a_view_of_a_detached_base_changed_in_place():
    """t0 = x.detach(); t1 = t0[-1]; t0.sub_(w); t1.retain_grad(): torch 2.13 leaves t1.grad None unless t1.grad_fn
    was read before retain_grad() (torch is wrong there: the view does get a gradient). torchtrace gives the gradient
    torch gives once grad_fn was read, and the hand-derived one: t1 = [0, 0, 2, 3], and every product of
    d sum(g cumprod(t1)) / dt1_k = sum_{i>=k} g_i prod_{j<=i, j!=k} t1_j holds t1_0 = 0 except k = 0's g_0."""
    x = torch.tensor([[0.0, -2.0, -1.0, -2.0], [-1.0, -1.0, 1.0, 2.0]], dtype=torch.float64)
    g = torch.tensor([-0.5, 0.5, 1.5, -0.5], dtype=torch.float64)

    def retained(leaf, read_grad_fn):
        x0, w = leaf(x), leaf(torch.tensor([-2.0], dtype=torch.float64))
        t0 = x0.detach()
        t1 = t0[-1]
        t0.sub_(w, alpha=0.5)
        if read_grad_fn:
            t1.grad_fn  # noqa: B018
        t1.retain_grad()
        torch.cumprod(t1, 0).backward(g)
        return t1.grad

    ours = retained(lambda v: tt.tracer(v, requires_grad=True), False)
    assert retained(lambda v: v.clone().requires_grad_(True), False) is None  # torch's miss
    theirs = retained(lambda v: v.clone().requires_grad_(True), True)
    torch.testing.assert_close(ours, theirs)
    torch.testing.assert_close(ours, torch.tensor([-0.5, 0.0, 0.0, 0.0], dtype=torch.float64))
