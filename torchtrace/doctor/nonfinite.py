"""Why a pointwise rule made the first NaN or Inf, read from the values at the op: a log of 0, a root of a negative,
a 0/0, an exp or a power past the dtype's range, a gradient formula at its singular point or past the range.

Each cause returns (what happened, what to change) when the values show it and None otherwise (causes.py tries
the next one). Messages count the elements at fault and quote the numbers that made the value.
"""
import math
from typing import Any, Callable, List, Optional

import torch

from torchtrace.autograd.plain import plain_torch
from torchtrace.doctor.causes import AtOp, Explained, add_cause, at_backward, at_forward, cause_of
from torchtrace.doctor.values import all_finite, count, describe, has_inf, has_nan, tensors_in

LOG_ADVICE = ("keep the argument away from 0: x.clamp_min(1e-12).log(), or use the stable form "
              "(F.log_softmax, F.logsigmoid, F.binary_cross_entropy_with_logits, torch.log1p)")
SQRT_ADVICE = ("add a small constant inside the root, torch.sqrt(x + 1e-12), or clamp it, x.clamp_min(1e-12).sqrt() "
               "(a norm or a distance at exactly 0 has this problem too)")
DIV_ADVICE = "add a small constant to the denominator, or mask the division where it is 0 (torch.where)"
STANDARDISE_ADVICE = ("add a small eps to the variance inside the root: (x - mean) / torch.sqrt(var + 1e-5) (an eps "
                      "added after the root keeps the values finite but not the gradient of sqrt at 0), or use "
                      "F.layer_norm")
MASK_ADVICE = ("make sure every row keeps at least one unmasked entry (a token can always attend to itself), or fill "
               "masked scores with torch.finfo(dtype).min instead of -inf")


def range_of(dtype: torch.dtype) -> str:
    """"float16's range (max 65504)"."""
    return f"{str(dtype).replace('torch.', '')}'s range (max {torch.finfo(dtype).max:.6g})"


def overflow_advice(dtype: torch.dtype) -> str:
    if torch.finfo(dtype).bits < 32:
        return ("compute this op in float32 (torch.autocast keeps such ops in float32; or .float() around it), "
                "or scale the values down before it")
    return "scale the values down before this op (normalise the activations, lower the learning rate or the init)"


def _largest(tensors: List[torch.Tensor]) -> float:
    with plain_torch():
        return max((float(t.detach().abs().max()) for t in tensors if t.numel()), default=0.0)


def _double(value: Any, like: torch.Tensor) -> torch.Tensor:
    with plain_torch():
        if isinstance(value, torch.Tensor):
            return value.detach().as_subclass(torch.Tensor).double()
        return torch.tensor(float(value), dtype=torch.float64, device=like.device)


def _number(p: torch.Tensor) -> str:
    """An exponent as a reader wrote it: 3, 0.5, or the range of a tensor of them."""
    with plain_torch():
        if p.numel() == 1 or bool((p == p.flatten()[0]).all()):
            return f"{float(p.flatten()[0]):g}"
        return f"from {float(p.min()):g} to {float(p.max()):g}"


# ------------------------------------------------------------------------------------------------- forward

def _log(at: AtOp) -> Optional[Explained]:
    x = at.inputs[0]
    zeros, negatives = count(x == 0), count(x < 0)
    parts = ([f"log of 0 is -inf ({zeros} of {x.numel()} inputs are exactly 0)"] if zeros else []) + \
            ([f"log of a negative number is NaN ({negatives} inputs are negative)"] if negatives else [])
    return ("; ".join(parts), LOG_ADVICE) if parts else None


def _sqrt(at: AtOp) -> Optional[Explained]:
    x = at.inputs[0]
    negatives, zeros = count(x < 0), count(x == 0)
    if negatives:
        return (f"{at.rule.lower()} of a negative number is NaN ({negatives} of {x.numel()} inputs are negative; "
                f"{describe(x)})", "clamp the argument at 0 first (x.clamp_min(0)), or find why it goes negative "
                "(e.g. a variance E[x^2]-E[x]^2 that rounding made negative)")
    if zeros and at.rule == "Rsqrt":
        return f"rsqrt of 0 is inf ({zeros} of {x.numel()} inputs are exactly 0)", SQRT_ADVICE
    return None


def _places(mask: torch.Tensor, limit: int = 3) -> str:
    """"index 1" / "indices (0, 2), (1, 2)": where a mask is set, the first few."""
    with plain_torch():
        where = [tuple(int(i) for i in row) for row in torch.nonzero(mask)[:limit]]
    shown = ", ".join(str(w[0]) if len(w) == 1 else str(w) for w in where)
    return f"{'index' if len(where) == 1 else 'indices'} {shown}" if where else ""


