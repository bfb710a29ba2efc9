"""Gradient rules of torchtrace/ops/linalg.py: matmul and its special cases, einsum, tensordot, addmm family, trace."""
import math

import pytest
import torch
from helpers import check_op, double_backward_matches, float_tolerances
from linalg_cases import DTYPES, rand

import torchtrace as tt
from torchtrace.ops.linalg import Einsum, einsum_grads, parse

T = torch.Tensor


# ---------------------------------------------------------------------------------------------------- matmul

MATMUL_SHAPES = [
    ((3,), (3,)),  # 1-D @ 1-D -> 0-d
    ((3,), (3, 4)),  # 1-D @ 2-D
    ((2, 3), (3,)),  # 2-D @ 1-D
    ((2, 3), (3, 4)),  # 2-D @ 2-D
    ((5, 2, 3), (5, 3, 4)),  # batched @ batched
    ((2, 1, 3, 4), (5, 4, 2)),  # batch broadcasting
    ((1, 3, 4), (2, 1, 4, 2)),  # batch broadcasting the other way
    ((3, 4), (2, 4, 2)),  # 2-D @ batched
    ((2, 3, 4), (4,)),  # batched @ 1-D
    ((4,), (2, 4, 3)),  # 1-D @ batched
]

MATMUL_FORMS = {
    "operator @": lambda a, b: a @ b,
    "torch.matmul": torch.matmul,
    "Tensor.matmul": T.matmul,
    "Tensor.__matmul__": T.__matmul__,
    "torch.linalg.matmul": torch.linalg.matmul,
    "Tensor.__rmatmul__": lambda a, b: T.__rmatmul__(b, a),  # reflected: __rmatmul__(b, a) = a @ b
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shapes", MATMUL_SHAPES, ids=str)
def test_matmul_every_dimension_combination(shapes, dtype):
    a, b = (rand(*s, dtype=dtype) for s in shapes)
    check_op(lambda a, b: a @ b, a, b, **float_tolerances(dtype))


@pytest.mark.parametrize("shapes", [((2, 3), (3, 4)), ((3,), (2, 3, 4)), ((2, 1, 3, 4), (5, 4, 2))], ids=str)
@pytest.mark.parametrize("form", MATMUL_FORMS.values(), ids=MATMUL_FORMS.keys())
def test_matmul_every_alias(form, shapes):
    check_op(form, *(rand(*s) for s in shapes))


def test_rmatmul_is_reflected_and_named():
    a, b = tt.tracer(rand(2, 3), requires_grad=True), tt.tracer(rand(3, 4), requires_grad=True)
    out = T.__rmatmul__(b, a)
    torch.testing.assert_close(out.as_subclass(T), a.as_subclass(T) @ b.as_subclass(T))
    assert out.grad_fn.name == "RmatmulBackward"
    assert (a @ b).grad_fn.name == "MatmulBackward"


# ------------------------------------------------------------------------------- the other two-operand products

PRODUCTS = [
    ("mm", torch.mm, [(2, 3), (3, 4)]),
    ("Tensor.mm", T.mm, [(2, 3), (3, 4)]),
    ("bmm", torch.bmm, [(2, 2, 3), (2, 3, 4)]),
    ("Tensor.bmm", T.bmm, [(2, 2, 3), (2, 3, 4)]),
    ("mv", torch.mv, [(2, 3), (3,)]),
    ("Tensor.mv", T.mv, [(2, 3), (3,)]),
    ("dot", torch.dot, [(3,), (3,)]),
    ("Tensor.dot", T.dot, [(3,), (3,)]),
    ("vdot", torch.vdot, [(3,), (3,)]),
    ("Tensor.vdot", T.vdot, [(3,), (3,)]),
    ("outer", torch.outer, [(3,), (4,)]),
    ("Tensor.outer", T.outer, [(3,), (4,)]),
    ("ger", torch.ger, [(3,), (4,)]),
    ("Tensor.ger", T.ger, [(3,), (4,)]),
    ("inner 2-D", torch.inner, [(2, 3), (4, 3)]),
    ("inner 1-D", T.inner, [(3,), (3,)]),
    ("inner 3-D/1-D", torch.inner, [(2, 2, 3), (3,)]),
    ("inner 0-d left", torch.inner, [(), (2, 3)]),
    ("inner 0-d right", T.inner, [(2, 3), ()]),
    ("tensordot dims=2", lambda a, b: torch.tensordot(a, b, dims=2), [(3, 4, 5), (4, 5, 2)]),
    ("tensordot dims=1 positional", lambda a, b: torch.tensordot(a, b, 1), [(3, 4), (4, 2)]),
    ("tensordot dims=0", lambda a, b: torch.tensordot(a, b, dims=0), [(2, 3), (4,)]),
    ("tensordot default dims", torch.tensordot, [(2, 3, 4), (3, 4)]),
    ("tensordot pair of lists", lambda a, b: torch.tensordot(a, b, dims=([1, 0], [0, 1])), [(3, 4, 5), (4, 3, 2)]),
    ("tensordot negative dims", lambda a, b: torch.tensordot(a, b, dims=([-1], [0])), [(2, 3), (3, 4)]),
    ("tensordot tensor dims", lambda a, b: torch.tensordot(a, b, dims=torch.tensor(1)), [(2, 3), (3, 4)]),
    ("trace", torch.trace, [(3, 3)]),
    ("Tensor.trace non-square", T.trace, [(2, 3)]),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fn, shapes", [case[1:] for case in PRODUCTS], ids=[case[0] for case in PRODUCTS])
def test_product(fn, shapes, dtype):
    check_op(fn, *(rand(*s, dtype=dtype) for s in shapes), **float_tolerances(dtype))


# ------------------------------------------------------------------------ beta * input + alpha * product

SCALED = [
    ("addmm", torch.addmm, [(2, 4), (2, 3), (3, 4)]),
    ("Tensor.addmm", T.addmm, [(2, 4), (2, 3), (3, 4)]),
    ("addmm row input", torch.addmm, [(4,), (2, 3), (3, 4)]),
    ("addmm (1, n) input", torch.addmm, [(1, 4), (2, 3), (3, 4)]),
    ("addmm 0-d input", torch.addmm, [(), (2, 3), (3, 4)]),
    ("addmv", torch.addmv, [(2,), (2, 3), (3,)]),
    ("Tensor.addmv", T.addmv, [(2,), (2, 3), (3,)]),
    ("addr", torch.addr, [(3, 4), (3,), (4,)]),
    ("Tensor.addr", T.addr, [(1, 4), (3,), (4,)]),
    ("baddbmm", torch.baddbmm, [(2, 3, 4), (2, 3, 2), (2, 2, 4)]),
    ("Tensor.baddbmm broadcast input", T.baddbmm, [(3, 4), (2, 3, 2), (2, 2, 4)]),
    ("addbmm", torch.addbmm, [(3, 4), (2, 3, 2), (2, 2, 4)]),
    ("Tensor.addbmm", T.addbmm, [(3, 4), (2, 3, 2), (2, 2, 4)]),
]
SCALARS = [{}, {"beta": 0.5}, {"alpha": -2.0}, {"beta": 3, "alpha": 0.25}, {"alpha": 2, "beta": 0}]


@pytest.mark.parametrize("scalars", SCALARS, ids=str)
@pytest.mark.parametrize("fn, shapes", [case[1:] for case in SCALED], ids=[case[0] for case in SCALED])
def test_scaled_product(fn, shapes, scalars):
    check_op(lambda c, a, b: fn(c, a, b, **scalars), *(rand(*s) for s in shapes))


@pytest.mark.parametrize("fn, shapes", [
    (lambda c, a, b: (c * 1).addmm_(a, b, beta=0.5), [(2, 4), (2, 3), (3, 4)]),
    (lambda c, a, b: (c * 1).baddbmm_(a, b, alpha=2.0), [(2, 3, 4), (2, 3, 2), (2, 2, 4)]),
    (lambda c, a, b: (c * 1).addmv_(a, b), [(2,), (2, 3), (3,)]),
], ids=["addmm_", "baddbmm_", "addmv_"])
def test_scaled_product_in_place(fn, shapes):
    check_op(fn, *(rand(*s) for s in shapes))


@pytest.mark.parametrize("fn, shapes", [case[1:] for case in SCALED[::4]], ids=[case[0] for case in SCALED[::4]])
def test_scaled_product_float32(fn, shapes):
    inputs = [rand(*s, dtype=torch.float32) for s in shapes]
    check_op(lambda c, a, b: fn(c, a, b, beta=0.5, alpha=2.0), *inputs, **float_tolerances(torch.float32))


# ---------------------------------------------------------------------------------------------------- einsum

EINSUM = [
    ("ij,jk->ik", [(2, 3), (3, 4)]),
    ("bij,bjk->bik", [(2, 2, 3), (2, 3, 4)]),
    ("ij->", [(2, 3)]),
    ("i,j->ij", [(3,), (4,)]),
    ("...ij,...jk->...ik", [(2, 1, 2, 3), (4, 3, 2)]),
    ("ij,ij->i", [(2, 3), (2, 3)]),
    ("ij,jk", [(2, 3), (3, 4)]),  # implicit output
    ("ba", [(2, 3)]),  # implicit output: sorted labels, a transpose
    ("aB", [(2, 3)]),  # implicit output: uppercase sorts first
    ("ij->ji", [(2, 3)]),
    ("ii->i", [(3, 3)]),  # diagonal
    ("ii", [(3, 3)]),  # implicit trace
    ("iij->ji", [(3, 3, 2)]),
    ("iii->i", [(2, 2, 2)]),
    ("ii,ij->j", [(3, 3), (3, 2)]),
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 2)]),
    ("bn,anm,bm->ba", [(2, 3), (4, 3, 2), (2, 2)]),
    ("...ij->ij", [(2, 3, 4)]),  # ellipsis summed away
    ("...ij,...jk->ik", [(5, 3, 4), (1, 4, 2)]),  # summed ellipsis, one operand broadcast
    ("i...j->...", [(2, 3, 4, 5)]),  # ellipsis in the middle
    ("...ij,jk", [(2, 3), (3, 4)]),  # empty ellipsis, implicit output
    ("ij,jk->ik", [(3, 1), (4, 5)]),  # a size-1 labelled dimension broadcasts
    ("i,i->i", [(1,), (3,)]),
    (",i->i", [(), (3,)]),  # 0-d operand
    ("i,i->", [(3,), (3,)]),  # 0-d result
    (" i j , j k -> i k ", [(2, 3), (3, 4)]),  # spaces
    ("i,i,i->", [(3,), (1,), (3,)]),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("equation, shapes", EINSUM, ids=[case[0] for case in EINSUM])
