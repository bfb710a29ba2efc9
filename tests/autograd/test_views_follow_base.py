"""Views share memory with their base: in-place changes through either reach the other's gradient (as torch).

Every case runs under torch autograd and on tracers (tt.check) and against finite differences (tt.gradcheck).
"""
import functools

import pytest
import torch

import torchtrace as tt
from tests.helpers import check_op, double_backward_matches


def base_changed_after_view(w):
    y = torch.ones_like(w)
    v = y[1:]
    y.mul_(w)  # y now requires grad; v, taken before, must follow
    return (v * v).sum() + y.sum()


def nonleaf_base_changed(w):
    y = w * 1
    v = y[1:]
    y.mul_(w)
    return (v * v).sum()


def transposed_view(w):
    y = w.reshape(3, 4) * 2
    v = y.t()
    y.add_(y.detach() * 0 + w.reshape(3, 4).exp())
    return (v * torch.arange(3.0, dtype=w.dtype)).sum()


def view_of_view(w):
    y = w * 1
    v = y[1:][::2]
    y.sin_()
    return (v ** 3).sum()


def expanded_view(w):
    y = w[:3] * 1
    v = y.expand(2, 3)
    y.mul_(w[3:6])
    return (v * torch.tensor([[1.0], [2.0]], dtype=w.dtype)).sum()


def inplace_on_view(w):
    y = w * 1
    y[1:].mul_(3)
    return (y * y).sum()


def augmented_assignment_on_index(w):
    y = w * 1
    y[0] += w[1] * w[2]
    return (y * y).sum()


def view_changed_then_used(w):
    y = w * 1
    v = y[:2]
    v.exp_()
    return (v * y[:2]).sum() + y.sum()


def diagonal_written(w):
    y = w[:9].reshape(3, 3) * 1
    y.diagonal().mul_(w[9:12])
    return (y * y).sum()


def overlapping_views(w):
    y = w * 1
    a, b = y[:4], y[2:]
    a.mul_(2)
    return (b * b).sum() + a.sum()


def buffer_written_through_view(w):
    buf = torch.zeros_like(w)
    buf[:4].add_(w[:4] ** 2)
    return (buf * torch.arange(12.0, dtype=w.dtype)).sum()


def copied_into_view(w):
    buf = torch.zeros_like(w).reshape(3, 4)
    buf[1].copy_(w[:4].tanh())
    buf[:, 0].copy_(w[4])  # broadcast source
    return (buf * buf).sum()


def transposed_view_written(w):
    y = w.reshape(3, 4) * 1
    y.t()[1:3].add_(w[:6].reshape(2, 3))
    return (y ** 2).sum()


def view_transposed_in_place(w):
    """t_ on a view changes only the view's strides: it wrote the transposed values into the base's graph."""
    y = w[:4].reshape(2, 2) * 1
    y[:].t_()
    return (y * torch.tensor([[1.0, 10.0], [100.0, 1000.0]], dtype=w.dtype)).sum()


def view_reshaped_in_place_then_written(w):
    y = w.reshape(3, 4) * 1
    v = y[:, :2]
    v.swapdims_(0, 1)
    v.mul_(w[:6].reshape(2, 3))
    v.unsqueeze_(0)
    v.add_(w[6])
    v.squeeze_(0)
    return (y * y * torch.arange(12.0, dtype=w.dtype).reshape(3, 4)).sum() + (v * v).sum()


def view_as_strided_in_place(w):
    y = w * 1
    v = y[2:10]
    v.as_strided_((2, 3), (3, 1))
    v.mul_(w[:3])
    return (y * torch.arange(12.0, dtype=w.dtype)).sum() + v.sum()


CASES = [base_changed_after_view, nonleaf_base_changed, transposed_view, view_of_view, expanded_view,
         inplace_on_view, augmented_assignment_on_index, view_changed_then_used, diagonal_written, overlapping_views,
         buffer_written_through_view, copied_into_view, transposed_view_written, view_transposed_in_place,
         view_reshaped_in_place_then_written, view_as_strided_in_place]


@pytest.mark.parametrize("fn", CASES, ids=lambda f: f.__name__)
def test_gradients_follow_memory_shared_by_views(fn):
    check_op(fn, torch.rand(12) + 0.5)


@pytest.mark.parametrize("fn", [nonleaf_base_changed, inplace_on_view, diagonal_written, transposed_view_written,
                                view_reshaped_in_place_then_written],
                         ids=lambda f: f.__name__)
def test_second_derivatives_follow_views(fn):
    double_backward_matches(fn, torch.rand(12, dtype=torch.float64) + 0.5)


def test_a_view_follows_its_base_in_requires_grad_and_grad_fn():
    w = tt.tracer(torch.rand(3), requires_grad=True)
    y = tt.ones(3)
    v = y[1:]
    assert not v.requires_grad
    y.mul_(w)
    assert v.requires_grad and v.grad_fn is not None
    assert v._base is y


