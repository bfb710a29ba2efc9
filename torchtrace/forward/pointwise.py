"""Tangents of elementwise ops: ẏ = f'(x) ẋ, and for two inputs ẏ = ∂y/∂a ȧ + ∂y/∂b ḃ."""
import torch

from torchtrace.forward.call import Call
from torchtrace.forward.kinds import decomposed, diagonal, linear, pointwise, product
from torchtrace.forward.table import declare, tangent

# Table rules (ops/rule_tables.py): each gradient formula, applied to the tangent, is the tangent's term.
declare("""Exp Exp2 Expm1 Log Log2 Log10 Log1p Erf Erfc Sqrt Rsqrt Square Abs Sin Cos Tan Tanh Sigmoid Sign Ceil
           Floor Round Trunc Maximum Minimum Atan2 Neg Pow Reciprocal Nextafter
           Acos Acosh Asin Asinh Atan Atanh Cosh Deg2rad Hypot Rad2deg Sinc Sinh
           Digamma Entr Erfcx Erfinv I0 I0e I1 I1e Lgamma LogNdtr Logaddexp Logaddexp2 Ndtr Ndtri Xlog1py Xlogy
           Copysign Fmax Fmin Fmod Ldexp NanToNum Remainder
           Celu Elu Gelu Hardshrink Hardsigmoid Hardswish Hardtanh LeakyRelu LogSigmoid Mish Relu6 Selu Silu Softplus
           Softshrink Softsign Tanhshrink Threshold""",
        "{gradient}, so ẏ = Σ_i ∂y/∂x_i ẋ_i (the gradient formula applied to ẋ_i: an elementwise J is diagonal)",
        pointwise)

# Elementwise rules of one differentiable input: the backward applied once to the tangent.
declare("""Relu Frac Positive Sgn Angle Logit Mvlgamma TensorPolygamma Rdiv Rpow Rremainder Bernoulli Rrelu TorchRrelu
           DropoutFunction Dropout1dFunction Dropout2dFunction Dropout3dFunction AlphaDropoutFunction
           FeatureAlphaDropoutFunction FeatureDropout TorchAlphaDropout TorchDropout TorchFeatureAlphaDropout
           InPlaceDropout TorchInPlaceDropout
           EluInPlace SeluInPlace CeluInPlace""",
        "{gradient}, so ẏ = f'(x) ẋ: the backward applied to ẋ (J = J^T for an elementwise op)", diagonal)

declare("Add Sub Rsub", "ż = ȧ ± alpha ḃ (linear: the op on the tangents, a number operand's tangent 0)",
        linear(fills=(0, 1)))
declare("Mul", "ż = ȧ b + a ḃ", product((0, 1)))
declare("Addcmul", "ẏ = i̇ + v (ṫ1 t2 + t1 ṫ2)", product((1, 2), offset=0))
declare("Where", "ẏ = where(c, ȧ, ḃ)", linear(fills=(1, 2)))
declare("TensorWhere", "ẏ = where(c, ȧ, ḃ)", linear(fills=(0, 2)))


@tangent("Div", "z = a / b  ->  ż = ȧ / b - z ḃ / b (0 with a rounding mode)")
def _div(call: Call) -> torch.Tensor:
    call.only(0, 1)
    b, z = call.args[1], call.out
    if call.kwargs.get("rounding_mode") is not None:
        return torch.zeros_like(z)
    da, db = call.dot(0), call.dot(1)
    total = da / b if da is not None else None
    if db is not None:
        total = -z * db / b if total is None else total - z * db / b
    return total.expand(z.shape)


@tangent("Addcdiv", "y = i + v t1 / t2  ->  ẏ = i̇ + v (ṫ1 / t2 - t1 ṫ2 / t2^2)")
def _addcdiv(call: Call) -> torch.Tensor:
    call.only(0, 1, 2)
    _, t1, t2 = call.args[:3]
    v = call.arg(3, "value", 1)
    d0, d1, d2 = call.dot(0), call.dot(1), call.dot(2)
    total = torch.zeros_like(call.out)
    if d0 is not None:
        total = total + d0
    if d1 is not None:
        total = total + v * d1 / t2
    if d2 is not None:
        total = total - v * t1 * d2 / (t2 * t2)
    return total


@tangent("Lerp", "y = x + w (e - x)  ->  ẏ = ẋ + ẇ (e - x) + w (ė - ẋ)")
def _lerp(call: Call) -> torch.Tensor:
    call.only(0, 1, 2)
    x, e, w = call.args[:3]
    dx, de, dw = call.dot(0), call.dot(1), call.dot(2)
    total = torch.zeros_like(call.out)
    if dx is not None:
        total = total + dx * (1 - w)
    if de is not None:
        total = total + de * w
    if dw is not None:
        total = total + dw * (e - x)
    return total


