"""Gradient rules of torchtrace/ops/shape.py: views, permutations, expand/repeat, cat/stack/split, casts, copies."""
import copy
import warnings

import pytest
import torch
from helpers import (
    assert_every_rule_exercised,
    check_case,
    check_case_double_backward,
    check_op,
    non_contiguous,
    rand,
)

import torchtrace as tt

T = torch.Tensor
DTYPES = [torch.float64, torch.float32]


# One line per case: (fn, shapes of its inputs). Each registered callable appears at least once
# (test_every_shape_rule_is_exercised checks that).
CASES = {
    # same elements, new shape
    "Tensor.view varargs": (lambda x: x.view(6, 4) * 2, [(2, 3, 4)]),
    "Tensor.view tuple -1": (lambda x: x.view((4, -1)), [(2, 3, 4)]),
    "Tensor.view 0-d": (lambda x: x.view(1, 1), [()]),
    "Tensor.view_as": (lambda x, y: x.view_as(y) * y, [(2, 3, 4), (6, 4)]),
    "torch.reshape": (lambda x: torch.reshape(x, (3, -1)), [(2, 3, 4)]),
    "Tensor.reshape varargs": (lambda x: x.reshape(4, 6), [(2, 3, 4)]),
    "Tensor.reshape 0-d": (lambda x: x.reshape(()) * x, [(1,)]),
    "Tensor.reshape_as": (lambda x, y: x.reshape_as(y) + y, [(2, 3, 4), (4, 6)]),
    "torch.flatten": (lambda x: torch.flatten(x, 1), [(2, 3, 4)]),
    "Tensor.flatten 0-d": (lambda x: x.flatten(), [()]),
    "Tensor.flatten range": (lambda x: x.flatten(start_dim=0, end_dim=-2), [(2, 3, 4)]),
    "torch.ravel": (lambda x: torch.ravel(x), [(2, 3, 4)]),
    "Tensor.ravel": (lambda x: x.ravel(), [(3, 4)]),
    "torch.unflatten": (lambda x: torch.unflatten(x, -1, (2, 2)), [(2, 3, 4)]),
    "Tensor.unflatten": (lambda x: x.unflatten(0, (2, -1)), [(6, 2)]),
    "torch.squeeze": (lambda x: torch.squeeze(x), [(2, 1, 3, 1)]),
    "Tensor.squeeze dim": (lambda x: x.squeeze(-1), [(2, 1, 3, 1)]),
    "Tensor.squeeze tuple": (lambda x: x.squeeze((1, 3)), [(2, 1, 3, 1)]),
    "Tensor.squeeze 0-d": (lambda x: x.squeeze(), [()]),
    "torch.unsqueeze": (lambda x: torch.unsqueeze(x, 0), [(2, 3)]),
    "Tensor.unsqueeze -1": (lambda x: x.unsqueeze(-1), [(2, 3)]),
    "Tensor.unsqueeze 0-d": (lambda x: x.unsqueeze(0), [()]),
    # dims reordered
    "Tensor.permute varargs": (lambda x: x.permute(2, 0, 1), [(2, 3, 4)]),
    "Tensor.permute tuple": (lambda x: x.permute((1, -1, 0)), [(2, 3, 4)]),
    "torch.permute": (lambda x: torch.permute(x, (2, 1, 0)), [(2, 3, 4)]),
    "Tensor.permute 0-d": (lambda x: x.permute(()), [()]),
    "Tensor.transpose": (lambda x: x.transpose(0, -1), [(2, 3, 4)]),
    "torch.transpose": (lambda x: torch.transpose(x, 1, 2), [(2, 3, 4)]),
    "Tensor.swapdims": (lambda x: x.swapdims(0, 1), [(2, 3, 4)]),
    "torch.swapdims": (lambda x: torch.swapdims(x, -1, 0), [(2, 3, 4)]),
    "Tensor.swapaxes": (lambda x: x.swapaxes(0, 2), [(2, 3, 4)]),
    "torch.swapaxes": (lambda x: torch.swapaxes(x, 1, -1), [(2, 3, 4)]),
    "Tensor.t": (lambda x: x.t(), [(2, 3)]),
    "torch.t 1-D": (lambda x: torch.t(x), [(3,)]),
    "Tensor.T 2-D": (lambda x: x.T, [(2, 3)]),
    "Tensor.T 0-d": (lambda x: x.T * x, [()]),
    "Tensor.mT": (lambda x: x.mT, [(2, 3, 4)]),
    "Tensor.movedim": (lambda x: x.movedim(0, -1), [(2, 3, 4)]),
    "torch.movedim tuple": (lambda x: torch.movedim(x, (0, 1), (2, 0)), [(2, 3, 4)]),
    "Tensor.moveaxis": (lambda x: x.moveaxis(-1, 0), [(2, 3, 4)]),
    "torch.moveaxis": (lambda x: torch.moveaxis(x, 1, 2), [(2, 3, 4)]),
    "Tensor.flip": (lambda x: x.flip(0, 2), [(2, 3, 4)]),
    "torch.flip": (lambda x: torch.flip(x, (-1,)), [(2, 3, 4)]),
    "Tensor.fliplr": (lambda x: x.fliplr(), [(2, 3, 4)]),
    "torch.fliplr": (lambda x: torch.fliplr(x), [(3, 4)]),
    "Tensor.flipud": (lambda x: x.flipud(), [(3, 4)]),
    "reversed(x)": (lambda x: torch.stack(list(reversed(x))), [(3, 4)]),
    "reversed(x), 0-d": (lambda x: reversed(x) * 2, [()]),
    "torch.flipud": (lambda x: torch.flipud(x), [(3,)]),
    "Tensor.roll dims": (lambda x: x.roll((1, -1), (0, 2)), [(2, 3, 4)]),
    "Tensor.roll flat": (lambda x: x.roll(5), [(2, 3, 4)]),
    "torch.roll": (lambda x: torch.roll(x, -2, 1), [(2, 3, 4)]),
    "torch.roll keywords": (lambda x: torch.roll(x, shifts=(2, 7), dims=(-1, 0)), [(2, 3, 4)]),
    "Tensor.roll list shifts, larger than the dim": (lambda x: x.roll([-5], [1]), [(2, 3)]),
    "Tensor.roll empty": (lambda x: x.roll(1, 0) + 1, [(0, 3)]),
    "Tensor.roll 0-d": (lambda x: x.roll(1) * x, [()]),
    # copies of elements
    "Tensor.expand varargs": (lambda x: x.expand(2, 5, 4), [(2, 1, 4)]),
    "Tensor.expand tuple -1 new dim": (lambda x: x.expand((3, -1, -1)), [(1, 4)]),
    "Tensor.expand 0-d": (lambda x: x.expand(3, 2), [()]),
    "Tensor.expand_as": (lambda x, y: x.expand_as(y) * y, [(3, 1), (2, 3, 4)]),
    "Tensor.broadcast_to": (lambda x: x.broadcast_to(2, 3, 4), [(3, 1)]),
    "torch.broadcast_to": (lambda x: torch.broadcast_to(x, (3, 4)), [(4,)]),
    "Tensor.repeat": (lambda x: x.repeat(2, 1, 3), [(2, 3)]),
    "Tensor.repeat tuple": (lambda x: x.repeat((2, 2)), [(2, 3)]),
    "Tensor.repeat 0-d": (lambda x: x.repeat(3), [()]),
    "Tensor.tile": (lambda x: x.tile((2,)), [(2, 3)]),
    "torch.tile": (lambda x: torch.tile(x, (3, 1, 2)), [(2, 3)]),
    "Tensor.sum_to_size": (lambda x: x.sum_to_size(3, 1), [(2, 3, 4)]),
    "Tensor.sum_to_size tuple": (lambda x: x.sum_to_size((1, 4)), [(2, 3, 4)]),
    # copies and conversions
    "Tensor.contiguous": (lambda x: x.transpose(0, 1).contiguous(), [(2, 3, 4)]),
    "Tensor.contiguous already": (lambda x: x.contiguous() * x, [(3, 4)]),
    "Tensor.clone": (lambda x: x.clone() * x, [(3, 4)]),
    "torch.clone memory_format": (lambda x: torch.clone(x, memory_format=torch.contiguous_format), [(2, 3, 4)]),
    "Tensor.to same dtype": (lambda x: x.to(x.dtype) * x, [(3, 4)]),
    "Tensor.to device": (lambda x: x.to("cpu") * 2, [(3, 4)]),
    "Tensor.cpu": (lambda x: x.cpu() * 2, [(3, 4)]),
    # part of x, and writing a part
    "Tensor.select": (lambda x: x.select(1, -1), [(2, 3, 4)]),
    "torch.select": (lambda x: torch.select(x, 0, 1), [(2, 3, 4)]),
    "Tensor.narrow": (lambda x: x.narrow(2, 1, 2), [(2, 3, 4)]),
    "torch.narrow negative start": (lambda x: torch.narrow(x, -1, -3, 2), [(2, 3, 4)]),
    "Tensor.narrow 0-d tensor start": (lambda x: x.narrow(1, torch.tensor(1), 2), [(2, 3, 4)]),
    "torch.narrow keywords, empty": (lambda x: torch.narrow(x, dim=0, start=2, length=0) + 1, [(2, 3)]),
    "Tensor.diagonal": (lambda x: x.diagonal(), [(3, 4)]),
    "torch.diagonal offset dims": (lambda x: torch.diagonal(x, 1, 1, 2), [(2, 3, 4)]),
    "Tensor.unfold overlapping": (lambda x: x.unfold(1, 3, 2), [(2, 7)]),
    "Tensor.unfold last dim": (lambda x: x.unfold(-1, 2, 1), [(2, 3, 4)]),
    "torch.select_scatter": (lambda x, s: torch.select_scatter(x, s, 1, 0), [(2, 3, 4), (2, 4)]),
    "Tensor.select_scatter": (lambda x, s: x.select_scatter(s * s, -1, 2), [(2, 3, 4), (2, 3)]),
    "torch.slice_scatter step": (lambda x, s: torch.slice_scatter(x, s, 2, 0, None, 2), [(2, 3, 4), (2, 3, 2)]),
    "Tensor.slice_scatter": (lambda x, s: x.slice_scatter(s, start=1), [(3, 4), (2, 4)]),
    "torch.diagonal_scatter": (lambda x, s: torch.diagonal_scatter(x, s), [(3, 4), (3,)]),
    "Tensor.diagonal_scatter": (lambda x, s: x.diagonal_scatter(s, 1, 1, 2), [(2, 3, 4), (2, 3)]),
    # joining
    "torch.cat": (lambda x, y: torch.cat([x, y], 0), [(2, 3), (4, 3)]),
    "torch.cat tuple, negative dim": (lambda x, y: torch.cat((x, y, x), -1), [(2, 3), (2, 1)]),
    "torch.concat": (lambda x, y: torch.concat([x, y], dim=1), [(2, 3), (2, 2)]),
    "torch.concatenate axis": (lambda x, y: torch.concatenate([x, y], axis=0), [(2, 3), (1, 3)]),
    "torch.cat 0-d pieces via stack": (lambda x, y: torch.cat([torch.stack([x, y]), x.reshape(1)]), [(), ()]),
    "torch.stack": (lambda x, y: torch.stack([x, y]), [(2, 3), (2, 3)]),
    "torch.stack negative dim": (lambda x, y: torch.stack((x, y, x), -1), [(2, 3), (2, 3)]),
    "torch.hstack 1-D": (lambda x, y: torch.hstack([x, y]), [(3,), (2,)]),
    "torch.hstack 2-D": (lambda x, y: torch.hstack((x, y)), [(2, 3), (2, 1)]),
    "torch.vstack": (lambda x, y: torch.vstack([x, y, x]), [(3,), (2, 3)]),
    "torch.row_stack": (lambda x, y: torch.row_stack([x, y]), [(3,), (2, 3)]),
    "torch.dstack": (lambda x, y: torch.dstack([x, y]), [(2, 3), (2, 3)]),
    "torch.column_stack": (lambda x, y: torch.column_stack([x, y]), [(3,), (3, 2)]),
    # cutting (outputs are tuples; some pieces unused)
    "Tensor.split int": (lambda x: x.split(2, -1), [(2, 3, 5)]),
    "torch.split list": (lambda x: torch.split(x, [1, 2], 1), [(2, 3, 4)]),
    "Tensor.split one piece used": (lambda x: x.split(1)[1] * 3, [(3, 4)]),
    "Tensor.split_with_sizes": (lambda x: x.split_with_sizes([3, 1], 0), [(4, 2)]),
    "torch.split_with_sizes": (lambda x: torch.split_with_sizes(x, [1, 1, 2], -1), [(2, 4)]),
    "Tensor.chunk": (lambda x: x.chunk(3, 2), [(2, 3, 4)]),
    "torch.chunk": (lambda x: torch.chunk(x, 2), [(5, 2)]),
    "Tensor.tensor_split": (lambda x: x.tensor_split([1, 3], 2), [(2, 3, 4)]),
    "torch.tensor_split sections": (lambda x: torch.tensor_split(x, 3), [(7,)]),
    "Tensor.hsplit": (lambda x: x.hsplit(2), [(3, 4)]),
    "torch.hsplit": (lambda x: torch.hsplit(x, [1]), [(2, 3, 4)]),
    "Tensor.vsplit": (lambda x: x.vsplit([1, 2]), [(3, 4)]),
    "torch.vsplit": (lambda x: torch.vsplit(x, 2), [(4, 2)]),
    "Tensor.dsplit": (lambda x: x.dsplit(2), [(2, 3, 4)]),
    "torch.dsplit": (lambda x: torch.dsplit(x, [3]), [(1, 2, 4)]),
    "Tensor.unsafe_split": (lambda x: x.unsafe_split(2, -1), [(2, 3, 5)]),
    "torch.unsafe_split": (lambda x: torch.unsafe_split(x, 1), [(3, 2)]),
    "Tensor.unsafe_split_with_sizes": (lambda x: x.unsafe_split_with_sizes([2, 1], 1), [(2, 3)]),
    "torch.unsafe_split_with_sizes": (lambda x: torch.unsafe_split_with_sizes(x, [0, 3, 1]), [(4, 2)]),
    "Tensor.unsafe_chunk": (lambda x: x.unsafe_chunk(2, 1), [(2, 3, 4)]),
    "torch.unsafe_chunk": (lambda x: torch.unsafe_chunk(x, 3), [(5, 2)]),
    "Tensor.unbind": (lambda x: x.unbind(1), [(2, 3, 4)]),
    "torch.unbind negative dim": (lambda x: torch.unbind(x, -1), [(2, 3)]),
    "iteration (unbind 0)": (lambda x: [r * i for i, r in enumerate(x)], [(3, 2)]),
    # the sizes given by name, as torch accepts them
    "Tensor.permute dims=": (lambda x: x.permute(dims=(2, 0, 1)), [(2, 3, 4)]),
    "torch.permute dims=": (lambda x: torch.permute(x, dims=(1, 0)), [(2, 3)]),
    "Tensor.repeat repeats=": (lambda x: x.repeat(repeats=(2, 1, 3)), [(3, 2)]),
    "torch.tile dims=": (lambda x: torch.tile(x, dims=(2, 1)), [(3, 2)]),
    "torch.movedim source= destination=": (lambda x: torch.movedim(x, source=0, destination=2), [(2, 3, 4)]),
    # an input used twice in one expression
    "used twice: cat": (lambda x: torch.cat([x, x * 2, x], 1), [(2, 3)]),
    "used twice: permute and transpose": (lambda x: x.permute(1, 0) * x.transpose(0, 1), [(2, 3)]),
    "used twice: expand and repeat": (lambda x: x.expand(3, 2) + x.repeat(3, 1), [(1, 2)]),
}