def test_einsum(equation, shapes, dtype):
    inputs = [rand(*s, dtype=dtype) for s in shapes]
    check_op(lambda *xs: torch.einsum(equation, *xs), *inputs, **float_tolerances(dtype))


@pytest.mark.parametrize("fn", [
    lambda a, b: torch.einsum("ij,jk", [a, b]),
    lambda a, b: torch.einsum("ij,jk->ik", (a, b)),
    lambda a, b: torch.einsum(a, [0, 1], b, [1, 2], [0, 2]),  # sublist format
    lambda a, b: torch.einsum(a, [Ellipsis, 1], b, [1, 2]),  # sublist format with ellipsis, implicit output
    lambda a, b: Einsum.apply("ij,jk->ik", [a, b]),  # the rule applied directly to a list
], ids=["list", "tuple", "sublist", "sublist ellipsis", "Einsum.apply list"])
def test_einsum_operand_forms(fn):
    check_op(fn, rand(2, 3), rand(3, 4))


def test_parse_spells_out_ellipsis_and_implicit_output():
    inputs, output, unused = parse("...ij,...jk", (4, 3))
    assert inputs == ["ABij", "Bjk"] and output == "ABik"
    assert "A" not in unused and "i" not in unused
    assert parse("ba,Cb", (2, 2))[1] == "Ca"


