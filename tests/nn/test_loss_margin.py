"""Margin and embedding losses: cosine_embedding, margin_ranking, hinge_embedding, soft_margin, multilabel_soft_margin,
multi_margin, multilabel_margin, triplet_margin, triplet_margin_with_distance; every reduction; the modules."""
import pytest
import torch
import torch.nn.functional as F
from helpers import check_op, double_backward_matches, non_contiguous

import torchtrace as tt
import torchtrace.nn as nn

pytestmark = pytest.mark.filterwarnings("ignore:size_average", "ignore:reduction")

torch.manual_seed(0)
X1, X2 = torch.randn(4, 3), torch.randn(4, 3)
SIGNS = torch.tensor([1, -1, 1, -1])
S1, S2 = torch.randn(5), torch.randn(5)
YS = torch.tensor([1.0, -1.0, 1.0, -1.0, 1.0])
LOGITS = torch.randn(4, 5)
LABELS = torch.tensor([0, 4, 2, 2])
LABEL_LISTS = torch.tensor([[3, 0, -1, 1, 1], [0, 1, 2, 3, 4], [-1, 0, 0, 0, 0], [1, 1, -1, 0, 0]])  # repeats, empty
MULTI_HOT = (torch.rand(4, 5) > 0.5).float()
CLASS_WEIGHT = torch.linspace(0.2, 2.0, 5)
A, P, N = torch.randn(4, 3), torch.randn(4, 3), torch.randn(4, 3)
REDUCTIONS = ["mean", "sum", "none"]


def like(x, t):
    return t.to(x.dtype)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("fn, inputs", [
    (lambda a, b, r: F.cosine_embedding_loss(a, b, SIGNS, reduction=r), (X1, X2)),
    (lambda a, b, r: F.cosine_embedding_loss(a, b, SIGNS, 0.3, reduction=r), (X1, X2)),
    (lambda a, b, r: F.cosine_embedding_loss(a, b, SIGNS.float(), -0.5, reduction=r), (X1, X2)),
    (lambda a, b, r: F.cosine_embedding_loss(a, b, torch.tensor(-1), -0.5, reduction=r), (X1[0], X2[0])),  # unbatched
    (lambda a, b, t, r: F.margin_ranking_loss(a, b, t, reduction=r), (S1, S2, YS)),  # target differentiable too
    (lambda a, b, t, r: F.margin_ranking_loss(a, b, t, 0.5, reduction=r), (S1, S2, YS)),
    (lambda a, r: F.hinge_embedding_loss(a, YS, reduction=r), (S1,)),
    (lambda a, r: F.hinge_embedding_loss(a, torch.tensor([1.0, -1.0, 0.0, 2.0, -1.0]), 0.5, reduction=r), (S1,)),
    (lambda a, r: F.soft_margin_loss(a, YS, reduction=r), (S1,)),
    (lambda a, r: F.soft_margin_loss(a, -YS, reduction=r), (S1 * 30,)),  # far in the tails
    (lambda a, t, r: F.multilabel_soft_margin_loss(a, t, reduction=r), (LOGITS, MULTI_HOT)),
    (lambda a, t, r: F.multilabel_soft_margin_loss(a, t, like(a, CLASS_WEIGHT), reduction=r), (LOGITS, MULTI_HOT)),
    (lambda a, t, r: F.multilabel_soft_margin_loss(a, t, reduction=r), (LOGITS[0], MULTI_HOT[0])),
    (lambda a, t, w, r: F.multilabel_soft_margin_loss(a, t, w, reduction=r), (LOGITS, MULTI_HOT, CLASS_WEIGHT)),
    (lambda a, t, w, r: F.multilabel_soft_margin_loss(input=a, target=t, weight=w, reduction=r),
     (LOGITS, MULTI_HOT, CLASS_WEIGHT)),
    (lambda a, r: F.multi_margin_loss(a, LABELS, reduction=r), (LOGITS,)),
    (lambda a, r: F.multi_margin_loss(a, LABELS, 2, 0.5, reduction=r), (LOGITS,)),
    (lambda a, r: F.multi_margin_loss(a, LABELS, 1, 2.0, like(a, CLASS_WEIGHT), reduction=r), (LOGITS,)),
    (lambda a, r: F.multi_margin_loss(a, LABELS, p=2, weight=like(a, CLASS_WEIGHT), reduction=r), (LOGITS,)),
    (lambda a, r: F.multi_margin_loss(a, torch.tensor(3), reduction=r), (LOGITS[0],)),
    (lambda a, r: F.multilabel_margin_loss(a, LABEL_LISTS, reduction=r), (LOGITS,)),
    (lambda a, r: F.multilabel_margin_loss(a, LABEL_LISTS[0], reduction=r), (LOGITS[0],)),
    (lambda a, p, n, r: F.triplet_margin_loss(a, p, n, reduction=r), (A, P, N)),
    (lambda a, p, n, r: F.triplet_margin_loss(a, p, n, 0.5, 1, 1e-3, True, reduction=r), (A, P, N)),
    (lambda a, p, n, r: F.triplet_margin_loss(a, p, n, swap=True, p=3, reduction=r), (A, P, N)),
    (lambda a, p, n, r: F.triplet_margin_loss(a, p, n, reduction=r), (A[0], P[0], N[0])),
    (lambda a, p, n, r: F.triplet_margin_with_distance_loss(a, p, n, reduction=r), (A, P, N)),
    (lambda a, p, n, r: F.triplet_margin_with_distance_loss(
        a, p, n, distance_function=torch.nn.PairwiseDistance(1.0), margin=2.0, swap=True, reduction=r), (A, P, N)),
    (lambda a, p, n, r: F.triplet_margin_with_distance_loss(
        a, p, n, distance_function=F.pairwise_distance, swap=True, reduction=r), (A, P, N)),
])
def test_losses(fn, inputs, reduction):
    check_op(lambda *xs: fn(*xs, reduction), *inputs)