def test_a_view_of_a_leaf_that_requires_grad_refuses_in_place():
    w = tt.tracer(torch.rand(3), requires_grad=True)
    with pytest.raises(RuntimeError, match="a view of a leaf tracer that requires grad is used in an in-place"):
        w[1:].mul_(2)


def test_a_view_whose_base_is_unknown_refuses_after_its_memory_changed():
    y = tt.tracer(torch.rand(4), requires_grad=True) * 1
    v = y[1:]
    v._tt_base = None  # as for a view torchtrace could not trace to a tracer argument
    with pytest.raises(RuntimeError, match="does not know the tensor it is a view of"):
        v.mul_(2)


def test_copy_into_a_tensor_sends_the_gradient_to_the_source_and_zeros_to_the_old_value():
    """torch's CopyBackwards: dsrc = g summed to src's shape, dself = zeros_like(g): x's .grad is zeros, not None
    (an optimizer then still applies weight decay and momentum to it)."""
    results = []
    for make in (lambda t: tt.tracer(t, requires_grad=True), lambda t: t.clone().requires_grad_(True)):
        w, x = make(torch.linspace(0, 1, 2).reshape(2, 1)), make(torch.linspace(-1, 1, 6).reshape(2, 3))
        y = x * 1
        y.copy_(w)  # broadcast
        (y * 3).sum().backward()
        results.append([t.grad.as_subclass(torch.Tensor) for t in (w, x)])
    (w_ours, x_ours), (w_torch, x_torch) = results
    torch.testing.assert_close(w_ours, torch.full((2, 1), 9.0))
    torch.testing.assert_close(w_ours, w_torch)
    assert torch.equal(x_ours, torch.zeros(2, 3)) and torch.equal(x_torch, torch.zeros(2, 3))


def test_views_from_one_multi_output_call_refuse_their_base_changing_as_torch():
    """unbind's rows are pieces of one multi-output call: torch refuses to use one after its base changed in place
    (one backward serves all rows), and so does torchtrace, in torch's words; the same program written with single
    views follows the base, with torch's gradient."""
    def rows_then_mul(w, split):
        y = w.reshape(3, 4) * 1
        rows = y.unbind(0) if split else (y[0], y[1], y[2])
        y.mul_(w.reshape(3, 4))
        return rows[0].sum() + (rows[2] ** 2).sum()

    w = torch.rand(12, dtype=torch.float64)
    messages = []
    for leaf in (tt.tracer(w, requires_grad=True), w.clone().requires_grad_(True)):
        with pytest.raises(RuntimeError) as raised:
            rows_then_mul(leaf, split=True)
        messages.append(str(raised.value))
    assert messages[0] == messages[1]
    assert messages[0].startswith("Output 0 of Unbind is a view and its base or another view of its base has been "
                                  "modified inplace.")
    ours = tt.tracer(w, requires_grad=True)
    rows_then_mul(ours, split=False).backward()
    theirs = w.clone().requires_grad_(True)
    rows_then_mul(theirs, split=False).backward()
    torch.testing.assert_close(ours.grad.as_subclass(torch.Tensor), theirs.grad)


def _funnel_style(a, b):
    """einsum hands back a view of its own internal result; slices of it change in place (HF Funnel's pattern)."""
    y = torch.einsum("bij,bjk->bik", a, b)
    y[:, 0] += 1.5 * y[:, 1]
    y[..., 2].mul_(3)
    y[:, :, 0] = y[:, :, 1] * 0.5
    return y.pow(2)


def test_in_place_changes_of_a_view_of_an_ops_internal_result_as_torch():
    a, b = torch.randn(2, 3, 4, dtype=torch.float64), torch.randn(2, 4, 5, dtype=torch.float64)
    with torch.no_grad():
        assert torch.einsum("bij,bjk->bik", a, b)._is_view()  # what makes this case: a view of a temporary
    check_op(_funnel_style, a, b)


def view_written_in_place_is_the_output(w):
    y = w * 1
    v = y[1:]
    v.mul_(w[:-1])  # through the view into y: v's own value is now y's
    return v


def base_written_after_view_is_the_output(w):
    y = w * 1
    v = y[1:]
    y.mul_(w)  # v, taken before, now reads the changed base
    return v


@pytest.mark.parametrize("fn", [view_written_in_place_is_the_output, base_written_after_view_is_the_output],
                         ids=lambda f: f.__name__)