@pytest.mark.parametrize("equation, shapes", [
    ("ij,jk->ik", [(3, 1), (4, 5)]),
    ("...ij,...jk->...ik", [(2, 1, 2, 3), (4, 3, 2)]),
    ("...ij,...jk->ij", [(5, 3, 4), (1, 4, 2)]),
    ("ii,i->", [(3, 3), (1,)]),
], ids=str)
def test_einsum_grads_come_back_in_each_operands_shape(equation, shapes):
    """Broadcast dimensions are summed inside the gradient einsum, not left to the engine's unbroadcasting."""
    operands = [rand(*s) for s in shapes]
    g = torch.einsum(equation, *operands)
    grads = einsum_grads(equation, torch.ones_like(g), operands, [True] * len(operands))
    assert [tuple(x.shape) for x in grads] == [tuple(s) for s in shapes]


# -------------------------------------------------------------- layouts, repeated inputs, constants

NON_CONTIGUOUS = [
    ("matmul", lambda a, b: a @ b, lambda: [rand(4, 3).t(), rand(5, 4).t()]),
    ("batched matmul", torch.matmul, lambda: [rand(2, 4, 3).transpose(1, 2), rand(2, 5, 4).transpose(1, 2)]),
    ("1-D @ transposed", torch.matmul, lambda: [rand(4), rand(5, 4).t()]),
    ("mm", torch.mm, lambda: [rand(4, 3).t(), rand(5, 4).t()]),
    ("bmm", torch.bmm, lambda: [rand(2, 4, 3).transpose(1, 2), rand(2, 4, 5)]),
    ("mv", torch.mv, lambda: [rand(4, 3).t(), rand(4)]),
    ("einsum", lambda a, b: torch.einsum("ij,jk->ik", a, b), lambda: [rand(4, 3).t(), rand(5, 4).t()]),
    ("tensordot", lambda a, b: torch.tensordot(a, b, dims=1), lambda: [rand(4, 3).t(), rand(5, 4).t()]),
    ("addmm", torch.addmm, lambda: [rand(5, 3).t(), rand(4, 3).t(), rand(5, 4).t()]),
    ("trace", torch.trace, lambda: [rand(3, 3).t()]),
]


