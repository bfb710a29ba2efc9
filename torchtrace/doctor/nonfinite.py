"""Why a rule made the first NaN or Inf: the forward's cause from its inputs, the backward's from what it saved.

Each explainer returns (what happened, what to change); unknown rules get a general account of their
inputs. Messages count the elements at fault, so a reader can see which inputs made the value.
"""
import math
from typing import Any, Callable, Dict, List, Tuple

import torch

from torchtrace.autograd.plain import plain_torch
from torchtrace.doctor.values import count, describe, tensors_in

Explained = Tuple[str, str]

LOG_ADVICE = ("keep the argument away from 0: x.clamp_min(1e-12).log(), or use the stable form "
              "(F.log_softmax, F.logsigmoid, F.binary_cross_entropy_with_logits, torch.log1p)")
SQRT_ADVICE = ("add a small constant inside the root, torch.sqrt(x + 1e-12), or clamp it, x.clamp_min(1e-12).sqrt() "
               "(a norm or a distance at exactly 0 has this problem too)")
DIV_ADVICE = "add a small constant to the denominator, or mask the division where it is 0 (torch.where)"
MASK_ADVICE = ("make sure every row keeps at least one unmasked entry (a token can always attend to itself), or fill "
               "masked scores with torch.finfo(dtype).min instead of -inf")


def _first(args: Any) -> torch.Tensor:
    return tensors_in(args)[0]


def _forward_log(args: Any, result: Any) -> Explained:
    x = _first(args)
    zeros, negatives = count(x == 0), count(x < 0)
    parts = ([f"log of 0 is -inf ({zeros} of {x.numel()} inputs are exactly 0)"] if zeros else []) + \
            ([f"log of a negative number is NaN ({negatives} inputs are negative)"] if negatives else [])
    return "; ".join(parts) or f"log of its input ({describe(x)})", LOG_ADVICE


def _forward_sqrt(args: Any, result: Any) -> Explained:
    x = _first(args)
    negatives = count(x < 0)
    return f"sqrt of a negative number is NaN ({negatives} of {x.numel()} inputs are negative; {describe(x)})", \
        "clamp the argument at 0 first (x.clamp_min(0)), or find why it goes negative (e.g. a variance E[x^2]-E[x]^2 " \
        "that rounding made negative)"


def _forward_div(args: Any, result: Any) -> Explained:
    tensors = tensors_in(args)
    b = tensors[-1] if len(tensors) > 1 or not isinstance(args[0], torch.Tensor) else None
    if b is None:
        return f"division by a number gave a non-finite result ({describe(tensors[0])})", DIV_ADVICE
    a = tensors[0] if len(tensors) > 1 else None
    with plain_torch():
        zero_b = b == 0
        both = count(zero_b & (a == 0)) if a is not None and a.shape == b.shape else 0
    message = f"division by 0: {count(zero_b)} denominators are exactly 0"
    return message + (f", {both} of them with numerator 0 (0/0 = NaN)" if both else ""), DIV_ADVICE


def _forward_exp(args: Any, result: Any) -> Explained:
    x = _first(args)
    limit = math.log(torch.finfo(x.dtype).max)
    with plain_torch():
        over = count(x > limit)
        largest = float(x.max())
    return (f"exp overflows {x.dtype} above {limit:.1f}: {over} inputs are larger (the largest is {largest:.3g})",
            "subtract the maximum before exponentiating (torch.logsumexp and F.softmax do), or clamp the input")


def _forward_softmax(args: Any, result: Any) -> Explained:
    x = _first(args)
    dim = next((a for a in args[1:] if isinstance(a, int)), -1)
    with plain_torch():
        full_rows = (x == float("-inf")).all(dim=dim)
        rows = count(full_rows)
    if rows:
        return (f"{rows} of {full_rows.numel()} rows have every entry -inf (a mask that covers a whole row): "
                "softmax of such a row is 0/0 = NaN", MASK_ADVICE)
    return f"softmax of non-finite scores ({describe(x)})", "find where the scores stop being finite"


def _forward_pow(args: Any, result: Any) -> Explained:
    base = _first(args)
    return (f"a power of a negative base with a fractional exponent is NaN, and 0 to a negative power is inf "
            f"(base: {describe(base)})", "clamp the base (x.clamp_min(1e-12)) or use an integer exponent")


FORWARD: Dict[str, Callable[[Any, Any], Explained]] = {
    "Log": _forward_log, "Log2": _forward_log, "Log10": _forward_log, "Sqrt": _forward_sqrt, "Rsqrt": _forward_sqrt,
    "Div": _forward_div, "Exp": _forward_exp, "Softmax": _forward_softmax, "LogSoftmax": _forward_softmax,
    "Pow": _forward_pow,
}


def forward_cause(rule: str, args: Any, result: Any) -> Explained:
    """Why `rule`'s forward made a NaN or Inf from these inputs."""
    explain = FORWARD.get(rule)
    if explain is not None:
        return explain(args, result)
    inputs = "; ".join(f"input {i}: {describe(t)}" for i, t in enumerate(tensors_in(args)))
    out = tensors_in(result)
    dtype = out[0].dtype if out else torch.float32
    return (f"the result left the range of {dtype} (largest finite {torch.finfo(dtype).max:.3g}) or is undefined "
            f"at these inputs ({inputs})",
            "lower the learning rate or the input scale, normalise the activations, or compute in float64 to see "
            "whether it is an overflow")


def _backward_at_zero(what: str, advice: str) -> Callable[[List[torch.Tensor]], Explained]:
    def explain(saved: List[torch.Tensor]) -> Explained:
        zeros = sum(count(t == 0) for t in saved)
        with plain_torch():  # 1/x overflows for |x| below 1/max: as good as 0
            tiny = sum(count((t != 0) & (t.abs() < 1 / torch.finfo(t.dtype).max)) for t in saved)
        near = f" and {tiny} so close to 0 that 1/x overflows" if tiny else ""
        return (f"{what}: {zeros} saved values are exactly 0{near} ({'; '.join(describe(t) for t in saved)})",
                advice)
    return explain


BACKWARD: Dict[str, Callable[[List[torch.Tensor]], Explained]] = {
    "Sqrt": _backward_at_zero("d sqrt(x)/dx = 1/(2 sqrt x) is inf at x = 0", SQRT_ADVICE),
    "Log": _backward_at_zero("d ln(x)/dx = 1/x is inf at x = 0", LOG_ADVICE),
    "Div": _backward_at_zero("d(a/b)/db = -a/b^2 is not finite where b = 0", DIV_ADVICE),
    "Pow": _backward_at_zero("d x^p/dx = p x^(p-1) is inf at x = 0 when p < 1", SQRT_ADVICE),
    "Norm": _backward_at_zero("d |x|/dx = x/|x| is 0/0 where the norm is 0", SQRT_ADVICE),
    "LinalgVectorNorm": _backward_at_zero("d |x|/dx = x/|x| is 0/0 where the norm is 0", SQRT_ADVICE),
}


def backward_cause(rule: str, saved: List[torch.Tensor]) -> Explained:
    """Why `rule`'s backward made a NaN or Inf from a finite incoming gradient, from what it saved."""
    tensors = [t for t in saved if isinstance(t, torch.Tensor) and t.is_floating_point()]
    explain = BACKWARD.get(rule)
    if explain is not None:
        return explain(tensors)
    shown = "; ".join(describe(t) for t in tensors) or "nothing saved"
    return (f"its gradient formula is not finite at the saved values ({shown})",
            "find which saved value sits at a singular point of the formula (0 in a denominator, a root or a log) "
            "and keep the forward away from it")
