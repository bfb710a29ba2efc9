"""backward / tt.backward / tt.grad: DAGs, accumulation, freeing, errors, create_graph, in-place."""
import contextlib
import gc
import weakref

import pytest
import torch

import torchtrace as tt


def leaf(*values, dtype=torch.float32):
    return tt.tracer(list(values), dtype=dtype, requires_grad=True)


def test_fan_out_accumulates():
    x = leaf(1.0, 2.0)
    y = x * x + x * 3 + x
    y.sum().backward()
    assert x.grad.tolist() == [6.0, 8.0]


def test_broadcasting_is_undone():
    a = tt.tracer(torch.ones(3, 1, 4), requires_grad=True)
    b = tt.tracer(torch.ones(5, 1), requires_grad=True)
    c = tt.tracer(torch.tensor(2.0), requires_grad=True)
    (a * b * c).sum().backward()
    assert a.grad.shape == (3, 1, 4) and b.grad.shape == (5, 1) and c.grad.shape == ()
    assert torch.all(a.grad == 10.0) and torch.all(b.grad == 24.0) and c.grad.item() == 60.0


def test_gradient_dtype_follows_the_input():
    a = tt.tracer(torch.ones(3), requires_grad=True)
    s = tt.tracer(torch.tensor(2.0, dtype=torch.float64), requires_grad=True)
    (a * s).sum().backward()
    assert a.grad.dtype == torch.float32 and s.grad.dtype == torch.float64 and s.grad.item() == 3.0


def test_gradients_accumulate_across_calls():
    x = leaf(1.0, 2.0)
    (x * 2).sum().backward()
    (x * 3).sum().backward()
    assert x.grad.tolist() == [5.0, 5.0]


def test_shared_gradient_objects_are_not_aliased_between_leaves():
    a, b = leaf(1.0), leaf(2.0)
    (a + b).sum().backward()
    a.grad.mul_(10)
    assert b.grad.tolist() == [1.0]


def test_explicit_gradient_for_non_scalar_output():
    x = leaf(1.0, 2.0)
    (x * x).backward(torch.tensor([1.0, 10.0]))
    assert x.grad.tolist() == [2.0, 40.0]


def test_tt_backward_with_several_roots():
    x = leaf(1.0, 2.0)
    tt.backward([(x * 2).sum(), x * x], [None, torch.ones(2)])
    assert x.grad.tolist() == [4.0, 6.0]


def test_a_chain_of_100000_nodes_back_propagates_without_recursion():
    x = leaf(1.0)
    y = x
    for _ in range(100_000):
        y = y + 1.0
    y.backward()
    assert x.grad.tolist() == [1.0]


def test_saved_intermediates_are_freed_after_backward():
    x = leaf(1.0, 2.0)
    y = x * 2
    z = (y * y).sum()
    ref = weakref.ref(y)
    del y
    gc.collect()
    assert ref() is not None  # kept alive by the graph, saved by MulBackward
    z.backward()
    assert ref() is None


def test_retain_graph_keeps_saved_tensors():
    x = leaf(1.0, 2.0)
    y = x * 2
    z = (y * y).sum()
    ref = weakref.ref(y)
    del y
    z.backward(retain_graph=True)
    assert ref() is not None
    z.backward()
    assert x.grad.tolist() == [16.0, 32.0]


def test_second_backward_through_freed_graph_raises():
    x = leaf(1.0, 2.0)
    z = (x * x).sum()
    z.backward()
    with pytest.raises(RuntimeError, match="backward through the graph a second time.*MulBackward.*retain_graph=True"):
        z.backward()


def test_non_scalar_backward_without_gradient_raises():
    x = leaf(1.0, 2.0)
    with pytest.raises(RuntimeError, match=r"only for scalar outputs.*\(2,\).*gradient="):
        (x * 2).backward()


def test_gradient_of_wrong_shape_raises():
    with pytest.raises(RuntimeError, match="gradient has shape"):
        (leaf(1.0, 2.0) * 2).backward(torch.ones(3))


def test_backward_on_tracer_without_grad_raises():
    with pytest.raises(RuntimeError, match="does not require grad"):
        tt.tracer([1.0]).sum().backward()


def test_in_place_change_of_a_saved_tensor_raises():
    x = leaf(1.0, 2.0)
    y = x * 1
    z = (y * y).sum()
    with torch.no_grad():
        y.add_(1)
    with pytest.raises(RuntimeError, match="saved by MulBackward.*modified by an in-place operation"):
        z.backward()


