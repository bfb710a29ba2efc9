"""Connectionist Temporal Classification loss (F.ctc_loss) and CTCLoss: the forward-backward algorithm.

The math (Graves et al. 2006). For one sample: log-probabilities lp[t, c] for t < T, a label sequence
l_1..l_L, and the extended sequence l' = (blank, l_1, blank, l_2, ..., l_L, blank) of length S = 2L + 1.
A path visits one position s of l' per frame, starting at s = 0 or 1, ending at S - 1 or S - 2, and each step
stays (s), moves one on (s - 1 -> s), or skips a blank (s - 2 -> s, allowed when l'_s is not blank and
l'_s != l'_{s-2}). p = sum over paths of prod_t exp(lp[t, l'_{s_t}]), and the loss is -log p.

  alpha_t(s) = log of the summed probability of path prefixes ending at (t, s), frame t's factor included:
      alpha_0(0) = lp[0, blank], alpha_0(1) = lp[0, l_1], alpha_0(s) = -inf otherwise
      alpha_t(s) = lp[t, l'_s] + logsumexp(alpha_{t-1}(s), alpha_{t-1}(s-1), alpha_{t-1}(s-2) if skip allowed)
  beta_t(s)  = the same for path suffixes starting at (t, s), frame t's factor included:
      beta_{T-1}(S-1) = lp[T-1, blank], beta_{T-1}(S-2) = lp[T-1, l_L], -inf otherwise
      beta_t(s) = lp[t, l'_s] + logsumexp(beta_{t+1}(s), beta_{t+1}(s+1), beta_{t+1}(s+2) if that skip is allowed)
  log p = logsumexp(alpha_{T-1}(S-1), alpha_{T-1}(S-2))

Every path through (t, s) has probability exp(alpha_t(s) + beta_t(s) - lp[t, l'_s]) summed over them (frame t
counted once), and d p / d lp[t, c] is the summed probability of the paths whose frame t emits c. So

  d(-log p) / d lp[t, c] = -sum_{s: l'_s = c} exp(alpha_t(s) + beta_t(s) - lp[t, c] + (-log p)),  0 for t >= T.

That is the true derivative (it agrees with finite differences). torch's kernel returns exp(lp) plus it:
the derivative with respect to the logits *before* a log_softmax (pytorch issues #52241, #181534). The two
agree exactly once log_probs come from log_softmax in the graph, as CTC requires; on raw log_probs
torchtrace's gradient is the derivative of the value F.ctc_loss returns, torch's is not.

First derivatives only: a backward with create_graph=True through ctc_loss is refused, as torch refuses it.
Reductions: 'none' (N,), 'sum', 'mean' = mean over the batch of loss_n / max(L_n, 1). zero_infinity zeroes
the loss and gradient of impossible samples (p = 0); without it their gradient is NaN, as torch's.
"""
from typing import Any, List

import torch
import torch.nn.functional as F

from torchtrace.autograd.function import Function, register
from torchtrace.errors import UnsupportedOperationError
from torchtrace.nn.loss import aten_twin
from torchtrace.nn.module import Module

NEG_INF = float("-inf")


def _lengths(lengths: Any, n: int) -> List[int]:
    """Input or target lengths (a tensor, a tuple/list of ints, or one int) as a list of n ints."""
    values = torch.as_tensor(lengths).reshape(-1).tolist()
    return values * n if len(values) == 1 and n > 1 else values


def _extended_labels(targets: torch.Tensor, target_lengths: List[int], blank: int) -> torch.Tensor:
    """(N, 2 max(L) + 1): each sample's l' = (blank, l_1, blank, ..., l_L, blank), padded with blanks."""
    n = len(target_lengths)
    width = 2 * max(target_lengths, default=0) + 1
    ext = torch.full((n, width), blank, dtype=torch.long, device=targets.device)
    offset = 0
    for i, length in enumerate(target_lengths):
        if targets.dim() == 2:  # padded (N, S)
            labels = targets[i, :length]
        else:  # concatenated (sum L,), or one unbatched sequence
            labels = targets[offset:offset + length]
            offset += length
        ext[i, 1:2 * length + 1:2] = labels.long()
    return ext


def _shift(t: torch.Tensor, k: int, fill: float = NEG_INF) -> torch.Tensor:
    """t moved k places along the last dim (k > 0: towards higher s), the vacated places set to `fill`."""
    width = t.shape[-1]
    if k > 0:
        return F.pad(t, (k, 0), value=fill)[..., :width]
    return F.pad(t, (0, -k), value=fill)[..., -k:]


