"""Sampling ops whose parameters may be tracers: torch.normal, torch.bernoulli, torch.poisson, the Gamma sampler
torch._standard_gamma (reparameterised, as torch's: its gradient below), and the in-place
fills x.uniform_(), x.normal_(), x.exponential_(), x.random_(), x.cauchy_(), x.log_normal_(), x.geometric_().

The forward calls torch's own sampler with the caller's arguments, so under the same seed the samples
equal torch's. As in torch (derivatives.yaml), the other samples are not reparameterised: the gradient with
respect to mean, std, p and the rates is zero, and so is the gradient of a tensor whose values an in-place fill
replaced. For a reparameterised sample write mean + std * torch.randn_like(std).
Each rule says it draws random numbers (`draws_random`): its in-place form writes the very samples it drew.
"""

import torch

from torchtrace.autograd.function import INPLACE, Function, register

T = torch.Tensor


def zeros_for(ctx, g: torch.Tensor, n: int) -> tuple:
    """Zero gradients (as torch) for the first n parameters that need one."""
    return tuple(torch.zeros_like(g) if need else None for need in ctx.needs_input_grad[:n])


@register(torch.normal)
class Normal(Function):
    """y ~ N(mean, std^2), sampled by torch  ->  dy/dmean = 0, dy/dstd = 0 (torch: not reparameterised)"""

    draws_random = True

    @staticmethod
    def forward(ctx, mean, std=1.0, *args, **kwargs):
        ctx.n = 2 + len(args)
        return torch.normal(mean, std, *args, **kwargs)

    @staticmethod
    def backward(ctx, g):
        return (*zeros_for(ctx, g, 2), *(None,) * (ctx.n - 2))


@register(torch.bernoulli, T.bernoulli)
class Bernoulli(Function):
    """y ~ Bernoulli(p), sampled by torch  ->  dy/dp = 0 (as torch)"""

    draws_random = True

    @staticmethod
    def forward(ctx, input, *args, **kwargs):
        ctx.n = 1 + len(args)
        if args and isinstance(args[0], torch.Tensor):  # x.bernoulli_(p) with a tensor p: x's shape, p's draws
            return input.clone().bernoulli_(*args, **kwargs)
        return torch.bernoulli(input, *args, **kwargs)

    @staticmethod
    def backward(ctx, g):
        return (*zeros_for(ctx, g, 2)[:ctx.n],) if ctx.n > 1 else zeros_for(ctx, g, 1)


@register(torch.poisson)
class Poisson(Function):
    """y ~ Poisson(rate), sampled by torch  ->  dy/drate = 0 (as torch)"""

    draws_random = True

    @staticmethod
    def forward(ctx, rates, *args, **kwargs):
        return torch.poisson(rates, *args, **kwargs)

    @staticmethod
    def backward(ctx, g):
        return torch.zeros_like(g)


@register(torch._standard_gamma)
class StandardGamma(Function):
    """y ~ Gamma(alpha, 1), sampled by torch  ->  dy/dalpha = torch._standard_gamma_grad(alpha, y)
    = -(dF/dalpha) / (dF/dy), with F(y; alpha) the Gamma CDF at y

    The sample moves with alpha so that its quantile F(y; alpha) stays fixed (an implicit reparameterisation, as
    torch's derivatives.yaml gives it). Gamma(a, rate).rsample() and the distributions built on it (Chi2, StudentT)
    sample through this op."""

    draws_random = True  # (a name tt.compile's tracing does not know as random: its generator is set back after)

    draws_random = True

    @staticmethod
    def forward(ctx, alpha, generator=None):
        y = torch._standard_gamma(alpha, generator)
        ctx.save_for_backward(alpha, y)
        return y

    @staticmethod
    def backward(ctx, g):
        alpha, y = ctx.saved_tensors
        return g * torch._standard_gamma_grad(alpha, y), None


class RandomFill(Function):
    """y = x.fill_(random numbers): new samples, none of them a function of x  ->  dy/dx = 0 (as torch)"""

    draws_random = True
    method = "uniform_"  # the Tensor method that fills

    @staticmethod
    def forward(ctx, x, *args, **kwargs):
        ctx.n = 1 + len(args)
        return getattr(x.clone(), ctx._rule.method)(*args, **kwargs)  # torch's own draws, in x's shape and layout

    @staticmethod
    def backward(ctx, g):
        return (torch.zeros_like(g), *(None,) * (ctx.n - 1))


def random_fill(method: str, distribution: str) -> None:
    """x.method(...) on a tracer that needs a gradient: recorded as x rebound to the samples (dx = 0)."""
    name = "".join(part.capitalize() for part in method.strip("_").split("_")) + "Fill"
    rule = type(name, (RandomFill,), {"method": method, "__doc__": (
        f"y = x.{method}(...): samples of {distribution}, none a function of x  ->  dy/dx = 0 (as torch)")})

    def filled(x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        return getattr(x.clone(), method)(*args, **kwargs)

    filled.__name__ = filled.__qualname__ = method.strip("_") + "_filled"
    INPLACE[getattr(T, method)] = (rule, filled)


RANDOM_FILLS = {"uniform_": "U(from, to)", "normal_": "N(mean, std^2)", "exponential_": "Exp(lambd)",
                "random_": "integers in [from, to)", "cauchy_": "Cauchy(median, sigma)",
                "log_normal_": "log-normal(mean, std)", "geometric_": "Geometric(p)"}
for _method, _distribution in RANDOM_FILLS.items():
    random_fill(_method, _distribution)
