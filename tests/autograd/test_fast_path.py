"""The short path of recording and backward: fresh results become tracers in place, metadata reads record nothing,
keyword plans, and the newest-first walk. Each gradient is compared with torch autograd and finite differences."""
import gc
import weakref

import pytest
import torch
import torch.nn.functional as F
from helpers import check_op

import torchtrace as tt
from torchtrace.autograd import arguments
from torchtrace.autograd.state import observing

D = torch.float64


def recorded(fn, *args):
    """The nodes fn(*args) records."""
    nodes = []
    with observing(on_record=lambda node, *_: nodes.append(node)):
        fn(*args)
    return nodes


def test_metadata_reads_record_nothing_and_answer_as_torch():
    x = tt.randn(3, 4, requires_grad=True)
    y = (x * 2).t()
    plain = torch.Tensor.as_subclass(y, torch.Tensor)
    reads = [lambda t: t.shape, lambda t: t.dim(), lambda t: t.size(0), lambda t: t.size(), lambda t: t.dtype,
             lambda t: t.device, lambda t: t.ndim, lambda t: t.numel(), lambda t: t.stride(),
             lambda t: t.is_contiguous(), lambda t: t.storage_offset(), lambda t: t.is_floating_point(), len]
    for read in reads:
        assert recorded(read, y) == []
        assert read(y) == read(plain)


def test_a_fresh_result_is_the_tracer_itself_and_an_argument_returned_as_is_stays_what_it_was():
    leaf = torch.randn(3, dtype=torch.float32)
    for x in (tt.randn(3, requires_grad=True), tt.randn(3)):  # recorded, and not
        out = torch.Tensor.type_as(leaf, x)  # torch hands the plain argument back as it is
        items = torch.atleast_1d([leaf, x])
        assert type(leaf) is torch.Tensor and type(out) is tt.tracer and type(items[0]) is tt.tracer
    y = x * 2
    assert type(y) is tt.tracer and y.grad_fn is None and not y.requires_grad


def test_a_saved_output_does_not_keep_its_tracer_alive():
    """tanh saves its own result: the node keeps a plain tensor, so the tracer the user holds is no part of a cycle
    and goes away with the user's reference (no garbage collection needed)."""
    gc.disable()
    try:
        x = tt.randn(4, requires_grad=True)
        y = x.tanh()
        node, alive = y.grad_fn, weakref.ref(y)
        (saved,) = [t for t in node.saved if t is not None]
        assert type(saved) is torch.Tensor
        del y
        assert alive() is None
        assert saved is node.saved[-1]  # the graph still has what backward needs
    finally:
        gc.enable()


def test_tanh_chain_gradients_match_torch_and_finite_differences():
    check_op(lambda x, w: torch.tanh(x @ w).tanh().sum(), torch.randn(3, 4, dtype=D), torch.randn(4, 2, dtype=D))


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_a_keyword_plan_gives_the_same_gradient_as_the_first_call(reduction):
    x, t = torch.randn(5, 3, dtype=D), torch.randn(5, 3, dtype=D)
    for _ in range(3):  # the first call makes the plan, the next ones use it
        check_op(lambda a, b: F.mse_loss(a, b, reduction=reduction), x, t)
    assert any(key[0] is F.mse_loss and "reduction" in key[2:] for key in arguments.KEYWORD_PLANS)


def test_a_keyword_plan_is_per_keyword_names_and_positional_count():
    x, t = torch.randn(4, dtype=D), torch.randn(4, dtype=D)
    check_op(lambda a, b: F.smooth_l1_loss(a, b, reduction="sum", beta=0.5), x, t)
    check_op(lambda a, b: F.smooth_l1_loss(a, b, beta=0.5, reduction="sum"), x, t)
    check_op(lambda a, b: F.smooth_l1_loss(a, target=b, beta=2.0), x, t)
    check_op(lambda a, b: F.smooth_l1_loss(input=a, target=b), x, t)


def test_newest_first_walk_on_a_dag_whose_depth_first_order_differs():
    """Two roots sharing a deep branch, a diamond, and a node used by an older and a newer node."""
    def f(x, w):
        a = x * w
        b = a.sin()
        c = a * 3  # newer than b, used before b by d below
        d = c + b
        e = (d * a).tanh()  # a reached again from a newer node
        return e.sum() + b.sum() * 2

    check_op(f, torch.randn(3, dtype=D), torch.randn(3, dtype=D))


def test_several_roots_one_inside_the_others_graph():
    r = torch.randn(3, dtype=D, requires_grad=True)
    x = tt.tracer(r.detach(), requires_grad=True)
    inner = (x * 2).sin()
    outer = (inner * inner).sum()
    tt.backward([outer, inner.sum()])
    inner_t = (r * 2).sin()
    torch.autograd.backward([(inner_t * inner_t).sum(), inner_t.sum()])
    torch.testing.assert_close(x.grad, r.grad)
    assert tt.gradcheck(lambda t: ((t * 2).sin() ** 2).sum() + (t * 2).sin().sum(), r.detach())


def test_nodes_are_numbered_in_creation_order():
    x = tt.randn(2, requires_grad=True)
    y = x * 2
    z = y + 1
    assert z.grad_fn.sequence_nr > y.grad_fn.sequence_nr
    assert all(edge.node.sequence_nr < z.grad_fn.sequence_nr for edge in z.grad_fn.edges)
    assert torch.equal(y.grad_fn.value_refs[0](), y)  # the output, kept for tools that show values
