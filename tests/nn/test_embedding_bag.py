"""F.embedding_bag rule and nn.EmbeddingBag, against torch autograd."""
import pytest
import torch
import torch.nn.functional as F
from helpers import check_op

import torchtrace as tt
from torchtrace.errors import UnsupportedOperationError
from torchtrace.nn import embedding_bag

torch.manual_seed(0)
W = torch.randn(6, 3)
INDEX = torch.tensor([1, 2, 4, 2, 0, 3, 2, 5, 1])
OFFSETS = torch.tensor([0, 2, 2, 5, 8])  # an empty bag, a bag of one
BATCH = torch.tensor([[1, 2, 4], [4, 3, 2], [0, 0, 5]])
PSW = torch.rand(9)


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("options", [
    {"input": INDEX, "offsets": OFFSETS},
    {"input": INDEX, "offsets": torch.tensor([0, 2, 2, 5, 9]), "include_last_offset": True},
    {"input": BATCH},
    {"input": INDEX, "offsets": OFFSETS, "padding_idx": 2},
    {"input": INDEX, "offsets": OFFSETS, "padding_idx": -1},
    {"input": torch.tensor([2, 2, 1]), "offsets": torch.tensor([0, 2]), "padding_idx": 2},  # a bag of padding only
    {"input": BATCH, "padding_idx": 4},
], ids=str)
def test_embedding_bag(mode, options):
    check_op(lambda w: F.embedding_bag(weight=w, mode=mode, **options), W.double())


def _bags_through_embedding(index, w, bag, scale, bags):
    """sum / mean bags written with F.embedding, whose scale_grad_by_freq torch implements as documented."""
    rows = F.embedding(index, w, scale_grad_by_freq=True) * scale.unsqueeze(1)
    return torch.zeros(bags, w.shape[1], dtype=w.dtype).index_add(0, bag, rows)


@pytest.mark.parametrize("mode, padding_idx", [("sum", None), ("sum", 1), ("mean", None), ("mean", 2)])
def test_scale_grad_by_freq_divides_by_the_counts(mode, padding_idx):
    """dW[r] is divided by how often r occurs (torch's docs; F.embedding does so). torch's CPU embedding_bag kernel
    divides by other counts (rows 3, 4, 5 of INDEX, each used once, get 1/3), so the reference is the same bags
    written with F.embedding under torch autograd."""
    bag = torch.tensor([0, 0, 2, 2, 2, 3, 3, 3, 4])
    kept = (INDEX != (-1 if padding_idx is None else padding_idx)).double()
    if mode == "mean":
        kept = kept / torch.zeros(5, dtype=torch.float64).index_add(0, bag, kept).clamp(min=1)[bag]
    expected_w = W.double().requires_grad_(True)
    g = torch.randn(5, 3, dtype=torch.float64)
    _bags_through_embedding(INDEX, expected_w, bag, kept, 5).backward(g)
    w = tt.tracer(W.double(), requires_grad=True)
    out = F.embedding_bag(INDEX, w, OFFSETS, scale_grad_by_freq=True, mode=mode, padding_idx=padding_idx)
    out.backward(g)
    if padding_idx is not None:
        expected_w.grad[padding_idx] = 0
    torch.testing.assert_close(w.grad, expected_w.grad)


def test_max_ties_go_to_the_first_entry_like_torch():
    tied = torch.tensor([[1.0, 2.0], [1.0, 2.0], [0.5, 2.0]], dtype=torch.float64)
    check_op(lambda w: F.embedding_bag(torch.tensor([2, 0, 1, 1, 0]), w, torch.tensor([0, 3]), mode="max"), tied,
             gradcheck=False)


@pytest.mark.parametrize("options", [
    {"input": INDEX, "offsets": OFFSETS},
    {"input": INDEX, "offsets": OFFSETS, "padding_idx": 2},
    {"input": INDEX, "offsets": torch.tensor([0, 2, 2, 5, 9]), "include_last_offset": True},
], ids=str)
def test_per_sample_weights(options):
    check_op(lambda w, p: F.embedding_bag(weight=w, mode="sum", per_sample_weights=p, **options), W, PSW)
    check_op(lambda w, p: F.embedding_bag(BATCH, w, mode="sum", per_sample_weights=p), W, PSW.reshape(3, 3))


def test_weight_used_twice_and_float32():
    check_op(lambda w: F.embedding_bag(INDEX, w, OFFSETS, mode="max") * w.sum(), W)


def test_module_and_from_pretrained():
    torch.manual_seed(1)
    ours = embedding_bag.EmbeddingBag(6, 3, mode="sum", padding_idx=0)
    torch.manual_seed(1)
    theirs = torch.nn.EmbeddingBag(6, 3, mode="sum", padding_idx=0)
    assert repr(ours) == repr(theirs) and list(ours.state_dict()) == list(theirs.state_dict())
    assert torch.equal(ours.weight.as_subclass(torch.Tensor), theirs.weight.detach())
    ours(INDEX, OFFSETS).sum().backward()
    theirs(INDEX, OFFSETS).sum().backward()
    torch.testing.assert_close(ours.weight.grad, theirs.weight.grad)
    layer = embedding_bag.EmbeddingBag.from_pretrained(W, freeze=False, mode="max")
    assert isinstance(layer.weight, tt.nn.Parameter) and layer.weight.requires_grad
    layer(BATCH).sum().backward()
    assert layer.weight.grad.shape == W.shape
    assert layer(BATCH).grad_fn.name == "EmbeddingBagFunctionBackward"