def test_in_place_ops_on_non_leaves_are_recorded():
    x = leaf(1.0, 2.0)
    w = leaf(3.0, 4.0)
    y = x * 1
    y.add_(2)
    y.mul_(w)
    y += x
    y.sum().backward()
    xt = torch.tensor([1.0, 2.0], requires_grad=True)
    wt = torch.tensor([3.0, 4.0], requires_grad=True)
    yt = xt * 1
    yt.add_(2)
    yt.mul_(wt)
    yt += xt
    yt.sum().backward()
    assert torch.equal(x.grad, xt.grad) and torch.equal(w.grad, wt.grad)
    assert y.grad_fn.name == "AddBackward"


def test_in_place_op_with_a_grad_requiring_argument_on_a_constant():
    x = leaf(1.0, 2.0)
    buffer = tt.zeros(2)
    buffer.add_(x * x)
    buffer.sum().backward()
    assert x.grad.tolist() == [2.0, 4.0] and not buffer.is_leaf


def test_in_place_on_a_leaf_that_requires_grad_raises():
    x = leaf(1.0)
    with pytest.raises(RuntimeError, match="torch.Tensor.add_: a leaf tracer that requires grad is used in"):
        x.add_(1)


def test_grad_returns_without_touching_dot_grad():
    x, w = leaf(1.0, 2.0), leaf(3.0, 4.0)
    y = x * w
    gx, gy = tt.grad((y * y).sum(), [x, y])
    assert gx.tolist() == [18.0, 64.0] and gy.tolist() == [6.0, 16.0]
    assert x.grad is None and w.grad is None


def test_grad_outputs_and_allow_unused():
    x, unused = leaf(1.0, 2.0), leaf(5.0)
    (gx,) = tt.grad(x * 3, x, grad_outputs=torch.tensor([1.0, 2.0]))
    assert gx.tolist() == [3.0, 6.0]
    with pytest.raises(RuntimeError, match="allow_unused=True"):
        tt.grad((x * 2).sum(), [x, unused])
    assert tt.grad((x * 2).sum(), [x, unused], allow_unused=True)[1] is None


def test_create_graph_gives_second_derivatives():
    x = leaf(1.0, 2.0, 3.0)
    (g,) = tt.grad((x ** 3).sum(), x, create_graph=True)
    assert g.requires_grad and g.tolist() == [3.0, 12.0, 27.0]
    (h,) = tt.grad(g.sum(), x)
    assert h.tolist() == [6.0, 12.0, 18.0]


def test_hessian_vector_product_matches_torch():
    values = [0.5, -1.0, 2.0]
    v = torch.tensor([1.0, 0.5, -2.0])
    x = leaf(*values)
    (g,) = tt.grad((x * x * x / (x * x + 1)).sum(), x, create_graph=True)
    (hv,) = tt.grad((g * v).sum(), x)
    xt = torch.tensor(values, requires_grad=True)
    gt = xt * 0
    yt = (xt * xt * xt / (xt * xt + 1)).sum()
    yt.backward(create_graph=True)
    gt = xt.grad
    xt.grad = None
    (gt * v).sum().backward()
    torch.testing.assert_close(hv, xt.grad)


def test_backward_with_create_graph_stores_a_differentiable_grad():
    x = leaf(2.0)
    (x * x * x).backward(create_graph=True)
    assert isinstance(x.grad, tt.tracer) and x.grad.requires_grad
    gradient_of_grad = tt.grad(x.grad, x)[0]
    assert gradient_of_grad.tolist() == [12.0]


def test_in_place_on_a_view_reaches_the_base_as_in_torch():
    def program(x, buffer):
        y = x * 1
        y[1] += x[0]
        buffer[1:].add_(x[1:])
        return (y * buffer).sum()

    x = leaf(1.0, 2.0, 3.0)
    program(x, tt.zeros(3)).backward()
    theirs = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    program(theirs, torch.zeros(3)).backward()
    assert x.grad.tolist() == theirs.grad.tolist()


def _rows_written_into_a_buffer(x):
    out = torch.zeros(4, 3, dtype=x.dtype)
    out[1] = x[0] * 2
    out[2:] = x[1:3].sin()
    return (out ** 2).sum() + out[0].sum()


def _rnn_outputs_in_a_buffer(x):
    h, outs = torch.zeros(3, dtype=x.dtype), torch.zeros(4, 3, dtype=x.dtype)
    for t in range(4):
        h = torch.tanh(x[t % 3] + h * 0.5)
        outs[t] = h
    return outs.pow(2).sum()


def _accumulated_in_place(x):
    acc = torch.zeros(3, dtype=x.dtype)
    acc += x[0]
    acc.add_(x[1] * 2)
    acc.mul_(x[2])
    return acc.sum() + torch.empty(3, dtype=x.dtype).copy_(x[1]).mul(x[0]).sum()


