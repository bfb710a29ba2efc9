"""PyTorch's OpInfo samples through tt.jvp, against torch.func.jvp and directional finite differences (float64).

For each sample, f maps the sample's floating tensors that require grad to the op's floating outputs. tt.jvp
must equal torch.func.jvp; where they differ, a central finite difference along the tangent decides (torch's own
forward mode is wrong in places). The report says how each op got its tangents: every op on the path by its
tangent rule ("dual"), or some transposed ("transposed"). `python -m tests.forward.opinfo_jvp` prints the sweep.
"""
import sys
import warnings
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Tuple

import torch

import torchtrace as tt
from torchtrace import coverage
from torchtrace.check import flatten

DUAL, TRANSPOSED, REFUSED, SKIPPED, WRONG = "dual", "transposed", "refused", "skipped", "WRONG"
RTOL, ATOL, EPS = 1e-6, 1e-7, 1e-6


@dataclass
class Verdict:
    name: str
    status: str
    detail: str = ""


class Skip(Exception):
    pass


def _function(op: Any, sample: Any) -> Tuple[Callable, Tuple[torch.Tensor, ...]]:
    """f(*primals) -> the op's floating outputs on the sample, the primals being its tensors that require grad."""
    leaves, rebuild = flatten([sample.input, list(sample.args), dict(sample.kwargs)])
    places = [i for i, t in enumerate(leaves) if isinstance(t, torch.Tensor) and t.requires_grad
              and t.is_floating_point()]
    if any(isinstance(t, torch.Tensor) and t.layout != torch.strided for t in leaves):
        raise Skip("sparse input")
    primals = tuple(leaves[i].detach().clone() for i in places)

    def f(*xs: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        items = [t.detach().clone() if isinstance(t, torch.Tensor) else t for t in leaves]
        for i, x in zip(places, xs):
            items[i] = x
        inp, args, kwargs = rebuild(items)
        out = sample.output_process_fn_grad(op.gradcheck_wrapper(op.op, inp, *args, **kwargs))
        outs = flatten(out)[0]
        return tuple(o for o in outs if isinstance(o, torch.Tensor) and o.is_floating_point())

    return f, primals


def _close(a: torch.Tensor, b: torch.Tensor, rtol: float = RTOL, atol: float = ATOL) -> bool:
    return a.shape == b.shape and torch.allclose(a, b.to(a.dtype), rtol=rtol, atol=atol, equal_nan=True)


def _error(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b.to(a.dtype)).abs().nan_to_num(float("inf")).max().item() if a.numel() else 0.0


def _finite_difference(f: Callable, primals: tuple, tangents: tuple) -> List[torch.Tensor]:
    plus = f(*(p + EPS * t for p, t in zip(primals, tangents)))
    minus = f(*(p - EPS * t for p, t in zip(primals, tangents)))
    return [(a - b) / (2 * EPS) for a, b in zip(plus, minus)]


def compare(op: Any, sample: Any) -> str:
    """DUAL or TRANSPOSED when tt.jvp agrees with torch (or with finite differences where torch does not)."""
    f, primals = _function(op, sample)
    if not primals:
        raise Skip("no input requires grad")
    generator = torch.Generator().manual_seed(0)
    tangents = tuple(torch.randn(p.shape, generator=generator, dtype=p.dtype) for p in primals)
    try:
        torch.manual_seed(0)
        values, expected = torch.func.jvp(f, primals, tangents)
    except Exception as exc:
        raise Skip(f"torch.func.jvp raised {type(exc).__name__}") from None
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours_values, ours, methods = tt.jvp(f, primals, tangents, report=True)
    if len(ours) != len(expected):
        raise AssertionError(f"{len(ours)} outputs, torch {len(expected)}")
    if any(p.dtype != torch.float64 for p in primals):  # a float32 argument (cov's weights): float32's precision
        for i, (a, b) in enumerate(zip(ours, expected)):
            if not _close(a, b, rtol=1e-4, atol=1e-5):
                raise AssertionError(f"output {i}: tangent differs from torch.func.jvp (float32 arguments)")
        return TRANSPOSED if any(how != "tangent rule" for how in methods.values()) else DUAL
    fd = _finite_difference(f, primals, tangents)
    for i, (a, b) in enumerate(zip(ours, expected)):
        smooth = _close(b, fd[i], rtol=1e-4, atol=1e-5)  # torch and finite differences agree: a smooth point
        if _close(a, b) and (_close(a, fd[i], rtol=1e-4, atol=1e-5) or not smooth):
            continue
        if _close(a, fd[i], rtol=1e-4, atol=1e-5) and (not smooth or _error(a, fd[i]) < _error(b, fd[i]) / 10):
            continue  # torch's forward mode is the one that is off here (finite differences side with us)
        diff = (a - b.to(a.dtype)).abs().nan_to_num(float("inf")).max().item() if a.shape == b.shape else "shape"
        raise AssertionError(f"output {i}: tangent differs from torch.func.jvp (max |diff| {diff}) and from "
                             "finite differences")
    return TRANSPOSED if any(how != "tangent rule" for how in methods.values()) else DUAL


def judge(op: Any, limit: Optional[int] = 2) -> Verdict:
    name = coverage.op_key(op)
    if getattr(op.gradcheck_wrapper, "__name__", "") == "wrapper_set_seed":
        return Verdict(name, SKIPPED, "random op")
    statuses, refused, skipped = [], "", "no samples"
    for index, sample in enumerate(coverage.samples(op, limit)):
        try:
            statuses.append(compare(op, sample))
        except Skip as exc:
            skipped = str(exc)
        except AssertionError as exc:
            return Verdict(name, WRONG, f"sample {index} {coverage.describe_sample(sample)}: {exc}")
        except Exception as exc:
            if coverage.is_refusal(exc):
                refused = refused or f"sample {index}: {type(exc).__name__}: {str(exc).splitlines()[0]}"
                continue
            return Verdict(name, WRONG, f"sample {index} {coverage.describe_sample(sample)}: crashed: "
                           f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    if refused:
        return Verdict(name, REFUSED, refused)
    if not statuses:
        return Verdict(name, SKIPPED, skipped)
    return Verdict(name, TRANSPOSED if TRANSPOSED in statuses else DUAL)


def main(argv: List[str]) -> None:
    """python -m tests.forward.opinfo_jvp [--full] [NAME ...]: --full runs every sample, not the first two."""
    limit = None if "--full" in argv else 2
    only = set(argv) - {"--full"}
    ops = [op for op in coverage.judged_ops() if coverage.op_key(op) in coverage_passing() and
           (not only or coverage.op_key(op) in only)]
    counts: dict = {}
    for op in ops:
        verdict = judge(op, limit)
        counts[verdict.status] = counts.get(verdict.status, 0) + 1
        if verdict.status != DUAL or only:
            print(f"{verdict.name:40s} {verdict.status:10s} {verdict.detail}", flush=True)
    print(counts)


def coverage_passing() -> set:
    from pathlib import Path

    text = (Path(__file__).parent.parent / "opinfo_passing.txt").read_text()
    return {line.strip() for line in text.splitlines() if line.strip()}


if __name__ == "__main__":
    main(sys.argv[1:])
