"""Loss rules (F.mse_loss ... F.kl_div) and loss modules, against torch autograd and finite differences."""
import pytest
import torch
import torch.nn.functional as F
from helpers import check_op, double_backward_matches, non_contiguous

import torchtrace as tt
import torchtrace.nn as nn

torch.manual_seed(0)
X, T = torch.randn(4, 3), torch.randn(4, 3)
W = torch.rand(4, 3) + 0.5
LOGITS = torch.randn(5, 4)
LABELS = torch.tensor([0, 3, 1, 1, 2])
WITH_IGNORED = torch.tensor([0, -100, 1, 3, -100])
CLASS_WEIGHT = torch.tensor([0.2, 1.0, 2.0, 0.7])
SOFT = torch.softmax(torch.randn(5, 4), 1)
LABELS_2D = torch.randint(0, 4, (2, 3, 2))
PROB, TARGET01 = torch.sigmoid(torch.randn(4, 3)), torch.rand(4, 3)

pytestmark = pytest.mark.filterwarnings("ignore:Using a target size", "ignore:reduction", "ignore:size_average")


def like(x, value):
    """Closure constants follow the input's dtype (gradcheck runs in float64)."""
    if isinstance(value, dict):
        return {k: like(x, v) for k, v in value.items()}
    return value.to(x.dtype) if isinstance(value, torch.Tensor) and value.is_floating_point() else value



REDUCTIONS = ["mean", "sum", "none"]


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("fn", [
    F.mse_loss,
    F.l1_loss,
    F.smooth_l1_loss,
    lambda x, t, reduction: F.smooth_l1_loss(x, t, reduction=reduction, beta=0.5),
    lambda x, t, reduction: F.smooth_l1_loss(x, t, reduction=reduction, beta=0.0),
    F.huber_loss,
    lambda x, t, reduction: F.huber_loss(x, t, reduction, 0.3),
    lambda x, t, reduction: F.mse_loss(x, t, reduction=reduction, weight=like(x, W)),
    lambda x, t, reduction: F.huber_loss(x, t, reduction=reduction, delta=0.5, weight=like(x, W)),
])
def test_pointwise_losses(fn, reduction):
    check_op(lambda x, t: fn(x, t, reduction=reduction), X, T)


@pytest.mark.parametrize("fn, inputs", [
    (F.mse_loss, (X, T[0])),  # broadcast target
    (F.l1_loss, (X[:, :1], T)),  # broadcast input
    (F.mse_loss, (X.double(), T.double())),
    (F.huber_loss, (non_contiguous(X), T)),
    (F.mse_loss, (torch.tensor(0.3), torch.tensor(-1.0))),  # 0-d
    (lambda x, t: F.mse_loss(x, t, size_average=False), (X, T)),  # deprecated flags
    (lambda x, t: F.l1_loss(x, t, reduce=False), (X, T)),
    (lambda x, t: F.smooth_l1_loss(x, t, None, True, beta=2.0), (X, T)),
    (lambda x: F.mse_loss(x * 3, x) + F.huber_loss(x, 2 * x), (X,)),  # one input in both roles
    (lambda x, t: F.mse_loss(input=x, target=t), (X, T)),
])
def test_pointwise_loss_forms(fn, inputs):
    check_op(fn, *inputs)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("kwargs", [
    {},
    {"weight": CLASS_WEIGHT},
    {"label_smoothing": 0.1},
    {"weight": CLASS_WEIGHT, "label_smoothing": 0.2},
])
@pytest.mark.parametrize("target", [LABELS, WITH_IGNORED])
def test_cross_entropy_class_indices(target, kwargs, reduction):
    check_op(lambda x: F.cross_entropy(x, target, reduction=reduction, **like(x, kwargs)), LOGITS)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("kwargs", [{}, {"weight": CLASS_WEIGHT}, {"label_smoothing": 0.3},
                                    {"weight": CLASS_WEIGHT, "label_smoothing": 0.1}])