def _scattered_into_a_buffer(x):
    out = torch.zeros(5, 3, dtype=x.dtype)
    out.index_put_((torch.tensor([0, 2]),), x[:2], accumulate=True)
    out.scatter_(1, torch.tensor([[0], [1], [2], [0], [1]]), out[:, :1] * 3)
    return (out * torch.arange(15.0, dtype=x.dtype).reshape(5, 3)).sum()


@pytest.mark.parametrize("program", [_rows_written_into_a_buffer, _rnn_outputs_in_a_buffer, _accumulated_in_place,
                                     _scattered_into_a_buffer])
def test_a_plain_tensor_written_with_a_grad_requiring_value_joins_the_graph_as_in_torch(program):
    """out = torch.zeros(...); out[i] = h: torch makes out part of the graph; so does torchtrace (out becomes a tracer,
    the same object). Checked against torch autograd and central differences."""
    base = torch.randn(3, 3, dtype=torch.float64)
    ours, theirs = tt.tracer(base.clone(), requires_grad=True), base.clone().requires_grad_()
    loss = program(ours)
    loss.backward()
    program(theirs).backward()
    assert torch.allclose(loss.detach(), program(base).detach())
    torch.testing.assert_close(ours.grad.as_subclass(torch.Tensor), theirs.grad)
    numeric = torch.zeros_like(base)
    for i in range(base.numel()):
        step = torch.zeros(base.numel(), dtype=torch.float64)
        step[i] = 1e-6
        numeric.view(-1)[i] = (program(base + step.view_as(base)) - program(base - step.view_as(base))) / 2e-6
    torch.testing.assert_close(ours.grad.as_subclass(torch.Tensor), numeric, rtol=1e-6, atol=1e-6)


def test_a_plain_tensor_that_shares_its_memory_is_not_written_with_a_grad_requiring_value():
    """A view taken before the write (or a write into a view) would read the new values without their gradient:
    torch follows the view; torchtrace cannot see it, so it refuses and says what to do."""
    x = leaf(1.0, 2.0)
    out = torch.zeros(2, 2)
    row = out[0]
    with pytest.raises(RuntimeError, match="shares its memory"):
        out[0] = x
    with pytest.raises(RuntimeError, match="shares its memory"):
        row.copy_(x)
    assert type(out) is torch.Tensor and type(row) is torch.Tensor and not out.any()


@pytest.mark.parametrize("make, reason", [
    (lambda: torch.nn.Parameter(torch.zeros(2)), "subclass of torch.Tensor"),
    (lambda: torch.zeros(2, requires_grad=True), "requires grad in torch autograd"),
])
def test_a_plain_destination_torch_itself_would_refuse_is_refused_with_its_reason(make, reason):
    """torch refuses these too (an in-place write into a leaf that requires grad); torchtrace says why."""
    out = make()
    with pytest.raises(RuntimeError, match=reason):
        out.copy_(leaf(1.0, 2.0))
    with pytest.raises(RuntimeError):
        make().copy_(torch.ones(2, requires_grad=True) * 1)
    assert not out.detach().any()


def test_an_inference_tensor_is_not_a_destination():
    with torch.inference_mode():
        out = torch.zeros(2)
    with pytest.raises(RuntimeError, match="inference_mode"):
        out.copy_(leaf(1.0, 2.0))


@pytest.mark.parametrize("readable", [False, True])
def test_enable_grad_inside_inference_mode_records_nothing_as_torch(readable):
    """torch records nothing inside torch.inference_mode, even under enable_grad: the results are inference tensors
    that need no gradient (reading their version counter crashed the recording with a RuntimeError)."""

    def run(x):
        with torch.inference_mode(), torch.enable_grad():
            return [x * 2, torch.tanh(x), x.sum(), torch.cat([x, x]), x.exp().mul(3)]

    with tt.readable() if readable else contextlib.nullcontext():
        ours = run(leaf(1.0, 2.0))
    theirs = run(torch.tensor([1.0, 2.0], requires_grad=True))
    for a, b in zip(ours, theirs):
        assert (a.requires_grad, a.is_inference(), a.grad_fn is None) == (b.requires_grad, b.is_inference(), True)
        assert torch.equal(a.as_subclass(torch.Tensor), b)


def test_mul_by_a_number_saves_nothing_that_a_later_write_could_spoil():
    x = leaf(1.0, 2.0)
    y = x * 1
    f = y * 3
    y.add_(1)
    f.sum().backward()
    assert x.grad.tolist() == [3.0, 3.0]