def _bounded(x: torch.Tensor, dx: torch.Tensor, bound: object, dbound: object, keep: torch.Tensor) -> torch.Tensor:
    """ẋ where x is kept, the bound's tangent (0 for a number) where the bound is the result."""
    other = dbound if dbound is not None else torch.zeros_like(x)
    return torch.where(keep, dx, other)


@tangent("Clamp", "y = min(max(x, lo), hi)  ->  ẏ = ẋ where lo <= x <= hi, else the bound's tangent")
def _clamp(call: Call) -> torch.Tensor:
    call.only(0, 1, 2)
    x = call.args[0]
    lo, hi = call.arg(1, "min"), call.arg(2, "max")
    dlo, dhi = call.dot(1) if len(call.args) > 1 else None, call.dot(2) if len(call.args) > 2 else None
    dx = call.dot(0) if call.dot(0) is not None else torch.zeros_like(x)
    m, dm = x, dx.expand(call.out.shape)
    if lo is not None:
        m = torch.maximum(x, lo) if isinstance(lo, torch.Tensor) else x.clamp_min(lo)
        dm = _bounded(x, dx, lo, dlo, x >= lo).expand(call.out.shape)
    if hi is not None:
        dm = _bounded(m, dm, hi, dhi, m <= hi).expand(call.out.shape)
    return dm


@tangent("ClampMin", "y = max(x, lo)  ->  ẏ = ẋ where x >= lo, else l̇o")
def _clamp_min(call: Call) -> torch.Tensor:
    call.only(0, 1)
    x, lo = call.args[0], call.arg(1, "min")
    dx = call.dot(0) if call.dot(0) is not None else torch.zeros_like(x)
    return _bounded(x, dx, lo, call.dot(1), x >= lo).expand(call.out.shape)


@tangent("ClampMax", "y = min(x, hi)  ->  ẏ = ẋ where x <= hi, else ḣi")
def _clamp_max(call: Call) -> torch.Tensor:
    call.only(0, 1)
    x, hi = call.args[0], call.arg(1, "max")
    dx = call.dot(0) if call.dot(0) is not None else torch.zeros_like(x)
    return _bounded(x, dx, hi, call.dot(1), x <= hi).expand(call.out.shape)


@tangent("Polygamma", "y = ψ^(n)(x)  ->  ẏ = ψ^(n+1)(x) ẋ")
def _polygamma(call: Call) -> torch.Tensor:
    call.only(1)
    n, x = call.args[:2]
    return torch.polygamma(n + 1, x) * call.dot(1)


@tangent("Frexp", "x = m 2^e  ->  ṁ = ẋ / 2^e (e is an integer)")
def _frexp(call: Call) -> tuple:
    call.only(0)
    return call.dot(0) * torch.pow(2.0, -call.out[1].to(call.out[0].dtype)), None


def _float_power(x: torch.Tensor, exponent: object) -> torch.Tensor:
    wide = exponent.to(torch.float64) if isinstance(exponent, torch.Tensor) else exponent
    return torch.pow(x.to(torch.float64) if isinstance(x, torch.Tensor) else x, wide)


declare("FloatPower", "y = x^e in float64  ->  ẏ = e x^(e-1) ẋ + y ln(x) ė", decomposed(_float_power))


@tangent("Prelu", "y = x (x > 0), w x (x <= 0; w per channel)  ->  ẏ = ẋ [x > 0] + (ẇ x + w ẋ) [x <= 0]")
def _prelu(call: Call) -> torch.Tensor:
    call.only(0, 1)
    x, w = call.args[:2]
    per_channel = w.numel() > 1 and x.dim() >= 2
    wide = w.reshape([-1 if i == 1 else 1 for i in range(x.dim())]) if per_channel else w.reshape(())
    dx = call.dot(0) if call.dot(0) is not None else torch.zeros_like(x)
    negative = dx * wide
    if call.dot(1) is not None:
        negative = negative + call.dot(1).reshape(wide.shape) * x
    return torch.where(x > 0, dx, negative)




@tangent("TanhBackward SigmoidBackward GeluBackward SiluBackward",
         "r = h f'(v) (an activation's VJP op)  ->  ṙ = ḣ f'(v) + h f''(v) v̇")
def _smooth_vjp(call: Call) -> torch.Tensor:
    call.only(0, 1)
    h, v = call.args[:2]
    rule = call.rule
    options = {name: call.arg(2 + k, name) for k, name in enumerate(rule.option_names)
               if call.arg(2 + k, name) is not None}
    dh, dv = call.dot(0), call.dot(1)
    total = torch.zeros_like(call.out)
    if dh is not None:
        total = total + rule.op(dh, v, **options)
    if dv is not None:
        total = total + (h * rule.curvature(v, **options) * dv).to(call.out.dtype)
    return total