@pytest.mark.parametrize("fn, make", [case[1:] for case in NON_CONTIGUOUS], ids=[case[0] for case in NON_CONTIGUOUS])
def test_non_contiguous_operands(fn, make):
    inputs = make()
    assert not all(x.is_contiguous() for x in inputs)
    # tt.gradcheck flattens inputs with .view(-1), which non-contiguous tensors refuse (an engine limitation);
    # the finite-difference check of these ops runs on contiguous inputs in the tests above.
    check_op(fn, *inputs, gradcheck=False)


USED_TWICE = [
    ("a @ a", lambda a: a @ a, (3, 3)),
    ("batched a @ a", lambda a: a @ a, (2, 3, 3)),
    ("a.T-like: vector a @ a", lambda a: a @ a, (3,)),
    ("mm(a, a)", lambda a: torch.mm(a, a), (3, 3)),
    ("bmm(a, a)", lambda a: torch.bmm(a, a), (2, 3, 3)),
    ("outer(a, a)", lambda a: torch.outer(a, a), (3,)),
    ("dot(a, a)", lambda a: torch.dot(a, a), (3,)),
    ("einsum ij,jk", lambda a: torch.einsum("ij,jk->ik", a, a), (3, 3)),
    ("einsum ij,ij", lambda a: torch.einsum("ij,ij->", a, a), (2, 3)),
    ("addmm(a, a, a)", lambda a: torch.addmm(a, a, a, beta=0.5), (3, 3)),
    ("(a @ a) @ a", lambda a: (a @ a) @ a, (3, 3)),
]


