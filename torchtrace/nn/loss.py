"""Losses: the torch.nn.functional rules (math, forward, hand-derived backward), then the modules.

Every loss is an elementwise (or per-sample) loss l followed by a reduction: 'none' keeps l, 'sum'
adds it up, 'mean' divides the sum by a divisor (the element count, the summed class weights, or
the batch size for kl_div's 'batchmean'). So each backward is dl/d(input) times `_scale(g, ...)`.
Class and sample weights are constants, as in torch: a weight that requires a gradient is refused.
"""
import inspect
import sys
from typing import Any, Callable, Optional, Tuple

import torch
import torch.nn.functional as F
from torch.nn._reduction import get_enum as reduction_enum
from torch.overrides import TorchFunctionMode

from torchtrace.autograd.function import Function, register
from torchtrace.nn.module import Module


def _reduction(size_average: Optional[bool], reduce: Optional[bool], reduction: str) -> str:
    """The reduction string, honouring the deprecated size_average / reduce flags as torch does."""
    if size_average is None and reduce is None:
        return reduction
    if reduce is False:
        return "none"
    return "sum" if size_average is False else "mean"


def _scale(g: torch.Tensor, reduction: str, divisor: Any) -> torch.Tensor:
    """d(reduced loss) / d(elementwise loss): g for 'none' and 'sum', g / divisor for 'mean' and 'batchmean'."""
    return g / divisor if reduction in ("mean", "batchmean") else g


def _refuse_grad(ctx: Any, position: int, op: str, name: str) -> None:
    """Raise when the argument at `position` (a class / sample weight) requires a gradient."""
    if ctx.needs_input_grad[position]:
        raise _not_differentiable(op, name)


def _not_differentiable(op: str, name: str) -> RuntimeError:
    return RuntimeError(f"torchtrace's rule for {op} is not differentiable with respect to '{name}' (nor is torch's): "
                        f"pass {name}.detach().")


REDUCTIONS = ("none", "mean", "sum")  # torch's internal enum: 0, 1, 2
EPSILON = float(torch.tensor(1e-12, dtype=torch.float32))  # the 1e-12 torch's losses clamp with, a float32 in its
# kernels whatever the dtype (9.99999996e-13: binary_cross_entropy's gradient at p = 0 is -1.000000004e12 in float64)


def aten_twin(name: str, rule: type, target: Callable, parameters: str) -> type:
    """The rule of torch's internal spelling of a loss (torch.margin_ranking_loss, torch._C._nn.soft_margin_loss, ...):
    `rule`'s math and backward, with torch's positional `parameters` and reduction as its enum (default 0, 'none')."""
    names = parameters.split()

    def forward(ctx: Any, *args: Any, **kwargs: Any) -> Any:
        options = {"reduction": 0, **dict(zip(names, args)), **kwargs}
        if not isinstance(options["reduction"], str):
            options["reduction"] = REDUCTIONS[options["reduction"]]
        return rule.forward(ctx, **options)

    body = {"__doc__": f"{rule.__doc__} (torch's internal spelling)", "_param_names": names,
            "forward": staticmethod(forward), "__module__": rule.__module__}
    return register(target, rule=type(name, (rule,), body))


