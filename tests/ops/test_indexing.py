"""Gradient rules of torchtrace/ops/indexing.py: x[index], x[index] = v, gather/scatter, index_* ops, masks."""
import pytest
import torch
from helpers import assert_every_rule_exercised, check_op, double_backward_matches, float_tolerances

import torchtrace as tt
from torchtrace.autograd.function import INPLACE
from torchtrace.ops.indexing import setitem

T = torch.Tensor
DTYPES = [torch.float64, torch.float32]


def ints(*values):
    return torch.tensor(values)


# x[index]: one line per kind of index, on x of shape (3, 4, 5) unless the line says otherwise.
GETITEM = {
    "int": lambda x: x[1],
    "negative int": lambda x: x[-1, -2],
    "all ints -> 0-d": lambda x: x[0, 1, 2],
    "slice": lambda x: x[1:],
    "slice with step": lambda x: x[::2, 1::2, ::3],
    "negative slice bounds": lambda x: x[-2:, :-1],
    "None": lambda x: x[None, :, None],
    "Ellipsis": lambda x: x[..., 1],
    "Ellipsis and None": lambda x: x[1, ..., None],
    "empty tuple": lambda x: x[()],
    "integer tensor": lambda x: x[ints(2, 0)],
    "repeated integer tensor (accumulates)": lambda x: x[ints(1, 1, 2, 1)],
    "2-D integer tensor": lambda x: x[ints(0, 2, 2, 1).reshape(2, 2)],
    "negative integer tensor": lambda x: x[:, ints(-1, 0, -1)],
    "0-d integer tensor": lambda x: x[torch.tensor(1)],
    "list of ints": lambda x: x[[0, 0, 2]],
    "two integer tensors (broadcast)": lambda x: x[ints(0, 1, 1), ints(3, 3, 0)],
    "tensors around a slice": lambda x: x[ints(0, 2), :, ints(4, 4)],
    "slice then tensor": lambda x: x[1:, ints(0, 0, 3)],
    "tensor, Ellipsis, None": lambda x: x[ints(2, 2), ..., None],
    "boolean mask of all dims": lambda x: x[x > 0],
    "boolean mask of the first dim": lambda x: x[torch.tensor([True, False, True])],
    "boolean mask then slice": lambda x: x[torch.tensor([False, True, True]), 1:3],
    "bool Python scalar": lambda x: x[True],
    "used twice": lambda x: x[0] * x[ints(0, 0)] + x[1:, ..., 0:1],
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", list(GETITEM))
def test_getitem_matches_torch(name, dtype):
    check_op(GETITEM[name], torch.randn(3, 4, 5, dtype=dtype), **float_tolerances(dtype))


@pytest.mark.parametrize("index", [(), Ellipsis, None, (None, None)], ids=["()", "...", "None", "None, None"])
def test_getitem_of_a_0_d_tensor(index):
    check_op(lambda x: x[index] * x, torch.randn((), dtype=torch.float64))


@pytest.mark.parametrize("name", ["slice with step", "two integer tensors (broadcast)", "boolean mask then slice",
                                  "tensors around a slice"])
def test_getitem_of_a_non_contiguous_tensor(name):
    x = torch.randn(5, 4, 3, dtype=torch.float64).permute(2, 1, 0)
    assert not x.is_contiguous()
    check_op(GETITEM[name], x)


def test_getitem_with_an_index_tracer():
    index = tt.tracer(ints(2, 0, 2))
    x = tt.tracer(torch.randn(3, 2), requires_grad=True)
    x[index].sum().backward()
    assert torch.equal(x.grad, torch.tensor([[1.0, 1.0], [0.0, 0.0], [2.0, 2.0]]))


# x[index] = value, recorded through the out-of-place setitem (the dispatcher's INPLACE table).

def assign(index, value_fn=lambda v: v):
    """fn(x, v): y = x * 1 (a non-leaf); y[index] = value_fn(v); return y * y."""
    def fn(x, v):
        y = x * 1
        y[index] = value_fn(v)
        return y * y
    return fn


SETITEM = {
    "int row": (assign(1), (4,)),
    "slice, value broadcast": (assign(slice(1, None)), (4,)),
    "slice with step": (assign((slice(None, None, 2), 0)), (2,)),
    "integer tensor": (assign(ints(2, 0)), (2, 4)),
    "boolean mask": (assign(torch.tensor([True, False, True])), (1, 4)),
    "Ellipsis": (assign((Ellipsis, 3)), (3,)),
    "0-d value": (assign((0, ints(1, 3))), ()),
    "value with an extra leading 1": (assign(0), (1, 4)),
    "value used twice": (assign(ints(0, 1), lambda v: v * v), (4,)),
}


@pytest.mark.parametrize("name", list(SETITEM))
def test_setitem_into_a_non_leaf_matches_torch(name):
    fn, value_shape = SETITEM[name]
    check_op(fn, torch.randn(3, 4, dtype=torch.float64), torch.randn(value_shape, dtype=torch.float64))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_setitem_of_a_number(dtype):
    check_op(assign((slice(None), ints(0, 0, 2)), lambda v: 2.5), torch.randn(3, 4, dtype=dtype), torch.randn(()))


def test_setitem_of_a_value_of_another_dtype():
    check_op(assign(1, lambda v: v.float() * 2), torch.randn(3, 4, dtype=torch.float64), torch.randn(4),
             rtol=1e-4, atol=1e-5, gradcheck=False)  # float32 rounding inside: no finite differences
    x = tt.tracer(torch.randn(2, 3, dtype=torch.float64), requires_grad=True)
    v = tt.tracer(torch.randn(3), requires_grad=True)
    assign(0)(x, v).sum().backward()
    assert v.grad.dtype == torch.float32 and x.grad.dtype == torch.float64


def test_setitem_into_a_plain_tracer():
    def fn(x, v):
        y = x.new_zeros(3, 4)  # a tracer that does not require grad, when x is one
        y[x > 0] = v
        y[0, 1:3] = v * 2
        return y

    check_op(fn, torch.randn(3, 4, dtype=torch.float64), torch.randn((), dtype=torch.float64))
    plain = tt.zeros(2, 2)
    value = tt.tracer([1.0, 2.0], requires_grad=True)
    plain[1] = value
    assert plain.requires_grad and plain.grad_fn.name == "SetItemBackward"
    (plain * tt.tracer([[1.0, 1.0], [3.0, 5.0]])).sum().backward()
    assert torch.equal(value.grad, torch.tensor([3.0, 5.0]))


def test_setitem_into_a_leaf_that_requires_grad_is_refused():
    leaf = tt.tracer(torch.randn(3), requires_grad=True)
    with pytest.raises(RuntimeError, match="in-place"):
        leaf[0] = 1.0
    with tt.no_grad():
        leaf[0] = 1.0  # allowed without recording, as in torch
    assert leaf[0].item() == 1.0 and leaf.is_leaf


def test_setitem_keeps_earlier_reads_correct():
    def fn(x):
        y = x * 1
        first = y[0] + 3  # read before the write (y[0] * 3 would save the view, which the write changes)
        y[0] = x[1]
        return first + y[0] * y[2]

    check_op(fn, torch.randn(3, 2, dtype=torch.float64))


def test_out_of_place_setitem_leaves_its_input_alone():
    x = torch.zeros(3)
    y = setitem(x, ints(0, 2), torch.tensor(1.0))
    assert torch.equal(x, torch.zeros(3)) and torch.equal(y, torch.tensor([1.0, 0.0, 1.0]))


# gather, scatter and the index_* family, masks, take.

CASES = {
    "torch.gather": (lambda x: torch.gather(x, 1, ints(0, 3, 3, 1, 2, 2).reshape(3, 2)), (3, 4)),
    "Tensor.gather negative dim": (lambda x: x.gather(-1, ints(0, 0, 1, 1).reshape(2, 2)), (3, 4)),
    "tracer.Gather alias shape": (lambda x: x.gather(1, ints(3, 0, 0).reshape(-1, 1)), (3, 4)),
    "torch.scatter src": (lambda x, s: torch.scatter(x, 1, ints(2, 0, 3, 1).reshape(2, 2), s), (3, 4), (2, 2)),
    "Tensor.scatter src keyword": (lambda x, s: x.scatter(0, ints(2, 0, 1).reshape(1, 3), src=s), (3, 4), (1, 3)),
    "Tensor.scatter number": (lambda x: x.scatter(1, ints(0, 2).reshape(1, 2), 1.5), (3, 4)),
    "Tensor.scatter value keyword": (lambda x: x.scatter(0, ints(2, 1).reshape(1, 2), value=-1.0), (3, 4)),
    "torch.scatter_add repeats": (lambda x, s: torch.scatter_add(x, 1, ints(1, 1, 0, 1, 1, 1).reshape(2, 3), s),
                                  (3, 4), (2, 3)),
    "Tensor.scatter_add": (lambda x, s: x.scatter_add(0, ints(2, 2, 0, 0).reshape(1, 4), s), (3, 4), (1, 4)),
    "Tensor.scatter_add 0-d src": (lambda x, s: x.scatter_add(0, ints(1), s), (3,), ()),
    "torch.scatter 0-d src": (lambda x, s: torch.scatter(x, 0, ints(2), s), (3,), ()),
    "Tensor.scatter_reduce 0-d src, empty index": (
        lambda x, s: x.scatter_reduce(0, torch.zeros(0, dtype=torch.long), s, "sum"), (3,), ()),
    "Tensor.scatter_reduce prod 0-d src": (lambda x, s: x.scatter_reduce(-1, ints(1), s, "prod"), (3,), ()),
    "torch.scatter_reduce sum": (lambda x, s: torch.scatter_reduce(x, 1, ints(3, 3, 1).reshape(1, 3), s, "sum"),
                                 (3, 4), (1, 3)),
    "Tensor.scatter_reduce without self": (
        lambda x, s: x.scatter_reduce(1, ints(3, 3, 1).reshape(1, 3), s, "sum", include_self=False), (3, 4), (1, 3)),
    "Tensor.scatter_reduce prod": (lambda x, s: x.scatter_reduce(1, ints(3, 3, 1).reshape(1, 3), s, "prod"),
                                   (3, 4), (1, 3)),
    "torch.scatter_reduce prod without self": (
        lambda x, s: torch.scatter_reduce(x, 0, ints(2, 2, 0, 2).reshape(2, 2), s, "prod", include_self=False),
        (3, 4), (2, 2)),
    "Tensor.scatter_reduce mean": (lambda x, s: x.scatter_reduce(-1, ints(0, 0, 2).reshape(1, 3), s, reduce="mean"),
                                   (3, 4), (1, 3)),
    "torch.scatter_reduce mean without self": (
        lambda x, s: torch.scatter_reduce(x, 1, ints(1, 1, 1).reshape(1, 3), s, "mean", include_self=False),
        (3, 4), (1, 3)),
    "Tensor.scatter_reduce amax": (lambda x, s: x.scatter_reduce(0, ints(1, 1, 0, 2).reshape(2, 2), s, "amax"),
                                   (3, 4), (2, 2)),
    "torch.scatter_reduce amin without self": (
        lambda x, s: torch.scatter_reduce(x, 1, ints(3, 3, 0).reshape(1, 3), s, "amin", include_self=False),
        (3, 4), (1, 3)),
    "torch.index_copy": (lambda x, s: torch.index_copy(x, 1, ints(3, 0), s), (3, 4), (3, 2)),
    "Tensor.index_copy 1-D": (lambda x, s: x.index_copy(0, ints(1, 3), s), (4,), (2,)),
    "torch.index_fill number": (lambda x: torch.index_fill(x, 1, ints(2, 0, 2), -1.0), (3, 4)),
    "Tensor.index_fill 0-d tensor, repeated index": (lambda x, v: x.index_fill(0, ints(2, 2, 0), v * 3), (3, 4), ()),
    "Tensor.index_fill 0-d x": (lambda x, v: x.index_fill(0, ints(0), v), (), ()),
    "torch.index_reduce prod": (lambda x, s: torch.index_reduce(x, 0, ints(0, 2, 0), s, "prod"), (3, 2), (3, 2)),
    "Tensor.index_reduce mean without self": (
        lambda x, s: x.index_reduce(1, ints(1, 1, 3), s, "mean", include_self=False), (2, 4), (2, 3)),
    "Tensor.index_reduce amax": (lambda x, s: x.index_reduce(0, ints(1, 1), s, reduce="amax"), (3, 2), (2, 2)),
    "torch.index_reduce amin without self": (
        lambda x, s: torch.index_reduce(x, -1, ints(0, 0), s, "amin", include_self=False), (2, 3), (2, 2)),
    "torch.masked_scatter": (lambda x, s: torch.masked_scatter(x, ints(1, 0, 0, 1).bool(), s), (3, 4), (7, 2)),
    "Tensor.masked_scatter broadcast x": (lambda x, s: x.masked_scatter(torch.tensor([[True], [False]]), s),
                                          (3,), (2, 3)),
    "torch.put": (lambda x, s: torch.put(x, ints(1, 11), s), (3, 4), (2,)),
    "Tensor.put accumulate repeated": (lambda x, s: x.put(ints(1, -1, 1).reshape(3, 1), s, accumulate=True),
                                       (3, 4), (3, 1)),
    "torch.fill number": (lambda x: torch.fill(x, 2.0) * x, (3, 4)),
    "torch.fill 0-d tensor": (lambda x, v: torch.fill(x, v), (3, 4), ()),
    "torch.index_select": (lambda x: torch.index_select(x, 1, ints(3, 0, 3)), (3, 4)),
    "Tensor.index_select 0-d index": (lambda x: x.index_select(0, torch.tensor(2)), (3, 4)),
    "torch.index_add": (lambda x, s: torch.index_add(x, 0, ints(2, 2), s), (3, 4), (2, 4)),
    "Tensor.index_add alpha": (lambda x, s: x.index_add(1, ints(0, 3, 0), s, alpha=-2.0), (3, 4), (3, 3)),
    "torch.index_put": (lambda x, v: torch.index_put(x, (ints(0, 2), ints(1, 1)), v), (3, 4), (2,)),
    "Tensor.index_put accumulate": (lambda x, v: x.index_put((ints(1, 1, 0),), v, accumulate=True), (3, 4), (4,)),
    "Tensor.index_put 0-d value": (lambda x, v: x.index_put([ints(0, 2)], v), (3, 4), ()),
    "Tensor.index_put boolean": (lambda x, v: x.index_put((torch.tensor([True, False, True]),), v), (3, 4), (2, 4)),
    "torch.masked_fill number": (lambda x: torch.masked_fill(x, x > 0, 0.5), (3, 4)),
    "Tensor.masked_fill 0-d tensor": (lambda x, v: x.masked_fill(torch.tensor([True, False, False, True]), v),
                                      (3, 4), ()),
    "Tensor.masked_fill broadcast mask": (lambda x, v: x.masked_fill(torch.tensor([[True], [False], [True]]), v * 2),
                                          (3, 4), ()),
    "torch.masked_select": (lambda x: torch.masked_select(x, x > 0), (3, 4)),
    "Tensor.masked_select broadcast": (lambda x: x.masked_select(torch.tensor([True, False, True, True])), (3, 4)),
    "Tensor.masked_select broadcast x": (lambda x: x.masked_select(torch.tensor([[True], [False]])), (4,)),
    "torch.take_along_dim": (lambda x: torch.take_along_dim(x, ints(1, 1, 0).reshape(3, 1), 1), (3, 4)),
    "Tensor.take_along_dim broadcast": (lambda x: x.take_along_dim(ints(3, 0).reshape(1, 2), dim=-1), (3, 4)),
    "Tensor.take_along_dim flat": (lambda x: x.take_along_dim(ints(5, 5, 0)), (3, 4)),
    "torch.take": (lambda x: torch.take(x, ints(1, 1, 11, 0).reshape(2, 2)), (3, 4)),
    "Tensor.take": (lambda x: x.take(ints(-1, 3)), (3, 4)),
    "0-d: masked_fill": (lambda x: x.masked_fill(torch.tensor(True), 3.0) + x, ()),
    "0-d: gather": (lambda x: x.gather(0, torch.tensor(0)), ()),
    "0-d: take": (lambda x: x.take(ints(0, 0)), ()),
    "used twice: gather and index_select": (lambda x: x.gather(0, ints(1, 0, 2, 2).reshape(1, 4))
                                            * x.index_select(0, ints(1)), (3, 4)),
    "used twice: scatter onto itself": (lambda x: x.scatter(1, ints(0, 1, 2).reshape(3, 1), x[:, 3:]), (3, 4)),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", list(CASES))
def test_rule_matches_torch(name, dtype):
    fn, *shapes = CASES[name]
    check_op(fn, *[torch.randn(s, dtype=dtype) for s in shapes], **float_tolerances(dtype))


# torch's own take_along_dim(dim=None) refuses non-contiguous input
@pytest.mark.parametrize("name", [n for n in CASES if len(CASES[n][1]) == 2 and n != "Tensor.take_along_dim flat"])
def test_rule_on_non_contiguous_input(name):
    fn, *shapes = CASES[name]
    x = torch.randn(tuple(reversed(shapes[0])), dtype=torch.float64).t()
    assert not x.is_contiguous()
    check_op(fn, x, *[torch.randn(s, dtype=torch.float64) for s in shapes[1:]])


@pytest.mark.parametrize("inplace", [
    lambda y, v: y.masked_fill_(y > 0, v),
    lambda y, v: y.index_put_((ints(0, 2),), v),
    lambda y, v: y.index_add_(0, ints(1, 1), v.expand(2, 4)),
    lambda y, v: y.scatter_(0, ints(2, 0, 1, 1).reshape(1, 4), v.expand(1, 4)),
    lambda y, v: y.scatter_add_(0, ints(2, 2, 1, 1).reshape(1, 4), v.expand(1, 4)),
    lambda y, v: y.scatter_reduce_(0, ints(2, 2, 1, 1).reshape(1, 4), v.expand(1, 4), "prod"),
    lambda y, v: y.index_copy_(1, ints(3), v.expand(3, 1)),
    lambda y, v: y.index_fill_(1, ints(3, 0), v),
    lambda y, v: y.index_reduce_(0, ints(1), v.expand(1, 4), "amax", include_self=False),
    lambda y, v: y.masked_scatter_(y > 0, v.expand(12)),
    lambda y, v: y.put_(ints(5, 6), v.expand(2)),
    lambda y, v: y.fill_(v),
    lambda y, v: torch.fill_(y, 2.0),
    lambda y, v: y.zero_(),
    lambda y, v: torch.zero_(y),
    lambda y, v: y.fill_diagonal_(-1.0),
], ids=["masked_fill_", "index_put_", "index_add_", "scatter_", "scatter_add_", "scatter_reduce_", "index_copy_",
        "index_fill_", "index_reduce_", "masked_scatter_", "put_", "fill_", "torch.fill_", "zero_", "torch.zero_",
        "fill_diagonal_"])
def test_in_place_forms_are_recorded(inplace):
    def fn(x, v):
        y = x * 1
        inplace(y, v)
        return y * x

    check_op(fn, torch.randn(3, 4, dtype=torch.float64), torch.randn((), dtype=torch.float64))


def test_scatter_src_larger_than_index_gets_zeros_where_unread():
    x = tt.zeros(2, 3)
    src = tt.tracer(torch.arange(8.0).reshape(2, 4), requires_grad=True)
    y = x.scatter(1, ints(2, 0).reshape(2, 1), src)
    assert torch.equal(y.as_subclass(T), torch.tensor([[0.0, 0.0, 0.0], [4.0, 0.0, 0.0]]))
    (y * tt.tracer(torch.arange(1.0, 7.0).reshape(2, 3))).sum().backward()
    assert torch.equal(src.grad, torch.tensor([[3.0, 0.0, 0.0, 0.0], [4.0, 0.0, 0.0, 0.0]]))


@pytest.mark.parametrize("call, message", [
    (lambda x: x.scatter(0, ints(0).reshape(1, 1), x[:1, :1], reduce="multiply"),
     "torch.scatter: reduce='multiply' has no gradient .* — use torch.scatter_reduce\\(..., reduce='prod'\\)"),
    (lambda x: x.scatter(0, ints(0).reshape(1, 1), 2.0, reduce="add"),
     "torch.scatter: reduce='add' has no gradient .* — use torch.scatter_reduce\\(..., reduce='sum'\\)"),
])
def test_unsupported_reductions_are_refused(call, message):
    x = tt.tracer(torch.randn(2, 2), requires_grad=True)
    with pytest.raises(tt.UnsupportedOperationError, match=message):
        call(x)


def ties(*shape):
    """Small integers: many equal values and zeros."""
    return torch.randint(-2, 3, shape).double()


SLOT_REDUCTIONS = [(reduce, include_self) for reduce in ["sum", "prod", "mean", "amax", "amin"]
                   for include_self in [True, False]]


@pytest.mark.parametrize("reduce, include_self", SLOT_REDUCTIONS)
def test_scatter_reduce_with_ties_and_zeros_matches_torch(reduce, include_self):
    index = ints(0, 1, 0, 2, 2, 2).reshape(2, 3)
    for _ in range(5):
        x, src = ties(2, 4), ties(2, 3)
        if reduce in ("amax", "amin") and not include_self:
            x += 10  # no excluded x equal to a result: torch mishandles that case (see the test below)
        check_op(lambda x, s: x.scatter_reduce(1, index, s, reduce, include_self=include_self), x, src,
                 gradcheck=reduce in ("sum", "prod", "mean"))  # ties of a max have no finite difference


@pytest.mark.parametrize("reduce, include_self", [r for r in SLOT_REDUCTIONS if r[0] != "sum"])
def test_index_reduce_with_ties_and_zeros_matches_torch(reduce, include_self):
    index = ints(0, 2, 0)
    for _ in range(5):
        x, source = ties(3, 2), ties(3, 2)
        if reduce in ("amax", "amin") and not include_self:
            x += 10
        check_op(lambda x, s: torch.index_reduce(x, 0, index, s, reduce, include_self=include_self), x, source,
                 gradcheck=reduce in ("prod", "mean"))


@pytest.mark.parametrize("op", [
    lambda x, s: x.scatter_reduce(1, ints(0, 0, 1).reshape(1, 3), s, "amax", include_self=False),
    lambda x, s: x.index_reduce(1, ints(0, 0, 1), s, "amax", include_self=False),
], ids=["scatter_reduce", "index_reduce"])
def test_a_max_without_self_ignores_an_equal_self_value(op):
    """y_0 = max(src_0, src_1) = 2 moves one-for-one with src_0, whatever x_0 holds (x_0 is not included).

    torch 2.13 counts x_0 = 2 as a tie there and gives src_0 only half the gradient; finite differences
    agree with torchtrace's full gradient.
    """
    x = torch.tensor([[2.0, 5.0, 0.0]], dtype=torch.float64)
    src = torch.tensor([[2.0, 1.0, 3.0]], dtype=torch.float64)
    ours = tt.tracer(src, requires_grad=True)
    (op(tt.tracer(x), ours) * torch.tensor([1.0, 10.0, 100.0], dtype=torch.float64)).sum().backward()
    assert torch.equal(ours.grad, torch.tensor([[1.0, 0.0, 10.0]], dtype=torch.float64))
    assert tt.gradcheck(op, x, src)


def test_scatter_reduce_src_larger_than_index_gets_zeros_where_unread():
    index = ints(1, 0, 1).reshape(1, 3)
    for reduce in ["sum", "prod", "mean", "amax", "amin"]:
        x, src = torch.randn(2, 4, dtype=torch.float64), torch.randn(2, 5, dtype=torch.float64)
        assert tt.gradcheck(lambda x, s: x.scatter_reduce(1, index, s, reduce), x, src)  # torch's backward refuses


def prod_into_slots(x, src):
    return x.scatter_reduce(1, ints(0, 0, 1).reshape(1, 3), src, "prod") ** 2


def test_prod_second_derivative_with_one_zero_in_a_slot_matches_torch():
    x = torch.tensor([[1.5, 0.0, 2.0]], dtype=torch.float64)
    double_backward_matches(prod_into_slots, x, torch.tensor([[0.0, 3.0, 0.5]], dtype=torch.float64))
    double_backward_matches(lambda x, s: x.index_reduce(0, ints(0, 0), s, "prod") ** 2,
                            torch.tensor([[0.0, 2.0], [1.0, 3.0]], dtype=torch.float64),
                            torch.tensor([[2.0, 0.0], [-1.0, 0.5]], dtype=torch.float64))


def test_prod_with_two_zeros_in_a_slot_first_derivative_only():
    x, src = torch.tensor([[1.5, 0.0, 2.0]], dtype=torch.float64), torch.tensor([[0.0, 0.0, 0.5]], dtype=torch.float64)
    check_op(prod_into_slots, x, src)
    ours = [tt.tracer(x, requires_grad=True), tt.tracer(src, requires_grad=True)]
    with pytest.raises(tt.UnsupportedOperationError, match="second derivative of reduce='prod' where two or more"):
        tt.grad(prod_into_slots(*ours).sum(), ours, create_graph=True)


def test_fill_sends_the_summed_gradient_to_a_0_d_value():
    x = tt.tracer(torch.randn(3, 4), requires_grad=True)
    v = tt.tracer(torch.tensor(1.5), requires_grad=True)
    y = x * 2
    y.fill_(v)
    (y * torch.arange(12.0).reshape(3, 4)).sum().backward()
    assert torch.equal(x.grad, torch.zeros(3, 4)) and v.grad.item() == 66.0


@pytest.mark.parametrize("wrap", [False, True])
def test_fill_diagonal_of_a_tall_matrix(wrap):
    def fn(x):
        y = x * 1
        y.fill_diagonal_(2.0, wrap=wrap)
        return y * x

    check_op(fn, torch.randn(7, 3, dtype=torch.float64))


def test_index_fill_with_negative_indices_counts_each_slice_once():
    """torch's own backward fails here ("index out of range"); -1 and 2 name the same slice of 3."""
    x, v = torch.randn(3, 2, dtype=torch.float64), torch.tensor(1.0, dtype=torch.float64)
    assert tt.gradcheck(lambda x, v: x.index_fill(0, ints(-1, 2, 0), v), x, v)
    value = tt.tracer(v, requires_grad=True)
    tt.tracer(x).index_fill(0, ints(-1, 2), value).sum().backward()
    assert value.grad.item() == 2.0


def test_fill_of_a_plain_tracer_with_a_value_that_requires_grad():
    v = tt.tracer(torch.tensor(2.0), requires_grad=True)
    y = tt.zeros(3)
    y.fill_(v)
    (y * torch.tensor([1.0, 2.0, 3.0])).sum().backward()
    assert y.grad_fn.name == "FillBackward" and v.grad.item() == 6.0


def test_fill_of_a_leaf_that_requires_grad_is_refused():
    x = tt.tracer(torch.randn(3), requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf tracer that requires grad is used in an in-place operation"):
        x.zero_()


def test_every_indexing_rule_is_exercised(dispatched):
    for fn, *shapes in CASES.values():
        fn(*[tt.tracer(torch.randn(s), requires_grad=True) for s in shapes])
    for fn in GETITEM.values():
        fn(tt.tracer(torch.randn(3, 4, 5), requires_grad=True))
    assert_every_rule_exercised(dispatched, "torchtrace.ops.indexing")
    assert INPLACE[T.__setitem__][1] is setitem


# ------------------------------------------------------------------ create_graph: second derivatives

def getitem_chain(x, w):
    rows = x[ints(0, 2, 2)]  # repeated index
    picked = rows[:, 1:] * w  # broadcasting mul
    return picked[picked > 0] ** 2 + x[..., None][1, 0] * picked.sum()


def setitem_chain(x, v):
    y = x * 1
    y[ints(1, 0)] = v * v
    y[:, 0] = 2.0
    return y ** 3


DOUBLE_BACKWARD = {
    "getitem: tensor index, slice, mask": (getitem_chain, (3, 4), (3,)),
    "setitem": (setitem_chain, (3, 4), (4,)),
    "gather, scatter_add": (lambda x, w: (x.gather(1, ints(0, 0, 3).reshape(3, 1)) * w).scatter_add(
        0, ints(1, 1, 0).reshape(3, 1), x[:, :1] * w) ** 2, (3, 4), (3, 1)),
    "scatter": (lambda x, w: x.scatter(1, ints(1, 2, 0).reshape(3, 1), w * w) ** 2, (3, 4), (3, 1)),
    "index_select, index_add": (lambda x, w: x.index_add(1, ints(0, 0), x.index_select(1, ints(3, 1)) * w) ** 2,
                                (3, 4), (3, 1)),
    "index_put": (lambda x, w: x.index_put((ints(2, 2),), w * w, accumulate=True) ** 2, (3, 4), (4,)),
    "masked_fill, masked_select": (lambda x, w: (x.masked_fill(x > 0, 1.0).masked_select(x < 0.5) ** 2).sum() * w
                                   + x.masked_fill(x < 0, w.sum()) ** 2, (3, 4), (4,)),
    "take_along_dim, take": (lambda x, w: torch.take_along_dim(x, ints(1, 0, 3).reshape(3, 1), 1) ** 2 * w
                             + torch.take(x, ints(0, 0, 5)) ** 3, (3, 4), (3, 1)),
    "scatter_reduce mean, amax": (lambda x, w: x.scatter_reduce(1, ints(0, 0, 2).reshape(1, 3), w * w, "mean") ** 2
                                  + x.scatter_reduce(1, ints(1, 1, 1).reshape(1, 3), w, "amax") ** 2, (3, 4), (1, 3)),
    "scatter_reduce prod": (lambda x, w: x.scatter_reduce(0, ints(2, 2, 0, 2).reshape(1, 4), w * x[:1], "prod") ** 2,
                            (3, 4), (1, 4)),
    "index_reduce prod, amin": (lambda x, w: x.index_reduce(0, ints(1, 1), w * w, "prod") ** 2
                                + x.index_reduce(1, ints(0, 0, 3, 3), x.flip(0) * w[:1], "amin") ** 2,
                                (3, 4), (2, 4)),
    "index_copy, index_fill": (lambda x, w: x.index_copy(1, ints(3), w * w).index_fill(0, ints(0), w.sum()) ** 2,
                               (3, 4), (3, 1)),
    "masked_scatter, put": (lambda x, w: x.masked_scatter(x > 0, w.expand(3, 4) * x).put(ints(0, 2), w[:2, 0] ** 2)
                            ** 2, (3, 4), (3, 1)),
}


@pytest.mark.parametrize("name", list(DOUBLE_BACKWARD))
def test_double_backward_matches_torch(name):
    fn, *shapes = DOUBLE_BACKWARD[name]
    double_backward_matches(fn, *[torch.randn(s, dtype=torch.float64) for s in shapes])


def test_take_along_dim_with_negative_indices_wraps_them_as_torch():
    index = torch.tensor([[-1, 0, 2, -3, 4]] * 5)
    check_op(lambda x: torch.take_along_dim(x, index, 1), torch.randn(5, 5, dtype=torch.float64))