def test_refused_arguments():
    w = tt.tracer(W, requires_grad=True)
    with pytest.raises(UnsupportedOperationError, match="embedding_bag: sparse=True is not supported"):
        F.embedding_bag(INDEX, w, OFFSETS, sparse=True)
    with pytest.raises(UnsupportedOperationError, match=r"argument order \(weight, input\) is not supported"):
        F.embedding_bag(w, INDEX, OFFSETS)


def _bags(ours: bool, psw_grad: bool, **options):
    """Two embedding_bag calls on one weight with fixed per-sample weights (needing a gradient or not)."""
    leaf = (lambda t: tt.tracer(t, requires_grad=True)) if ours else (lambda t: t.requires_grad_(True))
    w = leaf((W * 2).double())
    psw = leaf(PSW.double()) if psw_grad else PSW.double()
    outs = [F.embedding_bag(INDEX, w, OFFSETS, mode="sum", per_sample_weights=psw, **options) for _ in range(2)]
    sum((o * torch.arange(o.numel(), dtype=o.dtype).reshape(o.shape)).sum() for o in outs).backward()
    return [t.detach().as_subclass(torch.Tensor) for t in (w, *outs, w.grad)] + (
        [psw.grad.as_subclass(torch.Tensor)] if psw_grad else [])


@pytest.mark.parametrize("options", [{}, {"max_norm": 1.0}, {"max_norm": 0.7, "norm_type": 3.0, "padding_idx": 2}],
                         ids=str)
def test_per_sample_weights_without_gradient_and_max_norm_as_torch(options):
    """Per-sample weights that need no gradient (the weight is then not saved: a later in-place rescaling of it by
    max_norm is no error, as in torch); max_norm rescales the rows each call reads, in place, before the lookup."""
    ours, theirs = _bags(True, False, **options), _bags(False, False, **options)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_max_norm_with_per_sample_weights_needing_a_gradient_raises_as_torch():
    """dpsw reads the weight: the second call's in-place rescaling of it makes the first call's backward fail, in
    torch and in torchtrace."""
    for ours, message in ((True, "modified by an in-place operation"), (False, "modified by an inplace operation")):
        with pytest.raises(RuntimeError, match=message):
            _bags(ours, True, max_norm=1.0)


def test_per_sample_weights_without_gradient_against_finite_differences():
    assert tt.gradcheck(lambda w: F.embedding_bag(INDEX, w, OFFSETS, mode="sum", per_sample_weights=PSW.double()),
                        W.double())


def _second_order(fn, inputs: list, ours: bool) -> list:
    """d/d inputs of sum over first-order gradients squared (create_graph), by torchtrace or by torch autograd."""
    if ours:
        xs = [tt.tracer(x, requires_grad=True) for x in inputs]
        grads = tt.grad((fn(*xs) ** 2).sum(), xs, create_graph=True)
        return [t.as_subclass(torch.Tensor) for t in tt.grad(sum((d * d).sum() for d in grads), xs)]
    xs = [x.clone().requires_grad_(True) for x in inputs]
    grads = torch.autograd.grad((fn(*xs) ** 2).sum(), xs, create_graph=True)
    return list(torch.autograd.grad(sum((d * d).sum() for d in grads), xs))


BAG_OF = torch.tensor([0, 0, 2, 2, 2, 3, 3, 3, 4])


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_double_backward(mode):
    """torch has no double backward for embedding_bag: the reference is the same bags spelled out with
    F.embedding and index_add (mean: divided by the bag sizes; max: scatter_reduce amax) under torch autograd."""
    bags = torch.zeros(5, 3, dtype=torch.float64)
    if mode == "max":
        ours = _second_order(lambda w: F.embedding_bag(INDEX, w, OFFSETS, mode="max"), [W.double()], True)
        theirs = _second_order(lambda w: bags.scatter_reduce(0, BAG_OF[:, None].expand(9, 3), F.embedding(INDEX, w),
                                                             "amax", include_self=False), [W.double()], False)
    else:
        sizes = torch.bincount(BAG_OF, minlength=5).clamp(min=1).double()[BAG_OF, None]
        scale = (lambda p: p[:, None]) if mode == "sum" else (lambda p: p[:, None] / sizes)
        ours = _second_order(lambda w, p: F.embedding_bag(INDEX, w, OFFSETS, mode="sum", per_sample_weights=p)
                             if mode == "sum" else F.embedding_bag(INDEX, w * p.sum(), OFFSETS, mode="mean"),
                             [W.double(), PSW.double()], True)
        theirs = _second_order(lambda w, p: bags.index_add(0, BAG_OF, F.embedding(INDEX, w) * scale(p))
                               if mode == "sum" else bags.index_add(0, BAG_OF, F.embedding(INDEX, w * p.sum())
                                                                    * scale(torch.ones(9, dtype=torch.float64))),
                               [W.double(), PSW.double()], False)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b)
