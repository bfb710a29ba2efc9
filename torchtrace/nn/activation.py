"""Activations: one table line per torch.nn.functional rule (math, gradient), then the modules.

F.relu, torch.sigmoid, torch.tanh, F.softmax and F.log_softmax have their rules in torchtrace/ops;
the ReLU, Sigmoid, Tanh, Softmax and LogSoftmax modules below just call them. `inplace=True` is
ignored: the result is computed out of place and returned.
"""
import math
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F

from torchtrace.autograd.function import register
from torchtrace.nn.module import Module
from torchtrace.ops.aten_forms import smooth_vjp
from torchtrace.ops.opmath import in_float32, opmath
from torchtrace.ops.rule_tables import table_rule

aten = torch.ops.aten  # the VJP ops torch's own formulas use (rules in ops/aten_forms.py: second derivatives 0)
SELU_ALPHA, SELU_SCALE = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946  # torch's constants


def activation(name: str, target: Callable, math_line: str, grad: Callable, uses: Sequence[str],
               **defaults: Any) -> type:
    """Rule for y = target(x, **options); grad(g, x, y, **options) is the vector-Jacobian product, reading only `uses`.

    `defaults` lists target's options in positional order, with their default values.
    """
    return table_rule(name, [target], math_line, [grad], [uses], options=defaults)