NEEDS_CONTIGUOUS = {"Tensor.view varargs", "Tensor.view tuple -1", "Tensor.view_as"}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", list(CASES))
def test_rule_matches_torch(name, dtype):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # x.T on a 0-d tensor is deprecated in torch
        check_case(*CASES[name], dtype)


def reversed_layout(x):
    """Same values, memory order of the dims reversed (dense, so tt.check's copies keep the layout)."""
    dims = tuple(reversed(range(x.dim())))
    return x.permute(dims).contiguous().permute(dims)


def has_two_long_dims(shape):
    return sum(n > 1 for n in shape) >= 2


@pytest.mark.parametrize("name", [n for n in CASES if n not in NEEDS_CONTIGUOUS and has_two_long_dims(CASES[n][1][0])])
def test_rule_on_non_contiguous_input(name):
    fn, shapes = CASES[name]
    inputs = [reversed_layout(x) for x in rand(shapes, torch.float64)]
    assert not inputs[0].is_contiguous()
    check_op(fn, *inputs)


def test_rule_on_a_strided_view_made_inside_the_function():
    check_op(lambda x: torch.cat([non_contiguous(x).permute(1, 0), x[:, ::2].t()], 0).flatten(), torch.randn(3, 4))


CASTS = {
    "Tensor.to dtype": lambda x: x.to(torch.float32),
    "Tensor.to dtype keyword": lambda x: x.to(dtype=torch.float16) * 2,
    "Tensor.to other tensor": lambda x: x.to(torch.zeros(1, dtype=torch.float32)),
    "Tensor.to device and dtype": lambda x: x.to("cpu", torch.float32),
    "Tensor.type_as": lambda x: x.type_as(torch.zeros(1, dtype=torch.float32)),
    "Tensor.float": lambda x: x.float() * x,
    "Tensor.double": lambda x: x.float().double(),
    "Tensor.half": lambda x: x.half(),
    "Tensor.bfloat16": lambda x: x.bfloat16(),
    "Tensor.type dtype": lambda x: x.type(torch.float32),
    "Tensor.type dtype keyword": lambda x: x.type(dtype=torch.float16) * x,
    "Tensor.type string": lambda x: x.type("torch.FloatTensor"),
    "Tensor.type tensor class": lambda x: x.type(torch.DoubleTensor) * 3,
    "Tensor.to dtype copy": lambda x: x.to(torch.float64, copy=True),
}