@pytest.mark.parametrize("fn, inputs", [
    (lambda a: F.cosine_embedding_loss(a, a * 2, SIGNS), (X1,)),
    (lambda a, b: F.cosine_embedding_loss(a, b, SIGNS, size_average=False), (X1, X2)),  # deprecated flags
    (lambda a, b: F.margin_ranking_loss(a, b, YS, reduce=False), (S1, S2)),
    (lambda a, b: F.margin_ranking_loss(a, b, YS[:1]), (S1, S2)),  # broadcast target
    (lambda a: F.soft_margin_loss(a, torch.sign(X2).to(a.dtype)), (X1.double(),)),
    (lambda a: F.multi_margin_loss(non_contiguous(a), LABELS), (LOGITS,)),
    (lambda a: F.multilabel_margin_loss(a * a, LABEL_LISTS) + a.sum(), (LOGITS,)),
    (lambda a, p: F.triplet_margin_loss(a, p, a * 2), (A, P)),  # one input in two roles
    (lambda a, p, n: F.triplet_margin_loss(a, p, n), (A, P[:1], N)),  # broadcast positive
    (lambda a, b: F.hinge_embedding_loss(a - b, YS, margin=2.0, size_average=False), (S1, S2)),
])
def test_loss_forms(fn, inputs):
    check_op(fn, *inputs)


def test_soft_margin_loss_target_gradient():
    """torch refuses the target's gradient; torchtrace gives dl/dy = -x sigmoid(-y x), checked by finite differences."""
    assert tt.gradcheck(lambda x, y: F.soft_margin_loss(x, y), S1.double(), YS.double() * 0.7)


@pytest.mark.parametrize("fn, inputs", [
    (lambda a, b: F.margin_ranking_loss(a, b, YS), (S1, S1)),  # -y (x1 - x2) + 0 = 0: torch passes the gradient
    (lambda a, b, t: F.margin_ranking_loss(a, b, t, 1.0), (S1, S1 + YS, YS)),  # margin exactly met
    (lambda a: F.hinge_embedding_loss(a, -torch.ones(3), 1.0), (torch.tensor([1.0, 0.5, 2.0]),)),  # x = margin
    (lambda a, b: F.cosine_embedding_loss(a, b, torch.tensor([-1, -1])),  # cos = 0 = margin
     (torch.tensor([[1.0, 0.0], [0.0, 2.0]]), torch.tensor([[0.0, 1.0], [3.0, 0.0]]))),
    (lambda a: F.multi_margin_loss(a, torch.tensor([0, 1])),  # z = margin - x_y + x_i = 0: not counted
     (torch.tensor([[1.0, 0.0, 2.0], [0.0, 1.0, 0.5]]),)),
    (lambda a: F.multilabel_margin_loss(a, torch.tensor([[0, -1, 0]])), (torch.tensor([[2.0, 1.0, 3.0]]),)),
    (lambda a, p, n: F.triplet_margin_loss(a, p, n, swap=True), (A, A, N)),  # d(a, n) = d(p, n): min's tie
    (lambda a, p, n: F.triplet_margin_loss(a, p, n, 1.0, 1, 0.0),  # 1 + |0 - 1| - |0 - 2| = 0 exactly
     (torch.tensor([[0.0]]), torch.tensor([[1.0]]), torch.tensor([[2.0]]))),
])
def test_margins_exactly_met_follow_torch(fn, inputs):
    check_op(fn, *inputs, gradcheck=False)  # finite differences straddle the hinge; torch's side is the reference


@pytest.mark.parametrize("fn, inputs", [
    (lambda a, b: F.cosine_embedding_loss(a, b, SIGNS, 0.1), (X1, X2)),
    (lambda a, b, t: F.margin_ranking_loss(a * a, b, t, 0.5), (S1, S2, YS)),
    (lambda a: F.hinge_embedding_loss(a * a, YS), (S1,)),
    (lambda a: F.soft_margin_loss(a, YS), (S1,)),
    (lambda a, t: F.multilabel_soft_margin_loss(a, t, CLASS_WEIGHT), (LOGITS, MULTI_HOT)),
    (lambda a, p, n: F.triplet_margin_loss(a, p, n, swap=True), (A, P, N)),
    (lambda a, p, n: F.triplet_margin_with_distance_loss(a, p, n, margin=3.0), (A, P, N)),
])
def test_double_backward(fn, inputs):
    double_backward_matches(fn, *inputs)