def test_backward_starts_from_a_view_as_it_is_now(fn):
    """backward() and tt.grad from a view whose memory changed in place since it was taken start at its value now."""
    check_op(fn, torch.rand(12) + 0.5)
    w = tt.tracer(torch.rand(12, dtype=torch.float64) + 0.5, requires_grad=True)
    reference = w.detach().as_subclass(torch.Tensor).clone().requires_grad_()
    g = torch.rand(11, dtype=torch.float64)
    fn(reference).backward(g)
    fn(w).backward(g)
    (by_grad,) = tt.grad(fn(w), w, g)
    torch.testing.assert_close(w.grad, reference.grad, rtol=1e-12, atol=0)
    torch.testing.assert_close(by_grad, reference.grad, rtol=1e-12, atol=0)


def hooked_view_added_to_itself(w, scale=0.5):
    y = w[:12].reshape(4, 3) * 1
    v = y.transpose(0, 1)
    if v.requires_grad:  # (finite differences run it on plain tensors)
        v.register_hook(lambda g: g * scale)
    v.add_(v)  # torch: the written v reaches y through the base, the added v through v's own node and its hook
    return (v[1:] * torch.arange(8.0, dtype=w.dtype).reshape(2, 4)).sum()


def hooked_view_plus_twice_itself(w, scale=3.0):
    y = w[:12].reshape(4, 3) * 1
    v = y[:, 1]
    if v.requires_grad:  # (finite differences run it on plain tensors)
        v.register_hook(lambda g: g * scale)
    v.add_(v * 2)
    return (y * y).sum()


def hooked_view_of_a_changed_base(w, scale=0.5):
    y = w[:12] * 1
    v = y[:5]
    if v.requires_grad:  # (finite differences run it on plain tensors)
        v.register_hook(lambda g: g * scale)
    y.mul_(2)  # v is out of date: the added v is read as a view of y as it is now (its hook is not on that path)
    v.add_(v)
    return (y * y).sum()


@pytest.mark.parametrize("fn", [hooked_view_added_to_itself, hooked_view_plus_twice_itself,
                                hooked_view_of_a_changed_base], ids=lambda f: f.__name__)
def test_a_hooked_view_written_with_itself_as_torch(fn):
    """A hook that scales a gradient makes it no derivative: torch autograd is the reference then. With the hook
    scaling by 1 the same program is checked against finite differences too."""
    check_op(fn, torch.rand(12) + 0.5, gradcheck=False)
    check_op(functools.partial(fn, scale=1.0), torch.rand(12) + 0.5)


@pytest.mark.parametrize("write", ["mul_", "setitem", "relu inplace", "add_ of a tracer"])
@pytest.mark.parametrize("mode", ["no_grad", "inference_mode", "chunk under no_grad", "leaf base"])
def test_a_view_taken_without_grad_mode_is_not_changed_in_place_with_it_as_torch(mode, write):
    """y[1:] taken under no_grad, then v.mul_(10) with grad mode on: y's data changed but its graph did not, so
    x.grad was [2, 2, 2] for a y whose gradient is [2, 20, 20]. torch refuses the write; so does torchtrace."""
    import torch.nn.functional as F

    writes = {"mul_": lambda v, x: v.mul_(10), "setitem": lambda v, x: v.__setitem__(0, 5.0),
              "relu inplace": lambda v, x: F.relu(v, inplace=True), "add_ of a tracer": lambda v, x: v.add_(x[:1] * 1)}
    for make in (lambda v: torch.tensor(v, requires_grad=True), lambda v: tt.tracer(v, requires_grad=True)):
        x = make([1.0, 2.0, 3.0, 4.0])
        y = x if mode == "leaf base" else x * 2
        with torch.inference_mode() if mode == "inference_mode" else torch.no_grad():
            v = y.chunk(2)[1] if mode == "chunk under no_grad" else y[1:]
        with pytest.raises(RuntimeError, match="created in (no_grad|inference) mode and is being modified inplace"):
            writes[write](v, x)
    before = y.tolist()
    with torch.no_grad():  # both inside the block: allowed, as torch
        v = y[1:]
        v.mul_(10)
    assert y.tolist() == [before[0], *[10 * value for value in before[1:]]]


def test_a_leaf_view_of_a_tensor_without_gradient_stays_a_leaf_when_its_base_changes():
    """v = a[1:3]; v.requires_grad_(); a.mul_(2): v lost requires_grad (it became a view of a, which needs none),
    and backward failed. torch keeps v a leaf whose values are a's new ones; so does torchtrace."""
    weights = torch.tensor([1.0, 10.0], dtype=torch.float64)
    grads, values = [], []
    for make in (lambda: torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64),
                 lambda: tt.tracer(torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64))):
        a = make()
        v = a[1:3]
        v.requires_grad_()
        a.mul_(2)
        assert v.requires_grad and v.is_leaf
        ((v * v) * weights).sum().backward()
        grads.append(v.grad.as_subclass(torch.Tensor))
        values.append(v.detach().as_subclass(torch.Tensor))
    torch.testing.assert_close(grads[1], grads[0])
    torch.testing.assert_close(grads[1], 2 * values[1] * weights)  # d/dv Σ w v² = 2 w v, at v's new values