def _below_zero(v: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """v where x < 0, else 0: e^v is 1 at x = 0 either way, but this is flat there, so the ELU family's second
    derivative at x = 0 is 0, as torch's elu_double_backward (mask x < 0)."""
    return torch.where(x < 0, v, 0.0)


def _glu(g: torch.Tensor, x: torch.Tensor, y: torch.Tensor, dim: int) -> torch.Tensor:
    a, b = x.chunk(2, dim)
    s = torch.sigmoid(b)
    return torch.cat([g * s, g * a * s * (1 - s)], dim)


def _gelu(g: torch.Tensor, x: torch.Tensor, y: torch.Tensor, approximate: str) -> torch.Tensor:
    """g f'(x), f'(x) = Phi(x) + x phi(x) (tanh form: 1/2 (1 + t) + 1/2 x (1 - t^2) u', t = tanh u,
    u = sqrt(2/pi) (x + 0.044715 x^3)), by torch's one-pass kernel of that product, as torch's formula: the same bits,
    and 5x faster than its nine elementwise steps written out. Its own derivatives: the GeluBackward rule below."""
    return aten.gelu_backward(g, x, approximate=approximate)


_SQRT_2_OVER_PI, _KAPPA = math.sqrt(2 / math.pi), 0.044715  # the tanh form's constants


def gelu_second_derivative(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """f''(x) of y = f(x) = GELU.

    exact: f' = Phi + x phi, phi' = -x phi  ->  f'' = phi + phi - x^2 phi = phi(x) (2 - x^2);
    tanh form: f' = 1/2 (1 + t) + 1/2 x (1 - t^2) u', with t = tanh u, u = b (x + k x^3), u' = b (1 + 3 k x^2),
    u'' = 6 b k x, (1 - t^2)' = -2 t (1 - t^2) u'  ->  f'' = (1 - t^2) (u' - x t u'^2 + 3 b k x^2).
    """
    x = opmath(x)[0]  # (x^3 of float16 overflows past 40: 0 * inf)
    if approximate == "tanh":
        slope = _SQRT_2_OVER_PI * (1 + 3 * _KAPPA * x * x)  # u'
        t = torch.tanh(_SQRT_2_OVER_PI * (x + _KAPPA * x ** 3))
        return (1 - t * t) * (slope - x * t * slope * slope + 3 * _SQRT_2_OVER_PI * _KAPPA * x * x)
    return torch.exp(x * x * -0.5) * (1 / math.sqrt(2 * math.pi)) * (2 - x * x)


smooth_vjp("GeluBackward", aten.gelu_backward, "r = h f'(x) (GELU's VJP, f = GELU)  ->  dh = g f'(x);  "
           "dx = g h f''(x)  (f' = Phi(x) + x phi(x), f'' = phi(x) (2 - x^2); the tanh form's: gelu_second_derivative)",
           gelu_second_derivative, options=("approximate",))


def _mish(g: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    t = torch.tanh(F.softplus(x))
    return g * (t + x * torch.sigmoid(x) * (1 - t * t))


def _silu(g: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """g f'(x), f'(x) = s (1 + x (1 - s)), s = sigmoid(x), by torch's one-pass kernel of it (as _gelu)."""
    return aten.silu_backward(g, x)


def silu_second_derivative(x: torch.Tensor) -> torch.Tensor:
    """f''(x) of f(x) = x s(x): with s' = s (1 - s), f' = s + x s (1 - s), so
    f'' = s (1 - s) (1 + x (1 - s)) + s (1 - s) - x s s (1 - s) = s (1 - s) (2 + x (1 - 2 s))."""
    s = torch.sigmoid(opmath(x)[0])
    return s * (1 - s) * (2 + x * (1 - 2 * s))


smooth_vjp("SiluBackward", aten.silu_backward, "r = h f'(x) (SiLU's VJP, f(x) = x s(x), s = sigmoid)  ->  "
           "dh = g f'(x);  dx = g h s (1 - s) (2 + x (1 - 2 s))  (f' = s (1 + x (1 - s)))", silu_second_derivative)


activation("Relu6", F.relu6, "y = min(max(x, 0), 6)  ->  dy/dx = 1 for 0 < x < 6, else 0",
           lambda g, x, y: aten.hardtanh_backward(g, x, 0.0, 6.0), uses=("x",), inplace=False)
activation("Hardtanh", F.hardtanh, "y = clamp(x, lo, hi)  ->  dy/dx = 1 for lo < x < hi, else 0",
           lambda g, x, y, min_val, max_val: aten.hardtanh_backward(g, x, min_val, max_val), uses=("x",),
           min_val=-1.0, max_val=1.0, inplace=False)
activation("LeakyRelu", F.leaky_relu, "y = x if x > 0 else a x  ->  dy/dx = 1 if x > 0 else a",
           lambda g, x, y, negative_slope: aten.leaky_relu_backward(g, x, negative_slope, False), uses=("x",),
           negative_slope=0.01, inplace=False)
activation("Elu", F.elu, "y = x if x > 0 else a (e^x - 1)  ->  dy/dx = 1 if x > 0 else a e^x",
           in_float32(lambda g, x, y, alpha: torch.where(x <= 0, g * alpha * torch.exp(_below_zero(x, x)), g)),
           uses=("x",), alpha=1.0, inplace=False)
activation("Gelu", F.gelu, "y = x Phi(x)  ->  dy/dx = Phi(x) + x phi(x)  (approximate='tanh': that form's derivative)",
           _gelu, uses=("x",), approximate="none")
activation("Silu", F.silu, "y = x s(x), s = sigmoid  ->  dy/dx = s (1 + x (1 - s))", _silu, uses=("x",),
           inplace=False)
activation("Mish", F.mish, "y = x tanh(softplus x)  ->  dy/dx = t + x s(x) (1 - t^2), t = tanh(softplus x)",
           in_float32(_mish), uses=("x",), inplace=False)
register(torch.selu, rule=activation(
    "Selu", F.selu, "y = s x if x > 0 else s a (e^x - 1), s, a: SELU's constants  ->  dy/dx = s if x > 0 else s a e^x",
    in_float32(lambda g, x, y: torch.where(x <= 0, g * (SELU_SCALE * SELU_ALPHA) * torch.exp(_below_zero(x, x)),
                                           g * SELU_SCALE)), uses=("x",), inplace=False))
register(torch.celu, rule=activation(
    "Celu", F.celu, "y = x if x > 0 else a (e^(x/a) - 1)  ->  dy/dx = 1 if x > 0 else e^(x/a)",
    in_float32(lambda g, x, y, alpha: torch.where(x <= 0, g * torch.exp(_below_zero(x, x) / alpha), g)), uses=("x",),
    alpha=1.0, inplace=False))
register(torch._C._nn.glu, rule=activation(
    "Glu", F.glu, "y = a s(b), (a, b) = the halves of x along dim  ->  dy/da = s(b), dy/db = a s(b) (1 - s(b))",
    _glu, uses=("x",), dim=-1))
register(torch._C._nn.hardswish, rule=activation(
    "Hardswish", F.hardswish, "y = x relu6(x + 3) / 6  ->  dy/dx = 0 if x <= -3, x/3 + 1/2 if x < 3, else 1",
    in_float32(lambda g, x, y: torch.where(x <= -3, 0.0, torch.where(x < 3, g * (x / 3 + 0.5), g))), uses=("x",),
    inplace=False))
register(torch._C._nn.hardsigmoid, rule=activation(
    "Hardsigmoid", F.hardsigmoid, "y = relu6(x + 3) / 6  ->  dy/dx = 1/6 for -3 < x < 3, else 0",
    lambda g, x, y: aten.hardsigmoid_backward(g, x), uses=("x",), inplace=False))
activation("LogSigmoid", F.logsigmoid, "y = log s(x) = -softplus(-x)  ->  dy/dx = s(-x) = 1 - s(x)",
           lambda g, x, y: g * torch.sigmoid(-x), uses=("x",))
activation("Softsign", F.softsign, "y = x / (1 + |x|)  ->  dy/dx = 1 / (1 + |x|)^2",
           lambda g, x, y: g / (1 + x.abs()) ** 2, uses=("x",))
activation("Tanhshrink", F.tanhshrink, "y = x - tanh x  ->  dy/dx = tanh^2 x",
           lambda g, x, y: g * torch.tanh(x) ** 2, uses=("x",))
activation("Softshrink", F.softshrink, "y = x - l if x > l, x + l if x < -l, else 0  ->  dy/dx = 1 if |x| > l, else 0",
           lambda g, x, y, lambd: aten.softshrink_backward(g, x, lambd), uses=("x",), lambd=0.5)
register(torch.Tensor.hardshrink, rule=activation(
    "Hardshrink", F.hardshrink, "y = x if |x| > l else 0  ->  dy/dx = 1 if |x| > l, else 0",
    lambda g, x, y, lambd: aten.hardshrink_backward(g, x, lambd), uses=("x",), lambd=0.5))
register(torch.threshold, rule=activation(
    "Threshold", F.threshold, "y = x if x > threshold else value  ->  dy/dx = 1 if x > threshold, else 0",
    lambda g, x, y, threshold, value: aten.threshold_backward(g, x, threshold), uses=("x",),
    threshold=None, value=None, inplace=False))
activation("Softplus", F.softplus, "y = log(1 + e^(b x)) / b (x if b x > threshold)  ->  dy/dx = s(b x) (1 past it)",
           in_float32(lambda g, x, y, beta, threshold: torch.where(x * beta > threshold, g,
                                                                   g * torch.sigmoid(x * beta))),
           uses=("x",), beta=1.0, threshold=20.0)


class ReLU(Module, torch.nn.ReLU):
    """max(x, 0)."""


class ReLU6(Module, torch.nn.ReLU6):
    """min(max(x, 0), 6)."""


class LeakyReLU(Module, torch.nn.LeakyReLU):
    """x if x > 0 else negative_slope * x."""


class ELU(Module, torch.nn.ELU):
    """x if x > 0 else alpha (e^x - 1)."""


class GELU(Module, torch.nn.GELU):
    """x Phi(x), exact or with approximate='tanh'."""


class SiLU(Module, torch.nn.SiLU):
    """x sigmoid(x)."""


class Mish(Module, torch.nn.Mish):
    """x tanh(softplus(x))."""


class Softplus(Module, torch.nn.Softplus):
    """log(1 + e^(beta x)) / beta, linear past the threshold."""


class Sigmoid(Module, torch.nn.Sigmoid):
    """1 / (1 + e^-x)."""


class Tanh(Module, torch.nn.Tanh):
    """tanh(x)."""


class Hardtanh(Module, torch.nn.Hardtanh):
    """clamp(x, min_val, max_val)."""


class Softmax(Module, torch.nn.Softmax):
    """e^x / sum e^x along dim."""


class LogSoftmax(Module, torch.nn.LogSoftmax):
    """x - logsumexp(x) along dim."""


class SELU(Module, torch.nn.SELU):
    """scale (x if x > 0 else alpha (e^x - 1)), with SELU's fixed constants."""


class CELU(Module, torch.nn.CELU):
    """x if x > 0 else alpha (e^(x / alpha) - 1)."""


class GLU(Module, torch.nn.GLU):
    """a sigmoid(b), where a and b are the two halves of the input along dim."""


class Hardswish(Module, torch.nn.Hardswish):
    """x relu6(x + 3) / 6."""


class Hardsigmoid(Module, torch.nn.Hardsigmoid):
    """relu6(x + 3) / 6."""


class LogSigmoid(Module, torch.nn.LogSigmoid):
    """log sigmoid(x)."""


class Softsign(Module, torch.nn.Softsign):
    """x / (1 + |x|)."""


class Softshrink(Module, torch.nn.Softshrink):
    """x - lambd above lambd, x + lambd below -lambd, 0 between."""


class Hardshrink(Module, torch.nn.Hardshrink):
    """x where |x| > lambd, 0 elsewhere."""


class Tanhshrink(Module, torch.nn.Tanhshrink):
    """x - tanh(x)."""


class Threshold(Module, torch.nn.Threshold):
    """x where x > threshold, value elsewhere."""