@pytest.mark.parametrize("fn, shape", [case[1:] for case in USED_TWICE], ids=[case[0] for case in USED_TWICE])
def test_input_used_twice(fn, shape):
    check_op(fn, rand(*shape))


CONSTANT = torch.linspace(-1, 1, 12, dtype=torch.float64).reshape(3, 4)


@pytest.mark.parametrize("fn", [
    lambda a: a @ CONSTANT,
    lambda a: CONSTANT.t() @ a,
    lambda a: torch.einsum("ij,jk->ik", a, CONSTANT),
    lambda a: torch.einsum("ij,jk->ik", [a, CONSTANT]),
    lambda a: torch.addmm(CONSTANT, a, CONSTANT),
], ids=["a @ C", "C @ a", "einsum", "einsum list", "addmm"])
def test_operand_without_gradient(fn):
    check_op(fn, rand(3, 3))


@pytest.mark.parametrize("fn", [
    lambda a, b: torch.outer(a, b),
    lambda a, b: a.ger(b),
    lambda a, b: torch.einsum("i,j->ij", a, b),
    lambda a, b: torch.einsum("i,j->ij", [a, b]),
    lambda a, b: torch.einsum("i,j,j->i", a, b, b),
    lambda a, b: torch.einsum("ii,j->ij", torch.outer(a, a), b),  # a diagonal: the identity helper in g's dtype
    lambda a, b: torch.einsum("ij,k->k", torch.outer(a, a), b),  # summed away: the ones helper in g's dtype
], ids=["outer", "ger", "einsum", "einsum list", "einsum three", "einsum diagonal", "einsum summed"])
def test_operands_of_two_dtypes_as_torch(fn):
    """torch computes in the promoted dtype (float64 here) and casts each gradient back to its operand's."""
    a, b = torch.linspace(-1, 1, 3), torch.linspace(0.5, 2, 4, dtype=torch.float64)
    theirs = [a.clone().requires_grad_(True), b.clone().requires_grad_(True)]
    ours = [tt.tracer(a, requires_grad=True), tt.tracer(b, requires_grad=True)]
    out = fn(*theirs)
    weights = torch.linspace(-2, 3, out.numel(), dtype=out.dtype).reshape(out.shape)
    (out * weights).sum().backward()
    ours_out = fn(*ours)
    assert ours_out.dtype == out.dtype == torch.float64
    (ours_out * weights).sum().backward()
    for x, y in zip(ours, theirs):
        assert x.grad.dtype == y.grad.dtype
        torch.testing.assert_close(x.grad.as_subclass(torch.Tensor), y.grad)
    # the float64 operand against central differences (a's float32 values are exact in float64)
    loss = lambda v: (fn(a, v) * weights).sum()  # noqa: E731
    step = 1e-6
    by_differences = torch.stack([(loss(b + step * e) - loss(b - step * e)) / (2 * step)
                                  for e in torch.eye(4, dtype=torch.float64)])
    torch.testing.assert_close(ours[1].grad.as_subclass(torch.Tensor), by_differences, rtol=1e-6, atol=1e-6)


# ------------------------------------------------------------------------------------------- double backward