def test_cross_entropy_probabilities(kwargs, reduction):
    """Probability targets get a gradient too."""
    check_op(lambda x, t: F.cross_entropy(x, t, reduction=reduction, **like(x, kwargs)), LOGITS, SOFT)


@pytest.mark.parametrize("fn, inputs", [
    (lambda x: F.cross_entropy(x, LABELS, None, None, 1), (LOGITS,)),  # ignore a real class, positionally
    (lambda x: F.cross_entropy(x, LABELS_2D), (torch.randn(2, 4, 3, 2),)),  # (N, C, d1, d2)
    (lambda x: F.cross_entropy(x, LABELS_2D[..., 0], reduction="none", label_smoothing=0.1), (torch.randn(2, 4, 3),)),
    (lambda x, t: F.cross_entropy(x, t), (torch.randn(2, 4, 3), torch.softmax(torch.randn(2, 4, 3), 1))),
    (lambda x: F.cross_entropy(x, torch.tensor(2)), (torch.randn(4),)),  # unbatched
    (lambda x: F.cross_entropy(x, torch.tensor(2), reduction="none", weight=like(x, CLASS_WEIGHT)), (torch.randn(4),)),
    (lambda x: F.cross_entropy(x, LABELS, size_average=False), (LOGITS,)),
    (lambda x: F.cross_entropy(x, LABELS, reduce=False), (LOGITS,)),
    (lambda x: F.cross_entropy(non_contiguous(x), LABELS), (LOGITS.double(),)),
    (lambda x: F.cross_entropy(x * x, LABELS) + x.sum(), (LOGITS,)),
    # an ignore_index outside the classes never matches one; inside, the samples are masked out
    (lambda x: F.cross_entropy(x, torch.where(LABELS == 2, -1, LABELS), ignore_index=-1), (LOGITS,)),
    (lambda x: F.cross_entropy(x, LABELS, ignore_index=7, label_smoothing=0.2), (LOGITS,)),
    (lambda x: F.cross_entropy(x, LABELS, ignore_index=0, label_smoothing=0.2), (LOGITS,)),
])
def test_cross_entropy_forms(fn, inputs):
    check_op(fn, *inputs)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("target, kwargs", [
    (LABELS, {}), (LABELS, {"weight": CLASS_WEIGHT}), (LABELS, {"ignore_index": 3}),
    (LABELS, {"weight": CLASS_WEIGHT, "ignore_index": 1}), (WITH_IGNORED, {}), (WITH_IGNORED, {"weight": CLASS_WEIGHT}),
])
def test_nll_loss(target, kwargs, reduction):
    check_op(lambda x: F.nll_loss(x, target, reduction=reduction, **like(x, kwargs)), LOGITS.log_softmax(1))


@pytest.mark.parametrize("fn, inputs", [
    (lambda x: F.nll_loss(x, LABELS_2D[..., 0]), (torch.randn(2, 4, 3),)),
    (lambda x: F.nll_loss(x, torch.tensor(1), weight=like(x, CLASS_WEIGHT)), (torch.randn(4),)),
    (lambda x: F.nll_loss(F.log_softmax(x, 1) if F.log_softmax in tt.supported_ops() else x, LABELS), (LOGITS,)),
])
def test_nll_loss_forms(fn, inputs):
    check_op(fn, *inputs)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("weight", [None, torch.rand(3) + 0.5, W])
def test_binary_cross_entropy(weight, reduction):
    check_op(lambda p, t: F.binary_cross_entropy(p, t, like(p, weight), reduction=reduction), PROB, TARGET01)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("weight, pos_weight", [
    (None, None), (W, None), (None, torch.tensor([0.5, 2.0, 3.0])), (torch.rand(3), torch.tensor([0.5, 2.0, 3.0])),
    (None, torch.tensor(2.5)),
])
def test_binary_cross_entropy_with_logits(weight, pos_weight, reduction):
    check_op(lambda x, t: F.binary_cross_entropy_with_logits(x, t, like(x, weight), reduction=reduction,
                                                             pos_weight=like(x, pos_weight)), X * 2, TARGET01)