@pytest.mark.parametrize("call", [
    lambda x, w: F.multi_margin_loss(x, LABELS, weight=w),
])
def test_weights_that_require_grad_are_refused(call):
    with pytest.raises(RuntimeError, match="not differentiable with respect to 'weight'"):
        call(tt.tracer(LOGITS, requires_grad=True), tt.tracer(CLASS_WEIGHT, requires_grad=True))


def test_custom_distance_function_is_refused():
    def cosine_distance(x, y):
        return 1 - F.cosine_similarity(x, y)

    with pytest.raises(tt.UnsupportedOperationError,
                       match="triplet_margin_with_distance_loss: a custom distance_function .* is not supported"):
        F.triplet_margin_with_distance_loss(tt.tracer(A, requires_grad=True), P, N, distance_function=cosine_distance)


def test_written_out_triplet_loss_with_a_custom_distance_works():
    """The workaround the refusal suggests: the same loss written out, every op recorded."""
    def cosine_distance(x, y):
        return 1 - F.cosine_similarity(x, y)

    def written_out(a, p, n):
        return torch.clamp_min(1.0 + cosine_distance(a, p) - cosine_distance(a, n), 0).mean()

    def torchs(a, p, n):
        return F.triplet_margin_with_distance_loss(a, p, n, distance_function=cosine_distance)

    ours = [tt.tracer(x, requires_grad=True) for x in (A, P, N)]
    written_out(*ours).backward()
    theirs = [x.clone().requires_grad_(True) for x in (A, P, N)]
    torchs(*theirs).backward()
    for o, t in zip(ours, theirs):
        torch.testing.assert_close(o.grad, t.grad)


@pytest.mark.parametrize("name, kwargs, inputs, targets", [
    ("CosineEmbeddingLoss", {"margin": 0.2}, (X1, X2), (SIGNS,)),
    ("MarginRankingLoss", {"margin": 0.1, "reduction": "sum"}, (S1, S2, YS), ()),
    ("HingeEmbeddingLoss", {"margin": 2.0}, (S1,), (YS,)),
    ("SoftMarginLoss", {}, (S1,), (YS,)),
    ("MultiLabelSoftMarginLoss", {"weight": CLASS_WEIGHT}, (LOGITS, MULTI_HOT), ()),
    ("MultiMarginLoss", {"p": 2, "margin": 0.5}, (LOGITS,), (LABELS,)),
    ("MultiLabelMarginLoss", {"reduction": "none"}, (LOGITS,), (LABEL_LISTS,)),
    ("TripletMarginLoss", {"margin": 0.5, "swap": True}, (A, P, N), ()),
    ("TripletMarginWithDistanceLoss", {"margin": 0.5}, (A, P, N), ()),
    ("TripletMarginWithDistanceLoss", {"distance_function": torch.nn.PairwiseDistance(1.0)}, (A, P, N), ()),
])
def test_modules_match_torch(name, kwargs, inputs, targets):
    ours, theirs = getattr(nn, name)(**kwargs), getattr(torch.nn, name)(**kwargs)
    assert isinstance(ours, nn.Module) and repr(ours) == repr(theirs)
    check_op(lambda *xs: ours(*xs, *targets), *inputs)
    out = ours(*(tt.tracer(x, requires_grad=True) for x in inputs), *targets)
    torch.testing.assert_close(out.as_subclass(torch.Tensor), theirs(*inputs, *targets))
    assert out.grad_fn.module is ours


@pytest.mark.parametrize("fn, inputs", [
    (lambda a: F.multi_margin_loss(a, LABELS), (LOGITS,)),
    (lambda a: F.multi_margin_loss(a, LABELS, 1, 0.7, like(a, CLASS_WEIGHT)), (LOGITS,)),
    (lambda a: F.multi_margin_loss(a, LABELS, 2, 0.5, reduction="sum"), (LOGITS,)),
    (lambda a, b: F.cosine_embedding_loss(a, b, SIGNS, 0.1), (X1, X2)),
    (lambda a, b: F.cosine_embedding_loss(a, b, SIGNS.float(), -0.2, reduction="none"), (X1, X2)),
], ids=["multi_margin_p1", "multi_margin_weight", "multi_margin_p2", "cosine_embedding", "cosine_float_target"])
def test_float64_gradients_are_not_rounded_through_the_default_dtype(fn, inputs):
    """With float32 as the default dtype, a bool mask times a Python number is float32: the gradient of float64
    inputs must not pass through it (1/C rounded to float32 is off by ~1e-9)."""
    assert torch.get_default_dtype() == torch.float32
    inputs = [x.double() for x in inputs]
    theirs = [x.clone().requires_grad_(True) for x in inputs]
    fn(*theirs).sum().backward()
    ours = [tt.tracer(x, requires_grad=True) for x in inputs]
    fn(*ours).sum().backward()
    for a, b in zip(ours, theirs):
        assert a.grad.dtype == torch.float64
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-14, atol=1e-15)
    assert tt.gradcheck(fn, *inputs)
