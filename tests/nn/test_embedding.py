"""F.embedding / torch.embedding rules and the Embedding module, against torch autograd and finite differences."""
import warnings

import pytest
import torch
import torch.nn.functional as F
from helpers import check_op, double_backward_matches, non_contiguous
from torch.func import functional_call

import torchtrace as tt
from torchtrace.nn.embedding import Embedding

torch.manual_seed(0)
W = torch.randn(6, 3)
I = torch.tensor([[0, 2, 2], [5, 1, 2]])  # row 2 three times, rows 3 and 4 never  # noqa: E741
FLAT = torch.tensor([4, 0, 4, 4, 1])


@pytest.mark.parametrize("fn, w", [
    (lambda w: F.embedding(I, w), W),
    (lambda w: F.embedding(FLAT, w), W),
    (lambda w: F.embedding(torch.tensor(3), w), W),  # a 0-d index: one row
    (lambda w: F.embedding(I.reshape(2, 3, 1), w), W),
    (lambda w: F.embedding(torch.tensor([], dtype=torch.long), w), W),  # no index at all
    (lambda w: F.embedding(input=I, weight=w), W),
    (lambda w: F.embedding(I.t(), w), W),  # non-contiguous indices
    (lambda w: F.embedding(I, w), non_contiguous(W)),
    (lambda w: F.embedding(I, w), W.double()),
    (lambda w: F.embedding(I, w) * F.embedding(FLAT[:3], w), W),  # the weight used twice
    (lambda w: torch.embedding(w, I), W),
])
def test_embedding(fn, w):
    check_op(fn, w)


@pytest.mark.parametrize("fn", [
    lambda w: F.embedding(I, w, padding_idx=2),
    lambda w: F.embedding(I, w, 0),
    lambda w: F.embedding(I, w, padding_idx=-1),  # the last row (5)
    lambda w: F.embedding(I, w, padding_idx=3),  # a padding row that is never looked up
    lambda w: F.embedding(I, w, scale_grad_by_freq=True),
    lambda w: F.embedding(FLAT, w, padding_idx=4, scale_grad_by_freq=True),
    lambda w: torch.embedding(w, I, 2),
    lambda w: torch.embedding(w, I, -1),  # the builtin: a negative padding_idx means none
    lambda w: torch.embedding(w, FLAT, 1, True),
])
def test_padding_and_frequency_scaling_follow_torch(fn):
    check_op(fn, W, gradcheck=False)  # not true derivatives (padding rows are looked up but get no gradient)


def test_repeated_indices_accumulate_and_padding_row_gets_nothing():
    w = tt.tracer(W, requires_grad=True)
    F.embedding(I, w, padding_idx=5).sum().backward()
    assert w.grad[:, 0].tolist() == [1.0, 1.0, 3.0, 0.0, 0.0, 0.0]  # row 5 is looked up once, but it is padding


def test_indices_may_be_tracers():
    w = tt.tracer(W, requires_grad=True)
    F.embedding(tt.tracer(I), w).sum().backward()
    expected = W.clone().requires_grad_(True)
    F.embedding(I, expected).sum().backward()
    torch.testing.assert_close(w.grad, expected.grad)


def test_double_backward():
    double_backward_matches(lambda w: torch.tanh(F.embedding(I, w)) ** 2, W.double())


@pytest.mark.parametrize("fn, error, message", [
    (lambda w: F.embedding(I, w, sparse=True), NotImplementedError, "embedding: sparse=True is not supported"),
    (lambda w: torch.embedding(w, I, -1, False, True), NotImplementedError, "sparse=True is not supported"),
    (lambda w: F.embedding(I, w, padding_idx=6), AssertionError, "Padding_idx must be within num_embeddings"),
])
def test_refused_arguments(fn, error, message):
    with pytest.raises(error, match=message):
        fn(tt.tracer(W, requires_grad=True))


def _lookups_with_max_norm(make_leaf, options: dict):
    """Two lookups with max_norm (each rescales the rows it reads in place first), a loss over both: the weight
    after them, both outputs and the weight's gradient."""
    w = make_leaf((W * 2).double())
    outs = [F.embedding(I, w, **options), F.embedding(FLAT, w, **options)]
    loss = sum((o * torch.arange(o.numel(), dtype=o.dtype).reshape(o.shape)).sum() for o in outs)
    loss.backward()
    return [t.detach().as_subclass(torch.Tensor) for t in (w, *outs, w.grad)]