@pytest.mark.parametrize("fn, inputs", [
    (lambda p, t: F.binary_cross_entropy(p, t, reduce=False), (PROB, TARGET01)),
    (lambda p: F.binary_cross_entropy(p, torch.ones_like(p)), (PROB.double(),)),
    (lambda x: F.binary_cross_entropy_with_logits(x, torch.ones_like(x), size_average=False), (X,)),
    (lambda x, t: F.binary_cross_entropy_with_logits(x, t), (torch.tensor(0.3), torch.tensor(1.0))),
])
def test_binary_cross_entropy_forms(fn, inputs):
    check_op(fn, *inputs)


@pytest.mark.parametrize("reduction", ["mean", "batchmean", "sum", "none"])
@pytest.mark.parametrize("log_target", [False, True])
def test_kl_div(log_target, reduction):
    target = SOFT.log() if log_target else SOFT
    check_op(lambda x, t: F.kl_div(x, t, reduction=reduction, log_target=log_target), LOGITS.log_softmax(1), target)


@pytest.mark.parametrize("fn, inputs", [
    (lambda x, t: F.kl_div(x, t, reduction="batchmean"), (torch.tensor(-0.5), torch.tensor(0.3))),  # 0-d
    (lambda x, t: F.kl_div(x, t, None, False), (LOGITS, SOFT)),
    (lambda x, t: F.kl_div(x, t[0], reduction="sum"), (LOGITS, SOFT)),  # broadcast target
])
def test_kl_div_forms(fn, inputs):
    check_op(fn, *inputs)


@pytest.mark.parametrize("call, name", [
    (lambda x, w: F.mse_loss(x, T, weight=w), "weight"),
    (lambda x, w: F.huber_loss(x, T, "mean", 1.0, w), "weight"),
    (lambda x, w: F.cross_entropy(x, LABELS[:4], w[0, :3]), "weight"),
    (lambda x, w: F.nll_loss(x, LABELS[:4], weight=w[0, :3]), "weight"),
    (lambda x, w: F.binary_cross_entropy(torch.sigmoid(x), TARGET01, w), "weight"),
    (lambda x, w: F.binary_cross_entropy_with_logits(x, TARGET01, w), "weight"),
    (lambda x, w: F.binary_cross_entropy_with_logits(x, TARGET01, pos_weight=w[0]), "pos_weight"),
])
def test_weights_that_require_grad_are_refused(call, name):
    x = tt.tracer(X)
    with pytest.raises(RuntimeError, match=f"not differentiable with respect to '{name}'"):
        call(x, tt.tracer(W, requires_grad=True))


@pytest.mark.parametrize("call", [lambda x, w: F.l1_loss(x, T, weight=w),
                                  lambda x, w: F.l1_loss(x, T, None, None, "sum", w),
                                  lambda x, w: F.l1_loss(x, T, reduction="none", weight=w) * 2])
def test_a_weight_torch_does_not_pass_on_is_used(call):
    """torch's F.l1_loss hands a tensor subclass (and a TorchFunctionMode: tt.check's reference run) its arguments
    without weight=: the rule and tt.check's reference read the caller's weight, recording or not, and compiled."""
    check_op(lambda x: call(x, W), X)
    with torch.no_grad():
        torch.testing.assert_close(call(tt.tracer(X), W).as_subclass(torch.Tensor), call(X, W))
    compiled = tt.compile(lambda x, w: call(x * 1.5, w), (tt.tracer(X, requires_grad=True), W))
    for scale in (1.0, 2.0, -0.5):  # a new weight on every call
        x, x_ = tt.tracer(X.clone(), requires_grad=True), X.clone().requires_grad_()
        compiled(x, W * scale).sum().backward()
        call(x_ * 1.5, W * scale).sum().backward()
        torch.testing.assert_close(x.grad.as_subclass(torch.Tensor), x_.grad)
    with pytest.raises(RuntimeError, match="not differentiable with respect to 'weight'"):
        call(tt.tracer(X, requires_grad=True), tt.tracer(W, requires_grad=True))


