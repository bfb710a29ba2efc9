"""tt.gradgradcheck: second derivatives against central finite differences of the first, as torch's gradgradcheck.

For a random cotangent v of each output (fixed by `seed`), the vector-Jacobian product

    vjp(x, v) = (d fn / d x)^T v      (tt.grad with create_graph=True: a function recorded like any other)

is handed to tt.gradcheck: its Jacobian with respect to x and v, from torchtrace's backward through that recorded
backward, must equal central finite differences of vjp itself. A rule whose backward is right but not differentiable
(a gradient computed from a detached value, or by a torch call no rule records) passes tt.gradcheck and fails here.
"""
from typing import Any, Callable, List

import torch

from torchtrace.autograd import engine
from torchtrace.autograd.plain import plain_torch
from torchtrace.check import _differentiable, _plain, gradcheck
from torchtrace.errors import GradientMismatch
from torchtrace.factories import as_tracer
from torchtrace.nested import flatten


def gradgradcheck(fn: Callable, *inputs: Any, eps: float = 1e-6, atol: float = 1e-5, rtol: float = 1e-3,
                  raise_exception: bool = True, seed: int = 0) -> bool:
    """Check fn's second derivatives: tt.gradcheck of v -> (dfn/dx)^T v (inputs and v in float64)."""
    leaves, rebuild = flatten(list(inputs))
    leaves = [_plain(x).double() if _differentiable(x) else x for x in leaves]
    checked = [i for i, x in enumerate(leaves) if _differentiable(x)]
    if not checked:
        raise ValueError("tt.gradgradcheck expects at least one floating-point tensor input: it checks second "
                         "derivatives with respect to the inputs")
    outputs = _differentiable_outputs(fn(*rebuild([as_tracer(x.clone(), True) if i in checked else x
                                                   for i, x in enumerate(leaves)])))
    generator = torch.Generator().manual_seed(seed)
    with plain_torch():
        cotangents = [torch.randn(o.shape, generator=generator, dtype=torch.float64) for o in outputs]

    def vjp(*values: Any) -> tuple:
        xs, vs = list(values[:len(leaves)]), list(values[len(leaves):])
        for i in checked:  # finite differences call this on plain tensors: tracers that need a gradient, then
            if not getattr(xs[i], "_tt_requires_grad", False):
                xs[i] = as_tracer(xs[i], True)
        with torch.enable_grad():  # (finite differences run under no_grad)
            outs = _differentiable_outputs(fn(*rebuild(xs)))
            grads = engine.grad(outs, [xs[i] for i in checked], vs, create_graph=True, allow_unused=True)
        return tuple(g for g in grads if g is not None)

    try:
        return gradcheck(vjp, *leaves, *cotangents, eps=eps, atol=atol, rtol=rtol)
    except GradientMismatch as error:
        if not raise_exception:
            return False
        raise GradientMismatch(f"second derivatives: the vector-Jacobian product (d fn/d inputs)^T v, differentiated "
                               f"by torchtrace, differs from its finite differences: {error} (inputs numbered as "
                               "given, then one v per output)") from None


def _differentiable_outputs(result: Any) -> List[torch.Tensor]:
    """The floating outputs a backward can start from (those that depend on an input needing a gradient)."""
    outs, _ = flatten(result)
    return [o for o in outs if _differentiable(o) and getattr(o, "_tt_requires_grad", False)]