DOUBLE_BACKWARD = [
    ("matmul 2-D", lambda a, b: a @ b, [(2, 3), (3, 4)]),
    ("matmul batched", lambda a, b: a @ b, [(2, 2, 3), (2, 3, 4)]),
    ("matmul batch broadcast", lambda a, b: a @ b, [(2, 1, 3, 4), (5, 4, 2)]),
    ("matmul 1-D @ batched", lambda a, b: a @ b, [(3,), (2, 3, 4)]),
    ("matmul 1-D @ 1-D", lambda a, b: a @ b, [(3,), (3,)]),
    ("rmatmul", lambda a, b: T.__rmatmul__(b, a), [(2, 3), (3, 4)]),
    ("mm", torch.mm, [(2, 3), (3, 4)]),
    ("bmm", torch.bmm, [(2, 2, 3), (2, 3, 4)]),
    ("einsum ij,jk->ik", lambda a, b: torch.einsum("ij,jk->ik", a, b), [(2, 3), (3, 4)]),
    ("einsum implicit", lambda a, b: torch.einsum("ij,jk", a, b), [(2, 3), (3, 4)]),
    ("einsum ellipsis", lambda a, b: torch.einsum("...ij,...jk->ik", a, b), [(5, 3, 4), (1, 4, 2)]),
    ("einsum diagonal", lambda a, b: torch.einsum("ii,ij->j", a, b), [(3, 3), (3, 2)]),
    ("einsum three operands", lambda a, b, c: torch.einsum("ij,jk,kl->il", a, b, c), [(2, 3), (3, 4), (4, 2)]),
    ("tensordot", lambda a, b: torch.tensordot(a, b, dims=([1, 0], [0, 1])), [(3, 4, 2), (4, 3, 2)]),
    ("addmm", lambda c, a, b: torch.addmm(c, a, b, beta=0.5, alpha=2.0), [(2, 4), (2, 3), (3, 4)]),
    ("dot", torch.dot, [(3,), (3,)]),
]


@pytest.mark.parametrize("fn, shapes", [case[1:] for case in DOUBLE_BACKWARD],
                         ids=[case[0] for case in DOUBLE_BACKWARD])
def test_double_backward(fn, shapes):
    double_backward_matches(fn, *(rand(*s) for s in shapes))


def test_double_backward_of_a_used_twice():
    double_backward_matches(lambda a: (a @ a) @ a, rand(3, 3))


# -------------------------------------------------------------------------------------------- registry, errors

REGISTERED = [torch.matmul, T.matmul, T.__matmul__, T.__rmatmul__, torch.linalg.matmul, torch.mm, T.mm, torch.bmm,
              T.bmm, torch.mv, T.mv, torch.dot, T.dot, torch.vdot, T.vdot, torch.outer, T.outer, torch.ger, T.ger,
              torch.inner, T.inner, torch.tensordot, torch.einsum, torch.trace, T.trace, torch.addmm, T.addmm,
              torch.addmv, T.addmv, torch.addr, T.addr, torch.baddbmm, T.baddbmm, torch.addbmm, T.addbmm]


def test_every_alias_is_registered():
    supported = set(tt.supported_ops())
    assert [f for f in REGISTERED if f not in supported] == []


@pytest.mark.parametrize("fn, message", [
    (torch.vdot, "dot, vdot"),
    (lambda a, b: a @ b, "matmul"),
    (lambda a, b: torch.einsum("i,i->", a, b), "einsum"),
])
def test_complex_operands_are_refused(fn, message):
    a = tt.tracer(torch.randn(3, dtype=torch.complex64), requires_grad=True)
    b = tt.tracer(torch.randn(3, dtype=torch.complex64))
    with pytest.raises(tt.UnsupportedOperationError, match=f"{message}: complex inputs are not supported"):
        fn(a, b)


def test_complex_without_gradient_still_computes():
    a, b = tt.tracer(torch.randn(3, dtype=torch.complex64)), tt.tracer(torch.randn(3, dtype=torch.complex64))
    torch.testing.assert_close(torch.vdot(a, b).as_subclass(T), torch.vdot(a.as_subclass(T), b.as_subclass(T)))


def test_shape_errors_are_torchs_own():
    a, b = tt.tracer(rand(2, 3), requires_grad=True), tt.tracer(rand(4, 5))
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        a @ b
    with pytest.raises(RuntimeError, match="einsum"):
        torch.einsum("ij,jk->ik", a, b)


@pytest.mark.parametrize("shapes", [((2, 3), (3, 4)), ((3,), (3, 4)), ((2, 3), (3,)), ((3,), (3,)),
                                    ((2, 2, 3), (3, 4))], ids=str)
