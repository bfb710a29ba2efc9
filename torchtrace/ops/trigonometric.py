"""Gradient rules for inverse trig, hyperbolic and inverse hyperbolic functions, sinc, angle units and hypot.

The formulas are written the way torch's derivatives.yaml writes them, so edge values (|x| = 1 for asin,
x = 0 for sinc, the origin for hypot) give the same inf / NaN / 0 as torch autograd.
"""
import math

import torch

from torchtrace.ops.rule_tables import binary, unary

T = torch.Tensor
DEG_TO_RAD, RAD_TO_DEG = math.pi / 180, 180 / math.pi

unary("Asin", [torch.asin, torch.arcsin, T.asin, T.arcsin], "y = asin x  ->  dy/dx = 1/sqrt(1 - x^2)",
      lambda g, x, y: g * (-x * x + 1).rsqrt(), uses=("x",))
unary("Acos", [torch.acos, torch.arccos, T.acos, T.arccos], "y = acos x  ->  dy/dx = -1/sqrt(1 - x^2)",
      lambda g, x, y: g * -((-x * x + 1).rsqrt()), uses=("x",))
unary("Atan", [torch.atan, torch.arctan, T.atan, T.arctan], "y = atan x  ->  dy/dx = 1/(1 + x^2)",
      lambda g, x, y: g / (x * x + 1), uses=("x",))
unary("Sinh", [torch.sinh, T.sinh], "y = sinh x  ->  dy/dx = cosh x",
      lambda g, x, y: g * torch.cosh(x), uses=("x",))
unary("Cosh", [torch.cosh, T.cosh], "y = cosh x  ->  dy/dx = sinh x",
      lambda g, x, y: g * torch.sinh(x), uses=("x",))
unary("Asinh", [torch.asinh, torch.arcsinh, T.asinh, T.arcsinh], "y = asinh x  ->  dy/dx = 1/sqrt(x^2 + 1)",
      lambda g, x, y: g * (x * x + 1).rsqrt(), uses=("x",))
unary("Acosh", [torch.acosh, torch.arccosh, T.acosh, T.arccosh], "y = acosh x  ->  dy/dx = 1/sqrt(x^2 - 1)",
      lambda g, x, y: g * (x * x - 1).rsqrt(), uses=("x",))
unary("Atanh", [torch.atanh, torch.arctanh, T.atanh, T.arctanh], "y = atanh x  ->  dy/dx = 1/(1 - x^2)",
      lambda g, x, y: g / (1 - x * x), uses=("x",))
unary("Deg2rad", [torch.deg2rad, T.deg2rad], "y = x pi/180  ->  dy/dx = pi/180",
      lambda g, x, y: g * DEG_TO_RAD, uses=())
unary("Rad2deg", [torch.rad2deg, T.rad2deg], "y = x 180/pi  ->  dy/dx = 180/pi",
      lambda g, x, y: g * RAD_TO_DEG, uses=())


def _sinc_grad(g: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """(pi x cos(pi x) - sin(pi x)) / (pi x^2), and 0 where pi x^2 == 0 (the limit at x = 0)."""
    pi_x, pi_x2 = x * math.pi, x * x * math.pi
    return torch.where(pi_x2 == 0, 0.0, g * (pi_x * torch.cos(pi_x) - torch.sin(pi_x)) / pi_x2)


unary("Sinc", [torch.sinc, T.sinc, torch.special.sinc],
      "y = sin(pi x)/(pi x)  ->  dy/dx = (pi x cos(pi x) - sin(pi x)) / (pi x^2), 0 at x = 0", _sinc_grad, uses=("x",))

binary("Hypot", [torch.hypot, T.hypot],
       "z = sqrt(a^2 + b^2)  ->  dz/da = a/z, dz/db = b/z   (NaN at the origin, as torch)",
       lambda g, a, b, z: g * a / z,
       lambda g, a, b, z: g * b / z, uses=(("a", "z"), ("b", "z")))