@pytest.mark.parametrize("fn, inputs", [
    (lambda x, t: F.mse_loss(x, t) * F.mse_loss(x, t, reduction="sum"), (X, T)),
    (lambda x, t: F.huber_loss(x * x, t, delta=0.5), (X, T)),
    (lambda x: F.binary_cross_entropy_with_logits(x, TARGET01, pos_weight=torch.tensor(2.0)), (X,)),
    (lambda x: F.binary_cross_entropy(torch.sigmoid(x), TARGET01), (X,)),
    (lambda x: F.cross_entropy(x, LABELS, weight=CLASS_WEIGHT, label_smoothing=0.1), (LOGITS,)),
    (lambda x, t: F.cross_entropy(x, t), (LOGITS, SOFT)),
    (lambda x, t: F.kl_div(x, t, reduction="batchmean", log_target=True), (LOGITS, SOFT.log())),
])
def test_double_backward(fn, inputs):
    double_backward_matches(fn, *inputs)


@pytest.mark.parametrize("name, kwargs, inputs", [
    ("MSELoss", {}, (X, T)),
    ("MSELoss", {"reduction": "sum"}, (X, T)),
    ("L1Loss", {"reduction": "none"}, (X, T)),
    ("SmoothL1Loss", {"beta": 0.5}, (X, T)),
    ("HuberLoss", {"delta": 0.5}, (X, T)),
    ("CrossEntropyLoss", {"weight": CLASS_WEIGHT, "ignore_index": 1, "label_smoothing": 0.1}, (LOGITS, LABELS)),
    ("CrossEntropyLoss", {}, (LOGITS, SOFT)),
    ("NLLLoss", {"weight": CLASS_WEIGHT, "reduction": "sum"}, (LOGITS, LABELS)),
    ("BCELoss", {"weight": torch.rand(3)}, (PROB, TARGET01)),
    ("BCEWithLogitsLoss", {"pos_weight": torch.tensor([1.0, 2.0, 0.5])}, (X, TARGET01)),
    ("KLDivLoss", {"reduction": "batchmean", "log_target": True}, (LOGITS.log_softmax(1), SOFT.log())),
])
def test_loss_modules_match_torch(name, kwargs, inputs):
    ours, theirs = getattr(nn, name)(**kwargs), getattr(torch.nn, name)(**kwargs)
    assert isinstance(ours, nn.Module) and isinstance(ours, type(theirs)) and repr(ours) == repr(theirs)
    check_op(ours, *inputs, gradcheck=False)  # the F-level tests above run the finite differences
    first = tt.tracer(inputs[0], requires_grad=True)
    loss = ours(first, inputs[1])
    torch.testing.assert_close(loss.as_subclass(torch.Tensor), theirs(*inputs))
    assert loss.grad_fn.module is ours


def test_mse_is_the_original_name_of_mse_loss():
    assert nn.MSE is nn.MSELoss
    loss = nn.MSE()(tt.tracer(X, requires_grad=True), T)
    assert loss.grad_fn.name == "MseLossBackward"


@pytest.mark.parametrize("fn, name", [
    (lambda x: F.cross_entropy(x, LABELS), "CrossEntropyBackward"),
    (lambda x: F.nll_loss(x, LABELS), "NllLossBackward"),
    (lambda x: F.kl_div(x, SOFT, reduction="batchmean"), "KlDivBackward"),
    (lambda x: F.smooth_l1_loss(x, SOFT), "SmoothL1LossBackward"),
])
def test_node_names(fn, name):
    assert fn(tt.tracer(LOGITS, requires_grad=True)).grad_fn.name == name