@pytest.mark.parametrize("name", list(CASTS))
def test_casts_send_the_gradient_back_in_the_input_dtype(name):
    x = torch.randn(3, 4, dtype=torch.float64)
    check_op(CASTS[name], x, rtol=1e-2, atol=1e-2, gradcheck=False)  # low-precision casts: no finite differences
    t = tt.tracer(x, requires_grad=True)
    CASTS[name](t).sum().backward()
    assert t.grad.dtype == torch.float64 and t.grad.shape == x.shape


@pytest.mark.parametrize("cast", [
    lambda x: x.to(torch.int64), lambda x: x.to(torch.zeros(1, dtype=torch.int32)), lambda x: x.to("cpu", torch.int16),
    lambda x: x.type(torch.int64), lambda x: x.type("torch.LongTensor"), lambda x: x.type(torch.IntTensor),
    lambda x: x.type_as(torch.zeros(1, dtype=torch.uint8)), lambda x: x.long(), lambda x: x.int(), lambda x: x.bool(),
])
def test_cast_to_an_integer_dtype_carries_no_gradient(cast):
    x = tt.tracer([[1.5, 2.5]], requires_grad=True)
    y = cast(x)
    assert not y.is_floating_point() and not y.requires_grad and y.grad_fn is None


def test_type_without_an_argument_returns_the_type_name():
    x = tt.tracer(torch.randn(2, dtype=torch.float64), requires_grad=True)
    assert x.type() == "torch.DoubleTensor" and (x * 2).type() == "torch.DoubleTensor"


