"""F.ctc_loss (and torch.ctc_loss): the alpha/beta gradient w.r.t. log_probs, every target/length form; CTCLoss."""
import math

import pytest
import torch
import torch.nn.functional as F
from helpers import check_op

import torchtrace as tt
import torchtrace.nn as nn

torch.manual_seed(0)
STEPS, BATCH, CLASSES = 6, 3, 5
LOGITS = torch.randn(STEPS, BATCH, CLASSES)
PADDED = torch.tensor([[1, 2, 2, 0], [3, 3, 0, 0], [4, 1, 2, 3]])  # repeated labels need a blank between them
TARGET_LENGTHS = torch.tensor([3, 2, 0])  # an empty target too
INPUT_LENGTHS = torch.tensor([6, 5, 4])  # frames past a sample's length get no gradient
CONCATENATED = torch.tensor([1, 2, 2, 3, 3])
REDUCTIONS = ["mean", "sum", "none"]


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("call", [
    lambda lp, r: F.ctc_loss(lp, PADDED, INPUT_LENGTHS, TARGET_LENGTHS, reduction=r),
    lambda lp, r: F.ctc_loss(lp, CONCATENATED, INPUT_LENGTHS, TARGET_LENGTHS, reduction=r),
    lambda lp, r: F.ctc_loss(lp, PADDED, (6, 6, 6), (3, 2, 4), reduction=r),  # lengths as tuples
    lambda lp, r: F.ctc_loss(lp, PADDED.clamp(max=3), INPUT_LENGTHS, TARGET_LENGTHS, blank=4, reduction=r),
    lambda lp, r: F.ctc_loss(lp, torch.tensor([[1, 1, 1]] * 3), (3, 3, 6), (3, 3, 3), reduction=r,
                             zero_infinity=True),  # samples 0 and 1 cannot be aligned: loss and gradient 0
    lambda lp, r: F.ctc_loss(log_probs=lp, targets=PADDED, input_lengths=INPUT_LENGTHS,
                             target_lengths=TARGET_LENGTHS, reduction=r),
    lambda lp, r: torch.ctc_loss(lp, PADDED, INPUT_LENGTHS, TARGET_LENGTHS, 0, REDUCTIONS.index(r) % 3),
])
def test_batched(call, reduction):
    """log_softmax in the graph, as CTC requires: torch's gradient and the true one agree there."""
    check_op(lambda x: call(x.log_softmax(2), reduction), LOGITS)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("lengths", [
    ((6,), (3,)), (torch.tensor(6), torch.tensor(3)), (torch.tensor([5]), torch.tensor([3])),
])
def test_unbatched(lengths, reduction):
    check_op(lambda x: F.ctc_loss(x.log_softmax(1), PADDED[0, :3], *lengths, reduction=reduction), LOGITS[:, 0])


@pytest.mark.parametrize("call", [
    lambda x: torch.ctc_loss(x.log_softmax(2), PADDED, INPUT_LENGTHS, TARGET_LENGTHS),  # torch's default: 'none'
    lambda x: F.ctc_loss(x.log_softmax(2), PADDED, INPUT_LENGTHS, TARGET_LENGTHS) * x.sum(),
])
@pytest.mark.parametrize("x", [LOGITS, LOGITS.double(), LOGITS.transpose(0, 1).contiguous().transpose(0, 1)])
def test_forms(call, x):
    check_op(call, x, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_gradient_wrt_log_probs_themselves_is_the_true_derivative(reduction):
    """On a log_probs leaf, torchtrace's gradient is the derivative of the value (finite differences agree);
    torch's kernel returns exp(log_probs) more on every counted frame (pytorch issues #52241, #181534)."""
    log_probs = LOGITS.log_softmax(2).double()

    def loss(lp):
        return F.ctc_loss(lp, PADDED, INPUT_LENGTHS, TARGET_LENGTHS, reduction=reduction)

    assert tt.gradcheck(loss, log_probs)
    ours = tt.tracer(log_probs, requires_grad=True)
    loss(ours).sum().backward()
    theirs = log_probs.clone().requires_grad_(True)
    loss(theirs).sum().backward()
    frames = (torch.arange(STEPS).reshape(STEPS, 1) < INPUT_LENGTHS).unsqueeze(2)
    per_sample = {"none": torch.ones(3), "sum": torch.ones(3), "mean": 1 / (3 * TARGET_LENGTHS.clamp(min=1))}
    offset = log_probs.exp() * frames * per_sample[reduction].double().reshape(1, 3, 1)
    torch.testing.assert_close(theirs.grad - ours.grad, offset)


def test_impossible_alignment_without_zero_infinity_gives_nan_as_torch():
    log_probs = LOGITS[:3].log_softmax(2)
    ours = tt.tracer(log_probs, requires_grad=True)
    loss = F.ctc_loss(ours, torch.tensor([[1, 1, 1]] * 3), (3, 3, 3), (3, 1, 3), reduction="none")
    assert math.isinf(loss[0].item()) and math.isfinite(loss[1].item())
    loss.sum().backward()
    assert ours.grad[:, [0, 2]].isnan().all() and ours.grad[:, 1].isfinite().all()


def test_longer_sequences_and_a_module():
    torch.manual_seed(1)
    logits = torch.randn(40, 2, 8)
    targets, lengths = torch.randint(1, 8, (2, 15)), torch.tensor([15, 9])
    ours, theirs = nn.CTCLoss(blank=0, zero_infinity=True), torch.nn.CTCLoss(blank=0, zero_infinity=True)
    assert isinstance(ours, nn.Module) and repr(ours) == repr(theirs)
    check_op(lambda x: ours(x.log_softmax(2), targets, torch.tensor([40, 31]), lengths), logits, rtol=1e-4,
             atol=1e-5, gradcheck=False)
    x = tt.tracer(logits, requires_grad=True)
    frames = torch.tensor([40, 31])
    out = ours(x.log_softmax(2), targets, frames, lengths)
    torch.testing.assert_close(out.as_subclass(torch.Tensor), theirs(logits.log_softmax(2), targets, frames, lengths))
    assert out.grad_fn.module is ours


def test_second_derivatives_are_refused():
    x = tt.tracer(LOGITS, requires_grad=True)
    loss = F.ctc_loss(x.log_softmax(2), PADDED, INPUT_LENGTHS, TARGET_LENGTHS)
    with pytest.raises(tt.UnsupportedOperationError, match="ctc_loss: second derivatives .* are not supported"):
        tt.grad(loss, [x], create_graph=True)