def test_cross_entropy_with_every_target_ignored():
    """The loss is 0 / 0 = nan, as in torch; the gradient is zero, as in torch."""
    check_op(lambda x: F.cross_entropy(x, torch.full((5,), -100)), LOGITS, gradcheck=False)


def test_no_node_when_nothing_requires_grad():
    loss = F.cross_entropy(tt.tracer(LOGITS), LABELS)
    assert isinstance(loss, tt.tracer) and loss.grad_fn is None
    torch.testing.assert_close(loss.as_subclass(torch.Tensor), F.cross_entropy(LOGITS, LABELS))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_losses_clamp_with_torchs_epsilon_bit_for_bit(dtype):
    """torch's binary_cross_entropy and cosine_embedding_loss clamp with 1e-12 as a float32 (9.99999996e-13) whatever
    the dtype: at p = 0 the float64 gradient is -1.000000004e12 (it was -1e12), and a zero vector's norm gets that
    epsilon too."""
    p, y = (torch.tensor(v, dtype=dtype) for v in ([0.0, 1.0, 0.3, 1e-13], [1.0, 0.0, 0.5, 0.0]))
    x1 = torch.tensor([[0.0, 0.0], [1.0, 2.0]], dtype=dtype)
    x2, label = torch.tensor([[1.0, 2.0], [3.0, -1.0]], dtype=dtype), torch.tensor([1.0, -1.0], dtype=dtype)
    grads = []
    for make in (lambda t: tt.as_tracer(t.clone(), requires_grad=True), lambda t: t.clone().requires_grad_()):
        q, a, b = make(p), make(x1), make(x2)
        (F.binary_cross_entropy(q, y) + F.cosine_embedding_loss(a, b, label, margin=-0.5)).backward()
        grads.append([t.grad.as_subclass(torch.Tensor) for t in (q, a, b)])
    assert torch.equal(grads[0][0], grads[1][0])
    for ours, theirs in zip(grads[0][1:], grads[1][1:]):  # (the norms' products in another order: 1 ulp)
        torch.testing.assert_close(ours, theirs, rtol=1e-15 if dtype == torch.float64 else 1e-6, atol=0)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("loss, smoothing", [(F.cross_entropy, 0.0), (F.cross_entropy, 0.1), (F.nll_loss, 0.0)],
                         ids=["cross_entropy", "cross_entropy smoothed", "nll_loss"])
def test_a_mean_over_class_weights_that_sum_to_zero_is_nan_as_torchs(loss, smoothing, reduction):
    """'mean' divides by the summed class weights of the counted samples: when they sum to 0 torch's gradient is 0 / 0
    = NaN for those samples (the whole row through cross_entropy's softmax, the target entry for nll_loss) and 0 for
    ignored ones; torchtrace gave 0 (or, smoothed, finite numbers). 'sum' and 'none' divide by nothing."""
    x = torch.tensor([[0.0, 1.0], [2.0, -1.0], [0.5, 0.5]], dtype=torch.float64)
    target, weight = torch.tensor([1, 1, -100]), torch.tensor([1.0, 0.0], dtype=torch.float64)
    options = {"label_smoothing": smoothing} if smoothing else {}
    grads = []
    for make in (lambda t: tt.as_tracer(t.clone(), requires_grad=True), lambda t: t.clone().requires_grad_()):
        leaf = make(x)
        loss(leaf, target, weight=weight, reduction=reduction, **options).sum().backward()
        grads.append(leaf.grad.as_subclass(torch.Tensor))
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-12, atol=0, equal_nan=True)
    assert grads[0][2].eq(0).all() and grads[0][:2].isnan().any() == (reduction == "mean")