def test_cat_of_mixed_dtypes_and_a_legacy_empty_tensor():
    def fn(a, b):
        return torch.cat([a, torch.empty(0), b, a], 1)

    a, b = torch.randn(2, 3, dtype=torch.float32), torch.randn(2, 2, dtype=torch.float64)
    check_op(fn, a, b, rtol=1e-4, atol=1e-5)
    x, y = tt.tracer(a, requires_grad=True), tt.tracer(b, requires_grad=True)
    fn(x, y).sum().backward()
    assert x.grad.dtype == torch.float32 and torch.equal(x.grad, torch.full((2, 3), 2.0))
    assert y.grad.dtype == torch.float64


def test_cat_gives_an_empty_one_dimensional_input_an_empty_gradient():
    empty = tt.tracer(torch.empty(0), requires_grad=True)
    x = tt.tracer(torch.randn(2, 3), requires_grad=True)
    torch.cat([x, empty]).sum().backward()
    assert empty.grad.shape == (0,) and torch.equal(x.grad, torch.ones(2, 3))


def test_ops_that_return_their_input_hand_back_the_same_tracer_as_torch():
    x = tt.tracer(torch.randn(3, 4), requires_grad=True)
    theirs = torch.randn(3, 4, requires_grad=True)
    for ours, plain in zip(
            (x.contiguous(), x.to(torch.float32), x.float(), x.cpu(), x.sum_to_size(3, 4), x.type_as(x)),
            (theirs.contiguous(), theirs.to(torch.float32), theirs.float(), theirs.cpu(), theirs.sum_to_size(3, 4),
             theirs.type_as(theirs))):
        assert (ours is x) == (plain is theirs) and x.is_leaf
        (ours * 2).sum().backward()
    assert torch.equal(x.grad, torch.full((3, 4), 12.0))