@pytest.mark.parametrize("options", [{"max_norm": 1.0}, {"max_norm": 1.5, "norm_type": 1.0, "padding_idx": 2},
                                     {"max_norm": 0.5, "scale_grad_by_freq": True}], ids=str)
def test_max_norm_rescales_the_weight_in_place_as_torch(options):
    ours = _lookups_with_max_norm(lambda t: tt.tracer(t, requires_grad=True), options)
    theirs = _lookups_with_max_norm(lambda t: t.requires_grad_(True), options)
    assert not torch.equal(theirs[0], (W * 2).double())  # rows were rescaled
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_max_norm_gradient_is_the_lookups_at_the_rescaled_weight():
    """torch does not differentiate the rescaling (it runs under no_grad): the gradient is the lookup's at the
    rescaled weight, which finite differences of the plain lookup confirm."""
    w = tt.tracer((W * 2).double(), requires_grad=True)
    (F.embedding(I, w, max_norm=1.0) ** 3).sum().backward()
    rescaled = w.detach().as_subclass(torch.Tensor).clone()
    assert tt.gradcheck(lambda v: (F.embedding(I, v) ** 3).sum(), rescaled)
    theirs = rescaled.clone().requires_grad_(True)
    (F.embedding(I, theirs) ** 3).sum().backward()
    torch.testing.assert_close(w.grad.as_subclass(torch.Tensor), theirs.grad)


def test_max_norm_on_a_weight_saved_before_raises_as_torch():
    for make, message in ((lambda t: tt.tracer(t, requires_grad=True), "modified by an in-place operation"),
                          (lambda t: t.requires_grad_(True), "modified by an inplace operation")):
        w = make((W * 2).double())
        loss = (w * w).sum() + F.embedding(I, w, max_norm=1.0).sum()  # w * w saved w, then the lookup rescales it
        with pytest.raises(RuntimeError, match=message):
            loss.backward()


def test_max_norm_forward_mode_as_torch_func():
    """ẏ = Ẇ[i] at the rescaled weight: the tangent is not rescaled (forward mode transposes the rule's backward)."""
    tangent = torch.randn(6, 3, dtype=torch.float64)
    fn = lambda w: F.embedding(I, w, max_norm=1.0) ** 2  # noqa: E731
    theirs = torch.func.jvp(fn, ((W * 2).double(),), (tangent,))[1]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the transposed backward's notice)
        ours = tt.jvp(fn, ((W * 2).double(),), (tangent,))[1]
    torch.testing.assert_close(ours.as_subclass(torch.Tensor), theirs)


def test_max_norm_without_gradients_runs_as_torch():
    ours, theirs = tt.tracer(W * 3), W * 3
    with tt.no_grad():
        out = F.embedding(I, ours, max_norm=1.0)
    torch.testing.assert_close(out.as_subclass(torch.Tensor), F.embedding(I, theirs, max_norm=1.0))


@pytest.mark.parametrize("options", [{}, {"padding_idx": 1}, {"padding_idx": -2, "scale_grad_by_freq": True}])
def test_module_matches_torch(options):
    torch.manual_seed(9)
    layer = Embedding(6, 3, **options)
    torch.manual_seed(9)
    twin = torch.nn.Embedding(6, 3, **options)
    assert repr(layer) == repr(twin)
    assert list(layer.state_dict()) == list(twin.state_dict())
    assert torch.equal(layer.weight.as_subclass(torch.Tensor), twin.weight.detach())  # padding row zero too
    out = layer(I)
    expected = twin(I)
    torch.testing.assert_close(out.as_subclass(torch.Tensor), expected.detach())
    weights = torch.randn(out.shape)
    (out * weights).sum().backward()
    (expected * weights).sum().backward()
    torch.testing.assert_close(layer.weight.grad, twin.weight.grad)
    assert out.grad_fn.module is layer


def test_module_gradient_through_functional_call():
    layer = Embedding(6, 3, padding_idx=0)
    check_op(lambda p: functional_call(layer, p, (I,)), {"weight": W}, gradcheck=False)


def test_from_pretrained():
    frozen = Embedding.from_pretrained(W)
    assert not frozen.weight.requires_grad
    assert frozen(I).grad_fn is None
    trainable = Embedding.from_pretrained(W, freeze=False, padding_idx=0)
    trainable(I).sum().backward()
    assert trainable.weight.grad[0].abs().sum() == 0 and trainable.weight.grad[2, 0] == 3
