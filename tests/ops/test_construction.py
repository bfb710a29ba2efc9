"""Gradient rules of torchtrace/ops/construction.py: triangles, diagonals, grids, kron, repeats, shape adapters."""
import warnings

import pytest
import torch
from helpers import assert_every_rule_exercised, check_case, check_case_double_backward, check_op
from hypothesis import given, settings
from hypothesis import strategies as st

import torchtrace as tt

T = torch.Tensor
DTYPES = [torch.float64, torch.float32]


def ints(*values):
    return torch.tensor(values)


# One line per case: (fn, shapes of its inputs). Every registered callable appears at least once.
CASES = {
    # triangles
    "torch.tril": (lambda x: torch.tril(x), [(3, 4)]),
    "Tensor.tril negative diagonal, batched": (lambda x: x.tril(-1), [(2, 3, 4)]),
    "torch.triu diagonal=": (lambda x: torch.triu(x, diagonal=2), [(3, 4)]),
    "Tensor.triu beyond the matrix": (lambda x: x.triu(5) + x, [(3, 4)]),
    "Tensor.triu empty": (lambda x: x.triu(), [(0, 3)]),
    # diagonals
    "torch.diag 1-D -> matrix": (lambda x: torch.diag(x), [(3,)]),
    "Tensor.diag 1-D offset": (lambda x: x.diag(-2), [(3,)]),
    "torch.diag 2-D -> diagonal": (lambda x: torch.diag(x, 1), [(3, 4)]),
    "Tensor.diag 2-D negative offset, tall": (lambda x: x.diag(diagonal=-1), [(4, 2)]),
    "torch.diagflat": (lambda x: torch.diagflat(x), [(2, 2)]),
    "Tensor.diagflat offset": (lambda x: x.diagflat(offset=-1), [(3,)]),
    "torch.diag_embed": (lambda x: torch.diag_embed(x), [(2, 3)]),
    "Tensor.diag_embed offset dims": (lambda x: x.diag_embed(offset=1, dim1=0, dim2=2), [(2, 3)]),
    "torch.block_diag": (lambda a, b: torch.block_diag(a, b), [(2, 3), (1, 2)]),
    "torch.block_diag 0-d, 1-D, empty": (lambda a, b, c: torch.block_diag(a, b, c, a), [(), (3,), (0, 2)]),
    # new arrangements
    "torch.rot90": (lambda x: torch.rot90(x), [(3, 4)]),
    "Tensor.rot90 k dims": (lambda x: x.rot90(3, [2, 0]), [(2, 3, 4)]),
    "Tensor.rot90 negative k, keywords": (lambda x: x.rot90(k=-2, dims=(0, 1)), [(3, 4)]),
    "torch.repeat_interleave int": (lambda x: torch.repeat_interleave(x, 2), [(2, 3)]),
    "Tensor.repeat_interleave int dim": (lambda x: x.repeat_interleave(3, dim=-1), [(2, 3)]),
    "Tensor.repeat_interleave tensor": (lambda x: x.repeat_interleave(ints(2, 0, 1), 0), [(3, 2)]),
    "torch.repeat_interleave tensor dim None": (lambda x: torch.repeat_interleave(x, ints(1, 3, 0, 2)), [(2, 2)]),
    "torch.repeat_interleave output_size": (lambda x: torch.repeat_interleave(x, ints(1, 2), dim=0, output_size=3),
                                            [(2, 2)]),
    "torch.repeat_interleave 0-d": (lambda x: torch.repeat_interleave(x, 3), [()]),
    "torch.combinations": (lambda x: torch.combinations(x), [(4,)]),
    "torch.combinations r=3 with replacement": (lambda x: torch.combinations(x, r=3, with_replacement=True), [(3,)]),
    "torch.combinations r > n": (lambda x: torch.combinations(x, 4) + 0, [(3,)]),
    "torch.kron": (lambda a, b: torch.kron(a, b), [(2, 3), (3, 2)]),
    "Tensor.kron different ranks": (lambda a, b: a.kron(b), [(2,), (2, 1, 3)]),
    "torch.kron 0-d": (lambda a, b: torch.kron(a, b), [(), (3,)]),
    # grids
    "torch.meshgrid ij": (lambda a, b: torch.meshgrid(a, b, indexing="ij"), [(2,), (3,)]),
    "torch.meshgrid xy three": (lambda a, b, c: torch.meshgrid(a, b, c, indexing="xy"), [(2,), (4,), (3,)]),
    "torch.meshgrid list ij with 0-d": (lambda a, b: torch.meshgrid([a, b], indexing="ij"), [(2,), ()]),
    "torch.meshgrid tuple xy": (lambda a, b: torch.meshgrid((a, b), indexing="xy"), [(2,), (3,)]),
    "torch.meshgrid one tensor": (lambda a: torch.meshgrid(a, indexing="xy"), [(3,)]),
    "torch.cartesian_prod": (lambda a, b, c: torch.cartesian_prod(a, b, c), [(2,), (3,), (2,)]),
    "torch.cartesian_prod one tensor": (lambda a: torch.cartesian_prod(a) * a, [(3,)]),
    # shape adapters
    "torch.atleast_1d": (lambda a: torch.atleast_1d(a), [()]),
    "torch.atleast_2d several": (lambda a, b, c: torch.atleast_2d(a, b, c), [(), (3,), (2, 2)]),
    "torch.atleast_3d": (lambda a: torch.atleast_3d(a), [(2, 3)]),
    "torch.atleast_3d list": (lambda a, b: torch.atleast_3d([a, b]), [(3,), (2, 3, 4, 1)]),
    "torch.atleast_1d tuple": (lambda a, b: torch.atleast_1d((a, b)), [(), (2,)]),
    "torch.atleast_2d list": (lambda a, b: torch.atleast_2d([a, b]), [(), (2,)]),
    "torch.broadcast_tensors": (lambda a, b: torch.broadcast_tensors(a, b), [(3, 1), (4,)]),
    "torch.broadcast_tensors three, 0-d": (lambda a, b, c: torch.broadcast_tensors(a, b, c), [(), (2, 1, 3), (1, 3)]),
    # an input used twice
    "used twice: tril and triu": (lambda x: x.tril() * x.triu(1) + x.diag().sum(), [(3, 3)]),
    "used twice: kron with itself": (lambda x: torch.kron(x, x), [(2, 2)]),
    "used twice: meshgrid": (lambda a: torch.meshgrid(a, a * 2, indexing="ij")[0] * a, [(3,)]),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", list(CASES))
def test_rule_matches_torch(name, dtype):
    check_case(*CASES[name], dtype)


# torch's own kron refuses a transposed input ("view size is not compatible")
@pytest.mark.parametrize("name", [n for n in CASES if len(CASES[n][1][0]) >= 2 and min(CASES[n][1][0]) > 1
                                  and "kron" not in n])
def test_rule_on_non_contiguous_input(name):
    check_case(*CASES[name], contiguous=False)


@settings(max_examples=40, deadline=None)
@given(shape=st.lists(st.integers(0, 4), min_size=1, max_size=3), k=st.integers(-4, 4), seed=st.integers(0, 2 ** 16),
       op=st.sampled_from(["tril", "triu", "diag_embed", "diagflat", "rot90", "repeat_interleave"]))
def test_random_shapes_and_offsets(shape, k, seed, op):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    fn = {
        "tril": lambda x: torch.tril(x.reshape(1, -1) if x.dim() == 1 else x, k),
        "triu": lambda x: torch.triu(x.reshape(-1, 1) if x.dim() == 1 else x, k),
        "diag_embed": lambda x: torch.diag_embed(x, k),
        "diagflat": lambda x: torch.diagflat(x, k),
        "rot90": lambda x: torch.rot90(x.reshape(1, -1) if x.dim() == 1 else x, k, (0, -1)),
        "repeat_interleave": lambda x: x.repeat_interleave(abs(k), dim=-1),
    }[op]
    check_op(fn, x)


def test_meshgrid_without_indexing_defaults_to_ij():
    a, b = torch.randn(2, dtype=torch.float64), torch.randn(3, dtype=torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch warns that indexing= will be required
        check_op(lambda a, b: torch.meshgrid(a, b), a, b)


def test_integer_repeats_tensor_carries_no_gradient():
    x = tt.tracer(torch.randn(3), requires_grad=True)
    y = x.repeat_interleave(tt.tracer(ints(1, 2, 3)))
    y.sum().backward()
    assert torch.equal(x.grad, torch.tensor([1.0, 2.0, 3.0]))


@pytest.mark.parametrize("op", [lambda y: y.tril_(), lambda y: y.triu_(-1)], ids=["tril_", "triu_"])
def test_in_place_forms_are_recorded(op):
    def fn(x):
        y = x * 2
        op(y)
        return y * x

    check_op(fn, torch.randn(3, 4, dtype=torch.float64))


def test_every_construction_rule_is_exercised(dispatched):
    assert_every_rule_exercised(dispatched, "torchtrace.ops.construction", CASES)


DOUBLE_BACKWARD = {
    "tril, diag, diag_embed": (lambda x, w: (x.tril() * w).diag_embed().diagonal(0, -2, -1) ** 2
                               + torch.diag(x) ** 3, [(3, 3), (3,)]),
    "kron": (lambda a, b: torch.kron(a * a, b) * torch.kron(b, a), [(2, 2), (2, 2)]),
    "meshgrid, cartesian_prod": (lambda a, b: torch.meshgrid(a * b, b, indexing="xy")[0] ** 2
                                 + torch.cartesian_prod(a, b).prod(), [(2,), (2,)]),
    "block_diag, rot90, repeat_interleave": (lambda a, b: torch.block_diag(a, b).rot90() ** 2
                                             * a.repeat_interleave(2).sum(), [(2, 2), (2,)]),
    "broadcast_tensors, atleast_2d, combinations": (lambda a, b: torch.broadcast_tensors(a, b)[0] ** 2
                                                    * torch.atleast_2d(b) + torch.combinations(b).prod(1).sum(),
                                                    [(3, 1), (3,)]),
}


@pytest.mark.parametrize("name", list(DOUBLE_BACKWARD))
def test_double_backward_matches_torch(name):
    check_case_double_backward(*DOUBLE_BACKWARD[name])


@pytest.mark.parametrize("fn", [
    torch.broadcast_tensors, lambda a, b: torch.meshgrid(a, b, indexing="ij"),
    lambda a, b: torch.meshgrid([a, b], indexing="xy"), torch.atleast_2d, lambda a, b: torch.atleast_3d([a, b])])
def test_each_output_requires_a_gradient_only_if_its_own_input_does_as_torchs(fn):
    """torch makes these one view per input: an output of an input that needs no gradient needs none either (a rule
    that refuses a gradient for it, as gammainc's first argument, then runs as in torch)."""
    plain = torch.tensor([2.0, 3.0], dtype=torch.float64)

    def run(make):
        leaf = make(torch.tensor([1.5, -0.5], dtype=torch.float64))
        outs = fn(plain, leaf)
        (outs[0] * 2 + outs[1] * outs[1]).sum().backward()
        return [o.requires_grad for o in outs], leaf.grad

    ours, theirs = run(lambda t: tt.tracer(t, requires_grad=True)), run(lambda t: t.clone().requires_grad_(True))
    assert ours[0] == theirs[0] == [False, True]
    torch.testing.assert_close(ours[1], theirs[1])