def test_a_hook_on_a_returned_input_is_a_hook_on_the_input():
    def program(x):
        y = x * 1
        z = y.contiguous()
        z.register_hook(lambda g: g * 3)
        return (y + z).sum()

    check_op(program, torch.rand(3), gradcheck=False)  # a hook is no function of the values: torch is the reference


def test_capitalised_view_alias_is_recorded_as_view():
    x = tt.tracer(torch.randn(2, 3, 4), requires_grad=True)
    y = x.View(3, -1)
    assert y.shape == (3, 8) and y.grad_fn.name == "ViewBackward"
    weight = torch.randn(3, 8)
    (y * weight).sum().backward()
    assert torch.equal(x.grad, weight.reshape(2, 3, 4))


def test_view_with_a_dtype_is_refused_with_a_clear_error():
    x = tt.tracer(torch.randn(4), requires_grad=True)
    with pytest.raises(NotImplementedError, match="view\\(dtype\\)"):
        x.view(torch.int32)
    assert tt.tracer(torch.randn(4)).view(torch.int32).dtype == torch.int32  # fine when nothing needs a gradient


@pytest.mark.parametrize("op", [
    lambda y: y.unsqueeze_(0),
    lambda y: y.squeeze_(),
    lambda y: y.transpose_(0, 1),
    lambda y: y.t_(),
    lambda y: y.swapaxes_(0, 1),
], ids=["unsqueeze_", "squeeze_", "transpose_", "t_", "swapaxes_"])
def test_in_place_shape_methods_are_recorded(op):
    def fn(x):
        y = x * 1
        op(y)
        return y * y

    check_op(fn, torch.randn(3, 4, dtype=torch.float64))


