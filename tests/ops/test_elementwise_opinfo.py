"""PyTorch's own OpInfo samples for the trigonometric, special and rounding rules: every sample, through the function,
method, in-place and alias spellings, against torch autograd (float64)."""
import warnings
from typing import Any, Callable, List, Tuple

import pytest
import torch
from helpers import opinfos

import torchtrace as tt
from torchtrace.nested import flatten

OPS = """acos asin atan acosh asinh atanh sinh cosh sinc deg2rad rad2deg hypot copysign logaddexp logaddexp2 logit xlogy
special.xlog1py special.entr lgamma digamma polygamma mvlgamma erfinv i0 special.i0e special.i1 special.i1e special.ndtr
special.ndtri special.log_ndtr special.erfcx special.polygamma frac fmod remainder fmax fmin float_power ldexp frexp
nan_to_num sgn positive atan2 double float half bfloat16 to""".split()


def _spellings(op: Any) -> List[Tuple[str, Callable]]:
    found = [("function", op.op)]
    if op.method_variant:
        found.append(("method", op.method_variant))
    if op.inplace_variant:
        found.append(("in-place", lambda x, *a, _f=op.inplace_variant, **k: _f(x.clone(), *a, **k)))
    for alias in op.aliases:
        found += [(alias.name, f) for f in (alias.op, alias.method_variant) if f is not None]
    return found


def _torch_refuses(fn: Callable, sample: Any) -> bool:
    """Samples torch itself rejects (an in-place op that would change dtype, an undifferentiable in-place)."""
    plain = [x.detach().clone().requires_grad_(x.requires_grad) if isinstance(x, torch.Tensor) else x
             for x in (sample.input, *sample.args)]
    try:
        out, _ = flatten(fn(*plain, **sample.kwargs))
        floating = [o for o in out if isinstance(o, torch.Tensor) and o.requires_grad]
        if floating:
            sum(o.sum() for o in floating).backward()
    except (RuntimeError, NotImplementedError):
        return True
    return False


@pytest.mark.parametrize("name", OPS)
def test_opinfo_samples_match_torch(name: str) -> None:
    ops = opinfos(OPS).get(name)
    assert ops, f"no OpInfo named {name}"
    checked = 0
    for op in ops:
        for sample in op.sample_inputs("cpu", torch.float64, requires_grad=True):
            leaves, rebuild = flatten([sample.input, *sample.args])
            for _, fn in _spellings(op):
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    if _torch_refuses(fn, sample):
                        continue
                    tt.check(lambda *xs, fn=fn: (lambda t: fn(t[0], *t[1:], **sample.kwargs))(rebuild(list(xs))),
                             *leaves)
                checked += 1
    assert checked > 0