class _ArgumentsSeen(TorchFunctionMode):
    """Records the keyword arguments a torch function hands to __torch_function__ (and computes nothing)."""

    def __torch_function__(self, func: Callable, types: Any, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
        self.keywords = set(kwargs or {})
        return args[0]


def _drops_weight(fn: Callable) -> bool:
    """Whether fn leaves its `weight` out of what it hands to __torch_function__ (torch 2.13's F.l1_loss does): the rule
    then never sees the weight, and would silently compute the unweighted loss."""
    probe = torch.zeros(1)
    with _ArgumentsSeen() as seen:
        fn(probe, probe, weight=probe)
    return "weight" not in seen.keywords


DROPS_WEIGHT: set = set()  # losses that do not hand weight= on to __torch_function__ (torch 2.13's F.l1_loss)


def with_dropped_weight(fn: Callable, kwargs: dict) -> dict:
    """The keywords of a call of fn as __torch_function__ got them, with the caller's weight back where fn dropped
    it (for its rule, recording or not, and for tt.check's reference run of torch)."""
    if fn not in DROPS_WEIGHT or kwargs.get("weight") is not None:
        return kwargs
    weight = _dropped_weight(fn)
    return kwargs if weight is None else {**kwargs, "weight": weight}


def _dropped_weight(fn: Callable) -> Optional[torch.Tensor]:
    """The weight the caller gave fn, read from fn's frame a few calls up (fn -> handle_torch_function ->
    __torch_function__ -> ... -> this rule's forward), where fn did not hand it on. Frames of fn between are its own
    re-dispatch (tt.compile's mode calling it again): the first weight found is the caller's."""
    frame = sys._getframe(2)
    for _ in range(24):
        if frame is None:
            return None
        if frame.f_code is fn.__code__ and frame.f_locals.get("weight") is not None:
            weight = frame.f_locals["weight"]
            if getattr(weight, "requires_grad", False):
                raise _not_differentiable(fn.__name__, "weight")
            return weight
        frame = frame.f_back
    return None


def pointwise_loss(name: str, fn: Callable, math_line: str, slope: Callable, mean_over_weights: bool,
                   kernel: Callable) -> type:
    """Rule for a loss of d = input - target, elementwise times an optional weight w, then reduced.

    slope(d, **options) is dl/dd. 'mean' divides by the summed weights when mean_over_weights
    (mse_loss, l1_loss), else by the element count. kernel(input, target, reduction's enum, *options) is the torch
    function fn itself ends in for input and target of one shape, no weight and no legacy flags: the rule calls it
    directly there (the same kernel on the same tensors, without fn's Python around it).
    """
    defaults = {name: p.default for name, p in inspect.signature(fn).parameters.items()}  # read once, not per call
    names = list(defaults)
    weight_position = names.index("weight") if "weight" in names else None
    drops_weight = weight_position is not None and _drops_weight(fn)
    if drops_weight:
        DROPS_WEIGHT.add(fn)
    option_names = [name for name in names if name in ("beta", "delta")]  # what the slope reads besides d
    legacy = [names.index(flag) for flag in ("size_average", "reduce") if flag in names]

    def forward(ctx: Any, *args: Any, **kwargs: Any) -> Any:
        if drops_weight and len(args) <= weight_position:  # the caller's weight, which fn did not hand on
            kwargs = with_dropped_weight(fn, kwargs)
        arguments = {**defaults, **dict(zip(names, args)), **kwargs}
        input, target = arguments["input"], arguments["target"]
        if (len(args) + len(kwargs) <= len(names) and kwargs.keys() <= defaults.keys() - names[:len(args)]
                and all(arguments[names[k]] is None for k in legacy) and arguments.get("weight") is None and
                isinstance(input, torch.Tensor) and isinstance(target, torch.Tensor) and input.shape == target.shape):
            out = kernel(input, target, reduction_enum(arguments["reduction"]),
                         *[arguments[name] for name in option_names])
        else:  # fn checks the arguments (too many, unknown, missing) before anything is noted
            out = fn(*args, **kwargs)
        if weight_position is not None:
            _refuse_grad(ctx, weight_position, fn.__name__, "weight")
        ctx.reduction = _reduction(arguments.get("size_average"), arguments.get("reduce"), arguments["reduction"])
        ctx.options = {name: arguments[name] for name in option_names}
        ctx.save_for_backward(arguments["input"], arguments["target"], arguments.get("weight"))
        return out

    def backward(ctx: Any, g: Any) -> Any:
        input, target, weight = ctx.saved_tensors
        d = input - target
        local = slope(d, **ctx.options)
        divisor = d.numel()
        if weight is not None:
            local = local * weight
            divisor = weight.sum() if mean_over_weights else divisor
        grad = local * _scale(g, ctx.reduction, divisor)
        need_input, need_target = ctx.needs_input_grad[:2]
        return (grad if need_input else None), (-grad if need_target else None)

    body = {"__doc__": math_line, "_param_names": names, "forward_when_not_recording": drops_weight,
            "forward": staticmethod(forward), "backward": staticmethod(backward)}
    return register(fn, rule=type(name, (Function,), body))


def _smooth_l1_kernel(input: torch.Tensor, target: torch.Tensor, reduction: int, beta: float) -> torch.Tensor:
    """What F.smooth_l1_loss ends in: l1_loss's kernel for beta 0, else smooth_l1_loss's."""
    if beta == 0.0:
        return torch._C._nn.l1_loss(input, target, reduction)
    return torch._C._nn.smooth_l1_loss(input, target, reduction, beta)


pointwise_loss("MseLoss", F.mse_loss, "l = (x - t)^2  ->  dl/dx = 2 (x - t), dl/dt = -2 (x - t)",
               lambda d: 2 * d, mean_over_weights=True, kernel=torch._C._nn.mse_loss)
pointwise_loss("L1Loss", F.l1_loss, "l = |x - t|  ->  dl/dx = sign(x - t), dl/dt = -sign(x - t)",
               torch.sign, mean_over_weights=True, kernel=torch._C._nn.l1_loss)
pointwise_loss("SmoothL1Loss", F.smooth_l1_loss,
               "l = d^2 / 2b if |d| < b else |d| - b/2, d = x - t  ->  dl/dx = clamp(d / b, -1, 1), dl/dt = -dl/dx",
               lambda d, beta: torch.where(d.abs() < beta, d / beta, torch.sign(d)) if beta > 0 else torch.sign(d),
               mean_over_weights=False, kernel=_smooth_l1_kernel)  # (where, not clamp: no second derivative at
# |d| = b, as torch's)
pointwise_loss("HuberLoss", F.huber_loss,
               "l = d^2 / 2 if |d| <= delta else delta (|d| - delta/2), d = x - t  ->  dl/dx = clamp(d, -delta, delta)",
               lambda d, delta: torch.where(d.abs() < delta, d, delta * torch.sign(d)), mean_over_weights=False,
               kernel=torch._C._nn.huber_loss)


def _class_coefficients(x: torch.Tensor, target: torch.Tensor, weight: Optional[torch.Tensor], ignore_index: int,
                        smoothing: float, reduction: str) -> Tuple[torch.Tensor, Any]:
    """a[n, c], how much -log p[n, c] (or -x[n, c] for nll_loss) weighs in sample n's loss, and 'mean''s divisor.

    Class indices y: a = w_c ((1 - eps) [c = y_n] + eps / C), zero for samples with y_n = ignore_index;
    'mean' divides by the summed weights w_{y_n} of the counted samples (0 / 0 where they sum to 0: NaN, as torch).
    Class probabilities t: a = w_c ((1 - eps) t_nc + eps / C); 'mean' divides by the number of samples.
    """
    class_dim = 0 if x.dim() == 1 else 1
    n_classes = x.shape[class_dim]
    along_classes = [n_classes if d == class_dim else 1 for d in range(x.dim())]
    w = None if weight is None else weight.reshape(along_classes)
    if target.is_floating_point():
        a = target * (1 - smoothing) + smoothing / n_classes
        return (a if w is None else a * w), x.numel() // n_classes
    valid = target != ignore_index
    hot = target.unsqueeze(class_dim) == torch.arange(n_classes, device=x.device).reshape(along_classes)
    if 0 <= ignore_index < n_classes:  # else an ignored sample's row of `hot` is all False already
        hot = hot & valid.unsqueeze(class_dim)
    hot = hot.to(x.dtype)
    a = hot
    if smoothing:
        a = hot * (1 - smoothing) + valid.unsqueeze(class_dim).to(x.dtype) * (smoothing / n_classes)
    if w is not None:
        a, divisor = a * w, (hot * w).sum()
        if reduction == "mean":  # counted samples whose weights sum to 0: 0 / 0, NaN as torch (ignored ones stay 0)
            a = torch.where((hot != 0) & (divisor == 0), torch.nan, a)
    else:
        divisor = valid.sum()
    return a, divisor + (divisor == 0)  # every sample ignored: a is all zeros, avoid 0 / 0


def _per_sample_scale(g: torch.Tensor, reduction: str, divisor: Any, x: torch.Tensor) -> torch.Tensor:
    """_scale for per-sample losses: with 'none', g (one entry per sample) gains the class dimension back."""
    return g.unsqueeze(0 if x.dim() == 1 else 1) if reduction == "none" else _scale(g, reduction, divisor)


def _cross_entropy_kernels(ctx: Any, g: torch.Tensor, x: torch.Tensor, target: torch.Tensor,
                           weight: Optional[torch.Tensor]) -> torch.Tensor:
    """dx = g (p_n sum_c a_nc - a_n) for class indices without label smoothing, first order (no graph recorded), by
    the kernels torch autograd runs for it: nll_loss_backward (-w_{y_n} / the divisor at [n, y_n]) then log_softmax's
    backward (r - p sum_c r), on log p recomputed from x (torch's forward computes it the same way). Its bits, in
    half the time of the one-hot coefficients written out."""
    class_dim = 0 if x.dim() == 1 else 1
    log_p = torch.log_softmax(x, class_dim)
    reduction = REDUCTIONS.index(ctx.reduction)
    _, total_weight = torch.ops.aten.nll_loss_forward(log_p, target, weight, reduction, ctx.ignore_index)
    into_log_p = torch.ops.aten.nll_loss_backward(g, log_p, target, weight, reduction, ctx.ignore_index, total_weight)
    return torch.ops.aten._log_softmax_backward_data(into_log_p, log_p, class_dim, x.dtype)


@register(F.cross_entropy)
class CrossEntropy(Function):
    """l_n = -sum_c a_nc log p_nc, p_n = softmax(x_n)  ->  dx_n = g (p_n sum_c a_nc - a_n),
    dt_nc = -g (1 - eps) w_c log p_nc (probability targets);  a_nc = w_c ((1 - eps) [c = y_n] + eps / C) for class
    indices y (0 where y_n = ignore_index), w_c ((1 - eps) t_nc + eps / C) for probabilities t; w = the class weights
    (1 without), C = the number of classes, eps = the label smoothing; 'mean' divides by sum_n w_{y_n} (indices) or
    by N = the number of samples (probabilities)"""

    @staticmethod
    def forward(ctx, input, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
                reduction="mean", label_smoothing=0.0):
        _refuse_grad(ctx, 2, "cross_entropy", "weight")
        ctx.reduction = _reduction(size_average, reduce, reduction)
        ctx.ignore_index, ctx.smoothing = ignore_index, label_smoothing
        ctx.save_for_backward(input, target, weight)
        return F.cross_entropy(input, target, weight, size_average, ignore_index, reduce, reduction, label_smoothing)

    @staticmethod
    def backward(ctx, g):
        x, target, weight = ctx.saved_tensors
        need_x, need_target = ctx.needs_input_grad[:2]
        if not torch.is_grad_enabled() and not target.is_floating_point() and not ctx.smoothing and x.dim() <= 2:
            return _cross_entropy_kernels(ctx, g, x, target, weight), None
        a, divisor = _class_coefficients(x, target, weight, ctx.ignore_index, ctx.smoothing, ctx.reduction)
        scale = _per_sample_scale(g, ctx.reduction, divisor, x)
        class_dim = 0 if x.dim() == 1 else 1
        grad_x = (F.softmax(x, class_dim) * a.sum(class_dim, keepdim=True) - a) * scale if need_x else None
        grad_target = None
        if need_target:
            along_classes = [-1 if d == class_dim else 1 for d in range(x.dim())]
            w = 1 if weight is None else weight.reshape(along_classes)
            grad_target = -(1 - ctx.smoothing) * w * F.log_softmax(x, class_dim) * scale
        return grad_x, grad_target


@register(F.nll_loss)
class NllLoss(Function):
    """l_n = -w_{y_n} x_{n, y_n}  ->  dl/dx_nc = -w_c [c = y_n]  (0 for samples with y_n = ignore_index)"""

    @staticmethod
    def forward(ctx, input, target, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean"):
        _refuse_grad(ctx, 2, "nll_loss", "weight")
        ctx.reduction = _reduction(size_average, reduce, reduction)
        ctx.ignore_index = ignore_index
        ctx.save_for_backward(input, target, weight)
        return F.nll_loss(input, target, weight, size_average, ignore_index, reduce, reduction)

    @staticmethod
    def backward(ctx, g):
        x, target, weight = ctx.saved_tensors
        a, divisor = _class_coefficients(x, target, weight, ctx.ignore_index, 0.0, ctx.reduction)
        return -a * _per_sample_scale(g, ctx.reduction, divisor, x), None


@register(F.binary_cross_entropy)
class BinaryCrossEntropy(Function):
    """l = -w [t log x + (1 - t) log(1 - x)]  ->  dl/dx = w (x - t) / (x (1 - x)),  dl/dt = -w log(x / (1 - x))"""

    @staticmethod
    def forward(ctx, input, target, weight=None, size_average=None, reduce=None, reduction="mean"):
        _refuse_grad(ctx, 2, "binary_cross_entropy", "weight")
        ctx.reduction = _reduction(size_average, reduce, reduction)
        ctx.save_for_backward(input, target, weight)
        return F.binary_cross_entropy(input, target, weight, size_average, reduce, reduction)

    @staticmethod
    def backward(ctx, g):
        x, t, weight = ctx.saved_tensors
        scale = _scale(g, ctx.reduction, x.numel())
        scale = scale if weight is None else scale * weight
        need_x, need_t = ctx.needs_input_grad[:2]
        grad_x = (x - t) / (x * (1 - x)).clamp(min=EPSILON) * scale if need_x else None  # torch's clamp, too
        grad_t = -(torch.log(x) - torch.log1p(-x)) * scale if need_t else None
        return grad_x, grad_t


@register(F.binary_cross_entropy_with_logits)
class BinaryCrossEntropyWithLogits(Function):
    """l = -w [p t log s(x) + (1 - t) log(1 - s(x))]  ->  dx = g w (s(x) (1 + (p - 1) t) - p t),
    dt = g w ((p - 1) softplus(-x) - x);  s = sigmoid, p = pos_weight"""

    @staticmethod
    def forward(ctx, input, target, weight=None, size_average=None, reduce=None, reduction="mean", pos_weight=None):
        _refuse_grad(ctx, 2, "binary_cross_entropy_with_logits", "weight")
        _refuse_grad(ctx, 6, "binary_cross_entropy_with_logits", "pos_weight")
        ctx.reduction = _reduction(size_average, reduce, reduction)
        ctx.save_for_backward(input, target, weight, pos_weight)
        return F.binary_cross_entropy_with_logits(input, target, weight, size_average, reduce, reduction, pos_weight)

    @staticmethod
    def backward(ctx, g):
        x, t, weight, p = ctx.saved_tensors
        scale = _scale(g, ctx.reduction, x.numel())  # F checks that target has the shape of input
        scale = scale if weight is None else scale * weight
        need_x, need_t = ctx.needs_input_grad[:2]
        if p is None:
            grad_x = (torch.sigmoid(x) - t) * scale if need_x else None
            return grad_x, -x * scale if need_t else None
        grad_x = (torch.sigmoid(x) * (1 + (p - 1) * t) - p * t) * scale if need_x else None
        grad_t = ((p - 1) * F.softplus(-x) - x) * scale if need_t else None
        return grad_x, grad_t


@register(F.kl_div)
class KlDiv(Function):
    """l = t (log t - x)  ->  dl/dx = -t, dl/dt = log t + 1 - x (NaN at t = 0);   log_target: l = e^t (t - x)
    ->  dl/dx = -e^t, dl/dt = e^t (t - x + 1)"""

    @staticmethod
    def forward(ctx, input, target, size_average=None, reduce=None, reduction="mean", log_target=False):
        ctx.reduction = _reduction(size_average, reduce, reduction)
        ctx.log_target = log_target
        ctx.save_for_backward(input, target)
        return F.kl_div(input, target, size_average, reduce, reduction, log_target)

    @staticmethod
    def backward(ctx, g):
        x, t = ctx.saved_tensors
        shape = torch.broadcast_shapes(x.shape, t.shape)
        divisor = (x.shape[0] if x.dim() else 1) if ctx.reduction == "batchmean" else shape.numel()
        scale = _scale(g, ctx.reduction, divisor)
        need_x, need_t = ctx.needs_input_grad[:2]
        p = torch.exp(t) if ctx.log_target else t
        grad_x = (-p * scale).expand(shape) if need_x else None  # a broadcast target still reaches every x
        if not need_t:
            return grad_x, None
        if ctx.log_target:
            grad_t = p * (t - x + 1)
        else:  # torch differentiates xlogy(t, t): its t / t is 0 / 0 at t = 0, NaN (not log 0 = -inf)
            grad_t = torch.where(t == 0, torch.nan, torch.log(t)) + 1 - x
        return grad_x, grad_t * scale


class MSELoss(Module, torch.nn.MSELoss):
    """mean((input - target)^2) (reduction='mean'; also 'sum', 'none')."""


MSE = MSELoss  # the original torchtrace's name


class L1Loss(Module, torch.nn.L1Loss):
    """mean |input - target|."""


class SmoothL1Loss(Module, torch.nn.SmoothL1Loss):
    """Squared below beta, absolute above it."""


class HuberLoss(Module, torch.nn.HuberLoss):
    """Squared below delta, delta-scaled absolute above it."""


class CrossEntropyLoss(Module, torch.nn.CrossEntropyLoss):
    """-log softmax(input)[target], with class weights, ignore_index and label smoothing; or probability targets."""


class NLLLoss(Module, torch.nn.NLLLoss):
    """-input[target]: the negative log-likelihood of log-probabilities."""


class BCELoss(Module, torch.nn.BCELoss):
    """Binary cross entropy of probabilities."""


class BCEWithLogitsLoss(Module, torch.nn.BCEWithLogitsLoss):
    """Binary cross entropy of logits, with pos_weight."""


class KLDivLoss(Module, torch.nn.KLDivLoss):
    """Kullback-Leibler divergence of log-probabilities input from target."""