def test_node_names_follow_the_rules():
    x = tt.tracer(torch.randn(2, 3), requires_grad=True)
    assert x.T.grad_fn.name == "TPropertyBackward"
    assert x.view(6).grad_fn.name == "ViewBackward"
    assert torch.cat([x, x]).grad_fn.name == "CatBackward"
    assert x.split(1)[0].grad_fn.name == "SplitBackward"


def test_every_shape_rule_is_exercised(dispatched):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        for fn in CASTS.values():
            fn(tt.tracer(torch.randn(2), requires_grad=True))
        # T.cuda needs a GPU: test_cuda_round_trip
        assert_every_rule_exercised(dispatched, "torchtrace.ops.shape", CASES, exempt={T.cuda})


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_round_trip():
    x = tt.tracer(torch.randn(3, 4), requires_grad=True)
    y = x.cuda() * 2
    assert y.is_cuda
    z = y.to("cpu", torch.float64) + x.to("cuda").cpu()
    z.sum().backward()
    assert x.grad.device.type == "cpu" and torch.allclose(x.grad, torch.full((3, 4), 3.0))


# ------------------------------------------------------------------ create_graph: second derivatives

def mixed_chain(x, w):
    """reshape, permute, expand, getitem with a tensor index, cat, and a broadcasting mul."""
    y = x.reshape(3, 4).permute(1, 0)  # (4, 3)
    picked = y[torch.tensor([0, 2, 2, 3])]  # repeated row: its gradient must accumulate
    joined = torch.cat([picked, y.expand(2, 4, 3)[1]], 0)  # (8, 3)
    return joined * joined * w  # w: (3,) broadcast over the rows -> sum_to_size under create_graph