@pytest.mark.parametrize("frozen", [0, 1])
def test_matmul_saves_an_operand_only_for_the_others_gradient(shapes, frozen):
    """torch saves a only if b needs a gradient, and b only if a does: with one operand frozen, the other may change
    in place before backward (no error in either), and the gradient is the one of the values at the call."""
    values = [torch.linspace(-1, 1, math.prod(s), dtype=torch.float64).reshape(s) for s in shapes]
    weights = None
    results = []
    for ours in (True, False):
        leaves = [tt.tracer(v.clone(), requires_grad=k != frozen) if ours else v.clone().requires_grad_(k != frozen)
                  for k, v in enumerate(values)]
        out = leaves[0] @ leaves[1]
        weights = torch.linspace(0.5, 2, out.numel(), dtype=out.dtype).reshape(out.shape)
        moving = 1 - frozen  # the operand that needs a gradient: nothing reads it
        with (tt.no_grad() if ours else torch.no_grad()):
            leaves[moving].mul_(3)
        (out * weights).sum().backward()
        results.append(leaves[moving].grad.as_subclass(torch.Tensor))
    torch.testing.assert_close(results[0], results[1])
    fixed = values[frozen]
    loss = (lambda v: (v @ fixed * weights).sum()) if frozen == 1 else (lambda v: (fixed @ v * weights).sum())
    assert tt.gradcheck(loss, values[1 - frozen].clone())
    torch.testing.assert_close(results[0], torch.func.grad(loss)(values[1 - frozen].clone()))


CONTRACTIONS = {
    "mm": (torch.mm, (2, 3), (3, 4)),
    "bmm": (torch.bmm, (2, 2, 3), (2, 3, 4)),
    "mv": (torch.mv, (2, 3), (3,)),
    "dot": (torch.dot, (3,), (3,)),
    "outer": (torch.outer, (3,), (4,)),
    "inner": (torch.inner, (2, 3), (4, 3)),
    "tensordot": (lambda a, b: torch.tensordot(a, b, 1), (2, 3), (3, 4)),
    "addmm": (lambda a, b: torch.addmm(torch.ones(2, 4, dtype=a.dtype), a, b, beta=0.5, alpha=2.0), (2, 3), (3, 4)),
    "baddbmm": (lambda a, b: torch.baddbmm(torch.ones(2, 2, 4, dtype=a.dtype), a, b, alpha=0.3), (2, 2, 3), (2, 3, 4)),
    "addr": (lambda a, b: torch.addr(torch.ones(3, 4, dtype=a.dtype), a, b), (3,), (4,)),
}


@pytest.mark.parametrize("name", CONTRACTIONS)
@pytest.mark.parametrize("frozen", [0, 1])
def test_contractions_save_an_operand_only_for_the_others_gradient(name, frozen):
    """As matmul: the operand that needs a gradient is not saved when its partner is frozen, so it may change in
    place before backward, as in torch; its gradient is the one at the call's values."""
    fn, *shapes = CONTRACTIONS[name]
    values = [torch.linspace(-1, 1, math.prod(s), dtype=torch.float64).reshape(s) for s in shapes]
    moving = 1 - frozen
    results, weights = [], None
    for ours in (True, False):
        leaves = [tt.tracer(v.clone(), requires_grad=k != frozen) if ours else v.clone().requires_grad_(k != frozen)
                  for k, v in enumerate(values)]
        out = fn(*leaves)
        weights = torch.linspace(0.5, 2, out.numel(), dtype=out.dtype).reshape(out.shape)
        with (tt.no_grad() if ours else torch.no_grad()):
            leaves[moving].mul_(3)
        (out * weights).sum().backward()
        results.append(leaves[moving].grad.as_subclass(torch.Tensor))
    torch.testing.assert_close(results[0], results[1])
    loss = lambda v: (fn(*(values[:1] + [v] if moving else [v] + values[1:])) * weights).sum()  # noqa: E731
    assert tt.gradcheck(loss, values[moving].clone())