def _all_over_broadcast(mask: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """mask reduced with all() to `shape` over the dimensions that `shape` broadcasts along."""
    full = torch.broadcast_shapes(mask.shape, shape)
    padded = (1,) * (len(full) - len(shape)) + tuple(shape)
    dims = [i for i, (f, s) in enumerate(zip(full, padded)) if s == 1 and f != 1]
    mask = mask.broadcast_to(full)
    return (mask.all(dim=dims, keepdim=True) if dims else mask).reshape(shape)


def _div(at: AtOp) -> Optional[Explained]:
    a, b = at.named.get("a"), at.named.get("b")
    if not isinstance(b, torch.Tensor):
        return (f"division by {b} gave a non-finite result", DIV_ADVICE) if b == 0 else None
    with plain_torch():
        zero_b = b == 0
        if not bool(zero_b.any()):
            return None
        numerator = _double(a, b)
        both = zero_b & (numerator == 0) if numerator.shape == b.shape or numerator.dim() == 0 else None
        if numerator.shape != b.shape and numerator.dim() > 0:  # (x - mean) / std: the numerator is broadcast
            both = zero_b & _all_over_broadcast(numerator == 0, b.shape)
    where, zeros = _places(zero_b), count(zero_b)
    if both is not None and count(both) and numerator.numel() > b.numel():  # a statistic per feature divides
        return (f"0/0 = NaN: the denominator is exactly 0 at {_places(both)} (of shape {tuple(b.shape)}) where every "
                "numerator is 0 too; this is what (x - mean) / std gives where all values are equal: variance 0 and "
                "eps 0 there", STANDARDISE_ADVICE)
    if both is not None and count(both):
        return (f"division by 0: {zeros} denominators are exactly 0 (at {where}), {count(both)} of them with "
                "numerator 0 (0/0 = NaN)", DIV_ADVICE)
    return f"division by 0: {zeros} denominators are exactly 0 (at {where}), their numerators not", DIV_ADVICE


def _exp(at: AtOp) -> Optional[Explained]:
    x = at.inputs[0]
    limit = math.log(torch.finfo(x.dtype).max)
    with plain_torch():
        over = count(x > limit)
        largest = float(x.max())
    if not over:
        return None
    return (f"exp overflowed {range_of(x.dtype)} above {limit:.1f}: {over} inputs are larger (the largest is "
            f"{largest:.3g})", "subtract the maximum before exponentiating (torch.logsumexp and F.softmax do), or "
            "clamp the input")


def _softmax(at: AtOp) -> Optional[Explained]:
    x = at.inputs[0]
    dim = at.named.get("dim", -1) if isinstance(at.named.get("dim", -1), int) else -1
    with plain_torch():
        full_rows = (x == float("-inf")).all(dim=dim)
        rows = count(full_rows)
    if rows:
        return (f"{rows} of {full_rows.numel()} rows have every entry -inf (a mask that covers a whole row): "
                "softmax of such a row is 0/0 = NaN", MASK_ADVICE)
    return None


def _pow_forward(at: AtOp) -> Optional[Explained]:
    base, exponent = at.named.get("a"), at.named.get("b")
    out = at.outputs[0] if at.outputs else None
    like = base if isinstance(base, torch.Tensor) else exponent
    if out is None or not isinstance(like, torch.Tensor):
        return None
    with plain_torch():
        a, p = _double(base, like), _double(exponent, like)
        exact = a ** p
        fractional = count((a < 0) & (p != p.round()))
        zero_negative = count((a == 0) & (p < 0))
        over = count(torch.isfinite(exact) & (exact.abs() > torch.finfo(out.dtype).max))
        largest = float(a.abs().max())
    parts = []
    if fractional:
        parts.append(f"a negative base to a fractional power is NaN ({fractional} bases are negative, exponent "
                     f"{_number(p)})")
    if zero_negative:
        parts.append(f"0 to a negative power is inf ({zero_negative} bases are 0, exponent {_number(p)})")
    if over:
        parts.append(f"x ** {_number(p)} overflowed {range_of(out.dtype)}: {over} results are larger (the largest "
                     f"|x| is {largest:.4g}, and {largest:.4g} ** {_number(p)} = {largest ** float(p.max()):.3g}); "
                     "no base is 0")
        return "; ".join(parts), overflow_advice(out.dtype)
    return ("; ".join(parts), "clamp the base (x.clamp_min(1e-12)) or use an integer exponent") if parts else None


def _overflowed(at: AtOp) -> Optional[Explained]:
    """Any rule: an Inf (and no NaN) out of finite inputs is an overflow of the result's dtype."""
    outs = at.outputs
    if not outs or has_nan(outs) or not has_inf(outs) or not all_finite(at.inputs):
        return None
    dtype = next(t.dtype for t in outs if has_inf(t))
    with plain_torch():
        infinite = sum(count(torch.isinf(t)) for t in outs)
    return (f"{at.rule} overflowed {range_of(dtype)}: {infinite} results are +-inf from finite inputs (the largest "
            f"|input| is {_largest(at.inputs):.3g})", overflow_advice(dtype))


for _rule, _cause in (("Log", _log), ("Log2", _log), ("Log10", _log), ("Sqrt", _sqrt), ("Rsqrt", _sqrt),
                      ("Div", _div), ("Exp", _exp), ("Softmax", _softmax), ("LogSoftmax", _softmax),
                      ("Pow", _pow_forward), ("Rpow", _pow_forward)):
    add_cause("forward", _cause, rule=_rule)
add_cause("forward", _overflowed)


# ------------------------------------------------------------------------------------------------ backward

def _at_zero(what: str, advice: str) -> Callable[[AtOp], Optional[Explained]]:
    """A formula singular at 0: the cause when some saved value is 0 (or so close that 1/x overflows)."""
    def cause(at: AtOp) -> Optional[Explained]:
        saved = at.inputs
        zeros = sum(count(t == 0) for t in saved)
        with plain_torch():
            tiny = sum(count((t != 0) & (t.abs() < 1 / torch.finfo(t.dtype).max)) for t in saved)
        if not zeros and not tiny:
            return None
        near = f" and {tiny} so close to 0 that 1/x overflows" if tiny else ""
        return (f"{what}: {zeros} saved values are exactly 0{near} ({'; '.join(describe(t) for t in saved)})",
                advice)
    return cause


def _pow_backward(at: AtOp) -> Optional[Explained]:
    """d a^p/da = p a^(p-1) g, computed in float64 on what Pow saved and the gradient it received."""
    if len(at.saved) < 2 or not at.incoming or not isinstance(at.incoming[0], torch.Tensor):
        return None
    base, exponent = at.saved[0], at.saved[1]
    out = next((t for t in at.outputs if has_inf(t) or has_nan(t)), None)
    if out is None or not isinstance(base, torch.Tensor):
        return None
    with plain_torch():
        a, p, g = _double(base, base), _double(exponent, base), at.incoming[0].detach().double()
        singular = count((a == 0) & (p < 1) & (p != 0))
        fractional = count((a < 0) & (p != p.round()))
        exact = p * a ** (p - 1) * g
        over = count(torch.isfinite(exact) & (exact.abs() > torch.finfo(out.dtype).max))
        largest_g = float(g.abs().max())
        largest = float(exact[torch.isfinite(exact)].abs().max()) if over else 0.0
    parts = []
    if singular:
        parts.append(f"d x^p/dx = p x^(p-1) is inf at x = 0 with p = {_number(p)} < 1 ({singular} of x are 0)")
    if fractional:
        parts.append(f"x^(p-1) of a negative x with fractional p = {_number(p)} is NaN ({fractional} of x)")
    if over and not singular:
        parts.append(f"p x^(p-1) g with p = {_number(p)} overflowed {range_of(out.dtype)}: {over} gradients are "
                     f"larger (up to {largest:.3g}; |x| up to {_largest([a]):.4g}, incoming |g| up to "
                     f"{largest_g:.3g}); no x is 0")
        return "; ".join(parts), overflow_advice(out.dtype)
    return ("; ".join(parts), SQRT_ADVICE) if parts else None


def _gradient_overflowed(at: AtOp) -> Optional[Explained]:
    """Any rule: an Inf (and no NaN) out of a finite gradient and finite saved values is an overflow."""
    outs = at.outputs
    if not outs or has_nan(outs) or not has_inf(outs) or not all_finite(at.inputs):
        return None
    dtype = next(t.dtype for t in outs if has_inf(t))
    zeros = sum(count(t == 0) for t in at.inputs)
    return (f"the gradient overflowed {range_of(dtype)}: it received gradients up to "
            f"{_largest(tensors_in(at.incoming)):.3g} and the saved values reach {_largest(at.inputs):.3g}"
            f"{f' ({zeros} saved values are 0)' if zeros else '; no saved value is 0'}", overflow_advice(dtype))


for _rule, _cause in (
        ("Sqrt", _at_zero("d sqrt(x)/dx = 1/(2 sqrt x) is inf at x = 0", SQRT_ADVICE)),
        ("Log", _at_zero("d ln(x)/dx = 1/x is inf at x = 0", LOG_ADVICE)),
        ("Div", _at_zero("d(a/b)/db = -a/b^2 is not finite where b = 0", DIV_ADVICE)),
        ("Pow", _pow_backward),
        ("Norm", _at_zero("d |x|/dx = x/|x| is 0/0 where the norm is 0", SQRT_ADVICE)),
        ("LinalgVectorNorm", _at_zero("d |x|/dx = x/|x| is 0/0 where the norm is 0", SQRT_ADVICE))):
    add_cause("backward", _cause, rule=_rule)
add_cause("backward", _gradient_overflowed)


def forward_cause(rule: type, args: tuple, kwargs: dict, result: Any) -> Explained:
    """Why `rule`'s forward made a NaN or Inf from these inputs."""
    return cause_of(at_forward(rule, args, kwargs, result))


def backward_cause(node: Any, grads: List[Any], result: tuple) -> Explained:
    """Why `node`'s backward made a NaN or Inf from the finite gradient `grads`, from what it saved."""
    return cause_of(at_backward(node, grads, result))