DOUBLE_BACKWARD = {
    "reshape/permute/expand/getitem/cat/broadcast mul": (mixed_chain, [(2, 6), (3,)]),
    "broadcast mul then sum_to_size and .T": (lambda x, w: (x.sum_to_size(2, 1, 4) * w).mT.pow(2), [(2, 3, 4), (3, 1)]),
    "stack, split, unbind": (lambda x, w: torch.cat([p * p for p in torch.stack([x, x * w]).split(1, 2)]).sum(0)
                             * torch.stack(x.unbind(1), -1), [(2, 3), (3,)]),
    "repeat, flip, roll": (lambda x, w: (x.repeat(2, 1).flip(0).roll(1, 1) * w) ** 2, [(2, 3), (3,)]),
    "select, narrow, diagonal": (lambda x, w: x.select(0, 1) ** 2 * w + (x.narrow(1, 0, 2).diagonal() ** 3).sum(),
                                 [(3, 3), (3,)]),
    "unfold, movedim, squeeze": (lambda x, w: (x.unfold(1, 2, 1).movedim(-1, 0).unsqueeze(1).squeeze(1) * w) ** 2,
                                 [(2, 4), (3,)]),
}


@pytest.mark.parametrize("name", list(DOUBLE_BACKWARD))
def test_double_backward_matches_torch(name):
    check_case_double_backward(*DOUBLE_BACKWARD[name])


def test_create_graph_un_broadcasts_through_the_sum_to_size_rule():
    x = tt.tracer(torch.randn(4, 3, dtype=torch.float64), requires_grad=True)
    w = tt.tracer(torch.randn(3, dtype=torch.float64), requires_grad=True)
    _, grad_w = tt.grad((x * x * w).sum(), [x, w], create_graph=True)
    assert grad_w.shape == (3,) and grad_w.grad_fn.name == "SumToSizeBackward"
    (second,) = tt.grad(grad_w.sum(), [x])
    torch.testing.assert_close(second.as_subclass(torch.Tensor), 2 * x.detach().as_subclass(torch.Tensor))


@pytest.mark.parametrize("method", ["view_as", "reshape_as", "expand_as"])
def test_the_tensor_that_lends_its_shape_joins_no_graph(method):
    """x.view_as(other): other lends its shape only. When only other needs a gradient the result needs none (it
    had a grad_fn, so torch.nn.utils.prune's mask made with view_as pulled the weight's graph into every forward: the
    second backward raised), and a backward reaches x alone, as in torch."""
    x = torch.arange(6.0, dtype=torch.float64)[:3] if method == "expand_as" else torch.arange(6.0, dtype=torch.float64)
    other = torch.randn(2, 3, dtype=torch.float64)
    for make in (lambda t, g: t.clone().requires_grad_(g), lambda t, g: tt.as_tracer(t.clone(), requires_grad=g)):
        y = getattr(make(x, False), method)(make(other, True))
        assert not y.requires_grad and y.grad_fn is None
    theirs_x, theirs_other = x.clone().requires_grad_(), other.clone().requires_grad_()
    ours_x, ours_other = tt.as_tracer(x.clone(), requires_grad=True), tt.as_tracer(other.clone(), requires_grad=True)
    weights = torch.randn(2, 3, dtype=torch.float64)
    (getattr(theirs_x, method)(theirs_other) * weights).sum().backward()
    (getattr(ours_x, method)(ours_other) * weights).sum().backward()
    torch.testing.assert_close(ours_x.grad.as_subclass(torch.Tensor), theirs_x.grad)
    assert theirs_other.grad is None and ours_other.grad is None


def test_global_pruning_of_a_ported_model_trains_as_torchs():
    """prune.global_unstructured builds each mask with view_as(weight): two backward passes run, the masks need no
    gradient, and the weights' gradients equal torch autograd's on the pruned twin."""
    from torch.nn.utils import prune

    torch.manual_seed(0)
    twin = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.Linear(5, 3)).double()
    model = tt.port(copy.deepcopy(twin))
    x = torch.randn(2, 4, dtype=torch.float64)
    for m in (twin, model):
        prune.global_unstructured([(m[0], "weight"), (m[1], "weight")], pruning_method=prune.L1Unstructured,
                                  amount=0.3)
        for _ in range(2):
            m(x).sum().backward()
    assert not model[0].weight_mask.requires_grad
    for ours, theirs in zip((model[0].weight_orig, model[1].weight_orig), (twin[0].weight_orig, twin[1].weight_orig)):
        torch.testing.assert_close(ours.grad.as_subclass(torch.Tensor), theirs.grad)