def forward_backward(lp: torch.Tensor, ext: torch.Tensor, input_lengths: List[int], target_lengths: List[int],
                     blank: int) -> tuple:
    """(log alpha, log beta, lp[t, l'_s], log p): (T, N, S) tensors per the recursions above, and log p (N,)."""
    steps, n = lp.shape[0], lp.shape[1]
    width = ext.shape[1]
    s = torch.arange(width, device=lp.device)
    ext_len = torch.tensor([2 * length + 1 for length in target_lengths], device=lp.device).reshape(n, 1)
    valid = s < ext_len  # (N, S)
    skip = (s >= 2) & (ext != blank) & (ext != _shift(ext, 2, -1))  # s - 2 -> s allowed (-1: no label)
    skip_next = _shift(skip.long(), -2, 0).bool()  # s -> s + 2 allowed
    emit = lp.gather(2, ext.unsqueeze(0).expand(steps, n, width))  # lp[t, n, l'_s]
    ends = torch.tensor([t - 1 for t in input_lengths], device=lp.device).reshape(n, 1)
    last = (s == ext_len - 1) | ((s == ext_len - 2) & (ext_len > 1))
    no_path = torch.full_like(emit[0], NEG_INF)

    alphas = [torch.where(s < 2, emit[0], no_path)]
    for t in range(1, steps):
        prev = alphas[-1]
        paths = torch.stack([prev, _shift(prev, 1), torch.where(skip, _shift(prev, 2), no_path)])
        alphas.append(torch.where(valid, emit[t] + torch.logsumexp(paths, 0), no_path))
    alpha = torch.stack(alphas)

    betas = [no_path] * steps
    nxt = no_path
    for t in range(steps - 1, -1, -1):
        paths = torch.stack([nxt, _shift(nxt, -1), torch.where(skip_next, _shift(nxt, -2), no_path)])
        inside = torch.where(valid, emit[t] + torch.logsumexp(paths, 0), no_path)
        start = torch.where(last, emit[t], no_path)
        nxt = torch.where(ends == t, start, torch.where(ends > t, inside, no_path))
        betas[t] = nxt
    beta = torch.stack(betas)

    final = alpha.gather(0, ends.clamp(min=0).reshape(1, n, 1).expand(1, n, width))[0]
    log_p = torch.logsumexp(torch.where(last, final, no_path), 1)
    return alpha, beta, emit, log_p


@register(F.ctc_loss)
class CtcLoss(Function):
    """l = -log p(target | lp)  ->  dlp[t, c] = -g sum_{s: l'_s = c} exp(alpha_t(s) + beta_t(s) - lp[t, c] + l),
    p summed over alignments, alpha and beta the forward-backward recursions (module docstring)"""

    @staticmethod
    def forward(ctx, log_probs, targets, input_lengths, target_lengths, blank=0, reduction="mean",
                zero_infinity=False):
        batched = log_probs.dim() == 3
        n = log_probs.shape[1] if batched else 1
        ctx.input_lengths, ctx.target_lengths = _lengths(input_lengths, n), _lengths(target_lengths, n)
        ctx.ext = _extended_labels(targets, ctx.target_lengths, blank)
        ctx.blank, ctx.reduction, ctx.zero_infinity, ctx.batched = blank, reduction, zero_infinity, batched
        ctx.save_for_backward(log_probs)
        return F.ctc_loss(log_probs, targets, input_lengths, target_lengths, blank, reduction, zero_infinity)

    @staticmethod
    def backward(ctx, g):
        if not torch.is_grad_enabled():
            return first_derivative(ctx, g)
        with torch.no_grad():  # create_graph=True: the gradient exists, but it cannot be differentiated again
            grad, *rest = first_derivative(ctx, g)
        return (FirstDerivativeOnly.apply(grad, ctx.saved_tensors[0], g, CTC_SECOND), *rest)


CTC_SECOND = ("torch.nn.functional.ctc_loss: second derivatives (differentiating its gradient again) are not "
              "supported (torch has none either; the log-space recursions' -inf paths would give NaN) — take the CTC "
              "loss out of the part of the graph that needs second derivatives.")


class FirstDerivativeOnly(Function):
    """A gradient computed under create_graph=True whose own derivative is refused with `message`
    (ops whose torch gradient is not differentiable again)"""

    @staticmethod
    def forward(ctx, gradient, source, grad_output, message):
        ctx.message = message
        return gradient

    @staticmethod
    def backward(ctx, g):
        raise UnsupportedOperationError(ctx.message)


def first_derivative(ctx, g) -> tuple:
    """(dl/dlog_probs, None, None, None): the forward-backward recursions' posterior, scaled by g."""
    (log_probs,) = ctx.saved_tensors
    lp = log_probs if ctx.batched else log_probs.unsqueeze(1)
    steps, n, classes = lp.shape
    alpha, beta, emit, log_p = forward_backward(lp, ctx.ext, ctx.input_lengths, ctx.target_lengths, ctx.blank)
    through = alpha + beta
    reached = through > NEG_INF  # also keeps -inf - (-inf) out where lp = -inf
    share = torch.where(reached, torch.exp(torch.where(reached, through - emit, 0.0) - log_p.reshape(1, n, 1)),
                        0.0)
    grad = torch.zeros_like(lp).scatter_add(2, ctx.ext.unsqueeze(0).expand(steps, n, -1), share)
    impossible = torch.isinf(log_p)
    frames = torch.arange(steps, device=lp.device).reshape(steps, 1) < torch.tensor(ctx.input_lengths,
                                                                                    device=lp.device)
    fill = 0.0 if ctx.zero_infinity else float("nan")  # torch: NaN for an impossible sample's frames
    grad = torch.where((impossible & frames).unsqueeze(2), fill, -grad)
    grad = grad * _sample_scale(g, ctx.reduction, ctx.target_lengths, n).to(lp.dtype).reshape(1, n, 1)
    return (grad if ctx.batched else grad.squeeze(1)), None, None, None


def _sample_scale(g: torch.Tensor, reduction: str, target_lengths: List[int], n: int) -> torch.Tensor:
    """d(reduced loss) / d(loss_n): g per sample ('none'), g ('sum'), g / (N max(L_n, 1)) ('mean')."""
    if reduction == "none":
        return g.reshape(n)
    if reduction == "sum":
        return g.expand(n)
    divisor = torch.tensor([max(length, 1) * n for length in target_lengths], dtype=g.dtype, device=g.device)
    return g / divisor


aten_twin("TorchCtcLoss", CtcLoss, torch.ctc_loss, "log_probs targets input_lengths target_lengths blank reduction "
          "zero_infinity")


class CTCLoss(Module, torch.nn.CTCLoss):
    """The negative log-likelihood of a label sequence summed over all its alignments to the input frames."""