def test_kl_divs_target_gradient_at_a_zero_target_is_torchs_nan():
    """torch differentiates kl_div's xlogy(t, t) - t x: at t = 0 its t / t is 0 / 0, NaN (torchtrace gave log 0 + 1 - x
    = -inf); elsewhere log t + 1 - x, checked by central differences."""
    x0, t0 = (torch.tensor(v, dtype=torch.float64) for v in ([-1.0, -2.0, -0.5], [0.0, 0.3, 0.7]))
    grads = []
    for make in (lambda t: tt.as_tracer(t.clone(), requires_grad=True), lambda t: t.clone().requires_grad_()):
        x, t = make(x0), make(t0)
        F.kl_div(x, t, reduction="sum").backward()
        grads.append((x.grad.as_subclass(torch.Tensor), t.grad.as_subclass(torch.Tensor)))
    for ours, theirs in zip(*grads):
        torch.testing.assert_close(ours, theirs, rtol=1e-14, atol=0, equal_nan=True)
    assert grads[0][1][0].isnan() and tt.gradcheck(lambda t: F.kl_div(x0[1:], t, reduction="sum"), t0[1:])
    x, t = (tt.as_tracer(v.clone(), requires_grad=True) for v in (x0, t0))  # d/dx of dl/dt = -1, at t = 0 too (torch)
    _, grad_t = tt.grad(F.kl_div(x, t, reduction="sum"), (x, t), create_graph=True)
    assert tt.grad(grad_t.sum(), x)[0].tolist() == [-1.0, -1.0, -1.0]


@pytest.mark.parametrize("loss, option", [(F.smooth_l1_loss, {"beta": 0.5}), (F.smooth_l1_loss, {"beta": 1.0}),
                                          (F.huber_loss, {"delta": 0.5}), (F.huber_loss, {"delta": 1.0})],
                         ids=["smooth_l1 0.5", "smooth_l1 1", "huber 0.5", "huber 1"])
def test_smooth_l1_and_huber_second_derivatives_at_their_kinks_are_torchs(loss, option):
    """At |x - t| = beta (delta) both branches give the same first derivative; torch's second derivative there is 0
    (its mask is |d| < beta), where a clamp's inclusive mask gave 1 / beta. First and second derivatives bit for bit
    at the kinks, inside and outside."""
    x0 = torch.tensor([1.0, -1.0, 0.5, -0.5, 0.2, 3.0, -2.0, 0.0], dtype=torch.float64)
    results = []
    for make, grad in ((lambda t: tt.as_tracer(t.clone(), requires_grad=True), tt.grad),
                       (lambda t: t.clone().requires_grad_(), torch.autograd.grad)):
        x, t = make(x0), make(torch.zeros(8, dtype=torch.float64))
        first = grad(loss(x, t, **option), [x, t], create_graph=True)
        second = grad(sum((g * g).sum() for g in first), [x, t])
        results.append([g.detach().as_subclass(torch.Tensor) for g in (*first, *second)])
    for ours, theirs in zip(*results):
        assert torch.equal(ours, theirs)


@pytest.mark.parametrize("options", [{}, {"reduction": "sum"}, {"reduction": "none"}, {"ignore_index": 2},
                                     {"weight": torch.rand(5)}, {"weight": torch.rand(5), "reduction": "none"}])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cross_entropy_first_order_is_torch_autograds_bits(options, dtype):
    """Class indices without label smoothing: a first-order backward runs torch's kernels (nll_loss_backward, then
    log_softmax's backward), so the gradient is torch autograd's bit for bit; with create_graph the coefficients
    are written out (the double-backward tests)."""
    torch.manual_seed(0)
    x, target = torch.randn(6, 5, dtype=dtype), torch.tensor([0, 2, 4, 2, 1, 3])
    options = {k: v.to(dtype) if isinstance(v, torch.Tensor) else v for k, v in options.items()}
    ours, theirs = tt.tracer(x, requires_grad=True), x.clone().requires_grad_()
    loss, expected = F.cross_entropy(ours, target, **options), F.cross_entropy(theirs, target, **options)
    g = torch.rand(expected.shape, dtype=dtype)
    loss.backward(g)
    expected.backward(g)
    assert torch.equal(loss.as_subclass(torch.Tensor), expected.detach())
    assert torch.equal(ours.grad, theirs.grad)
