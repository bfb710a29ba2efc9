"""OpInfo coverage: PyTorch's own op database run on tracers and under torch autograd, op by op.

`python -m torchtrace ops --coverage [--full] [--samples N] [--only NAME ...] [--device cuda]` prints one line per
judged op and the totals. An op is *judged* when its OpInfo entry (counted once per `name` + `variant_test_name`,
e.g. `max_pool2d_with_indices_backward` and `norm.nuc` are two ops) supports autograd and has float64 samples on
the device (the CPU unless `--device` names another; both sides then run there). Each sample runs in every form
the entry offers -- the function (`op.op`), the method, the operator, and the in-place twins on a clone of the
input -- through the entry's own `gradcheck_wrapper`,
and is compared with torch autograd in float64: forward values, the gradient of every tensor input that
requires grad (tensors inside list arguments included), and second derivatives where the entry
`supports_gradgrad`. Verdicts:

- PASS: every sample tried matches torch in every form.
- unsupported: torchtrace refused clearly somewhere (an UnsupportedOperationError or a documented refusal,
  see `is_refusal`), and nothing differed.
- WRONG: a value or gradient differs from torch, a gradient is missing, or torchtrace crashed with an
  error that is not a clear refusal. The first failing sample is printed: these are the defects to fix first.
- skipped: nothing could be compared (torch itself rejected every sample, or the op draws random numbers
  differently from torch).
"""
import itertools
import os
import sys
import time
import traceback
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Iterable, List, Optional, Sequence, Tuple

import torch

from torchtrace.autograd.engine import grad as tt_grad
from torchtrace.autograd.plain import plain_torch
from torchtrace.errors import UnsupportedOperationError
from torchtrace.factories import as_tracer
from torchtrace.nested import flatten

PASS, UNSUPPORTED, WRONG, SKIPPED = "PASS", "unsupported", "WRONG", "skipped"
RTOL, ATOL = 1e-6, 1e-7
# A sample that mixes in a lower-precision tensor (cov's float32 aweights) is compared at that dtype's tolerances
# (torch.testing's defaults): both sides round through it, in different orders on different devices.
LOWER_PRECISION = {torch.float32: (1.3e-6, 1e-5), torch.float16: (1e-3, 1e-5), torch.bfloat16: (1.6e-2, 1e-5)}

# torchtrace's documented refusals that are RuntimeErrors (as torch's own refusals are): in-place changes of a
# view or a leaf, out= on tracers. Anything else torchtrace raises where torch succeeds is a crash.
REFUSAL_MARKERS = (
    "torchtrace cannot",
    "is not supported on tracers",
    "leaf tracer that requires grad is used in the in-place",
    "changes a view of another tensor in place",
)

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def is_refusal(exc: BaseException) -> bool:
    """A clear, documented torchtrace refusal (as opposed to a crash).

    A bare NotImplementedError raised by a torchtrace rule (the older refusal style, being moved to
    UnsupportedOperationError) also counts; `run` reports how many refusals still use it.
    """
    if isinstance(exc, UnsupportedOperationError):
        return True
    if isinstance(exc, NotImplementedError):
        return _raised_in_torchtrace(exc)
    return isinstance(exc, RuntimeError) and any(marker in str(exc) for marker in REFUSAL_MARKERS)


def _raised_in_torchtrace(exc: BaseException) -> bool:
    frames = traceback.extract_tb(exc.__traceback__)
    return bool(frames) and frames[-1].filename.startswith(_PACKAGE_DIR)


class Mismatch(Exception):
    """A value or gradient that differs from torch's (`near`: within 10 times the tolerances)."""

    near = False


class Skip(Exception):
    """Nothing to compare for this sample (torch rejected it, or it is random)."""


@dataclass
class OpResult:
    """The verdict for one judged op, with the first sample that decided it."""

    name: str
    status: str
    detail: str = ""
    samples: int = 0
    bare_refusal: bool = False  # refused with a bare NotImplementedError rather than UnsupportedOperationError


def op_key(op: Any) -> str:
    """How the coverage report names an op: `name` or `name.variant_test_name`."""
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


def judged_ops(device: str = "cpu") -> list:
    """The OpInfo entries that support autograd and have float64 samples on `device`."""
    from torch.testing._internal.common_methods_invocations import op_db

    kind = torch.device(device).type
    return [op for op in op_db if op.supports_autograd and torch.float64 in op.supported_dtypes(kind)]


def _plain(t: torch.Tensor) -> torch.Tensor:
    with plain_torch():
        return t.detach().as_subclass(torch.Tensor)


def _map(tree: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    if isinstance(tree, torch.Tensor):
        return fn(tree)
    if isinstance(tree, (list, tuple)) and type(tree) in (list, tuple):
        return type(tree)(_map(item, fn) for item in tree)
    if isinstance(tree, dict):
        return {k: _map(v, fn) for k, v in tree.items()}
    return tree


def _copies(sample: Any, make: Callable[[torch.Tensor, bool], torch.Tensor]) -> Tuple[Any, tuple, dict, list]:
    """Fresh copies of a sample's input/args/kwargs; the leaves that require grad, in order."""
    leaves: List[torch.Tensor] = []

    def copy(t: torch.Tensor) -> torch.Tensor:
        wants = bool(t.requires_grad) and (t.is_floating_point() or t.is_complex())
        new = make(_plain(t).clone(), wants)
        if wants:
            leaves.append(new)
        return new

    inp = _map(sample.input, copy)
    args = _map(tuple(sample.args), copy)
    kwargs = _map(dict(sample.kwargs), copy)
    return inp, args, kwargs, leaves


def _torch_leaf(t: torch.Tensor, wants: bool) -> torch.Tensor:
    return t.requires_grad_(wants)


def _tt_leaf(t: torch.Tensor, wants: bool) -> torch.Tensor:
    return as_tracer(t, requires_grad=wants)


def _weights(tensors: Sequence[Optional[torch.Tensor]], seed: int) -> List[Optional[torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    return [None if t is None else torch.randn(t.shape, generator=generator, dtype=t.dtype).to(t.device)
            for t in tensors]


def _torch_grads(outputs: list, weights: list, leaves: list, create_graph: bool) -> List[Optional[torch.Tensor]]:
    """d(sum of outputs * weights)/d(leaves) with torch autograd (via Tensor.backward, read from .grad)."""
    terms = [(o * w).sum() for o, w in zip(outputs, weights)]
    for x in leaves:
        x.grad = None
    if terms:
        sum(terms).backward(inputs=leaves, create_graph=create_graph)
    grads = [x.grad for x in leaves]
    for x in leaves:
        x.grad = None
    return grads


def tolerances(sample: Any) -> Tuple[float, float]:
    """(rtol, atol) for a sample: float64's, or the loosest of the lower-precision floating tensors it holds."""
    tensors = [t for t in flatten([sample.input, list(sample.args), sample.kwargs])[0] if isinstance(t, torch.Tensor)]
    return max([(RTOL, ATOL)] + [LOWER_PRECISION[t.dtype] for t in tensors if t.dtype in LOWER_PRECISION])


def _agrees_in_float64(op: Any, fn: Callable, sample: Any, gradgrad: bool) -> bool:
    """The tie-breaker for a sample that mixes in float32 / float16 / bfloat16 tensors and differs from torch beyond
    that dtype's tolerances, but within 10 times them (a second derivative through cov's float32 weights, say): the
    same sample with those tensors in float64 matches torch at float64's tolerances (so the rule's math is right, and
    the difference is rounding through the low-precision tensor, which torch's formula rounds in another order)."""
    def widen(t: torch.Tensor) -> torch.Tensor:
        return _plain(t).double().requires_grad_(t.requires_grad) if t.dtype in LOWER_PRECISION else t

    widened = type(sample)(_map(sample.input, widen), args=_map(tuple(sample.args), widen),
                           kwargs=_map(dict(sample.kwargs), widen),
                           output_process_fn_grad=sample.output_process_fn_grad)
    try:
        compare_sample(op, fn, widened, gradgrad)
    except Exception:
        return False
    return True


def _compare(what: str, ours: Any, theirs: Any, tolerance: Tuple[float, float] = (RTOL, ATOL)) -> None:
    if ours is None and theirs is None:
        return
    if theirs is None:
        theirs = torch.zeros_like(_plain(ours))
    if ours is None:
        ours = torch.zeros_like(theirs)
    ours, theirs = _plain(ours), _plain(theirs)
    if ours.shape != theirs.shape:
        raise Mismatch(f"{what}: shape {tuple(ours.shape)}, torch {tuple(theirs.shape)}")
    if ours.dtype != theirs.dtype and what.startswith("output"):
        raise Mismatch(f"{what}: dtype {ours.dtype}, torch {theirs.dtype}")
    if ours.is_floating_point() or ours.is_complex() or theirs.is_floating_point():
        close = torch.allclose(ours.to(theirs.dtype), theirs, rtol=tolerance[0], atol=tolerance[1], equal_nan=True)
        if not close:
            diff = (ours.to(theirs.dtype) - theirs).abs().nan_to_num(float("inf")).max().item()
            mismatch = Mismatch(f"{what} differs from torch: max |diff| = {diff:.3g}")
            mismatch.near = torch.allclose(ours.to(theirs.dtype), theirs, rtol=10 * tolerance[0],
                                           atol=10 * tolerance[1], equal_nan=True)
            raise mismatch
    elif not torch.equal(ours, theirs):
        raise Mismatch(f"{what} differs from torch")


def _differentiable(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.requires_grad


def _run(fn: Callable, inp: Any, args: tuple, kwargs: dict, sample: Any) -> list:
    out = fn(inp, *args, **kwargs)
    out = sample.output_process_fn_grad(out)
    return flatten(out)[0]


def compare_sample(op: Any, fn: Callable, sample: Any, gradgrad: bool) -> None:
    """Raise Mismatch / Skip / the tracer side's own exception; return when everything matches torch."""
    wrapper = op.gradcheck_wrapper
    call = lambda inp, *a, **k: wrapper(fn, inp, *a, **k)  # noqa: E731
    if any(t.layout != torch.strided for t in flatten([sample.input, list(sample.args), sample.kwargs])[0]
           if isinstance(t, torch.Tensor)):
        raise Skip("sparse input")
    tolerance = tolerances(sample)
    t_in, t_args, t_kwargs, t_leaves = _copies(sample, _torch_leaf)
    torch.manual_seed(0)
    try:
        theirs = _run(call, t_in, t_args, t_kwargs, sample)
    except Exception as exc:  # torch rejects this form of the sample: nothing to judge
        raise Skip(f"torch raised {type(exc).__name__}") from None
    o_in, o_args, o_kwargs, o_leaves = _copies(sample, _tt_leaf)
    torch.manual_seed(0)
    ours = _run(call, o_in, o_args, o_kwargs, sample)
    if len(ours) != len(theirs):
        raise Mismatch(f"{len(ours)} outputs, torch {len(theirs)}")
    for i, (a, b) in enumerate(zip(ours, theirs)):
        if isinstance(b, torch.Tensor):
            if not isinstance(a, torch.Tensor):
                raise Mismatch(f"output {i} is a {type(a).__name__}, torch gives a tensor")
            _compare(f"output {i}", a, b.detach(), tolerance)
    picked = [i for i, b in enumerate(theirs) if _differentiable(b)]
    for i in picked:
        if not _differentiable(ours[i]):
            raise Mismatch(f"output {i} carries no gradient in torchtrace (torch: it does)")
    if not picked or not t_leaves:
        return
    weights = _weights([theirs[i] for i in picked], seed=1)
    try:
        expected = _torch_grads([theirs[i] for i in picked], weights, t_leaves, create_graph=gradgrad)
    except Exception as exc:
        raise Skip(f"torch backward raised {type(exc).__name__}") from None
    got = tt_grad([ours[i] for i in picked], o_leaves, weights, create_graph=gradgrad, allow_unused=True)
    for k, (a, b) in enumerate(zip(got, expected)):
        _compare(f"gradient of input {k}", a, b, tolerance)
    if gradgrad:
        _compare_second(got, expected, o_leaves, t_leaves, tolerance)


def _compare_second(got: Sequence[Any], expected: Sequence[Any], o_leaves: list, t_leaves: list,
                    tolerance: Tuple[float, float]) -> None:
    """d(sum of first gradients * fixed weights)/d(inputs), torchtrace (create_graph) vs torch."""
    weights = _weights(expected, seed=2)
    t_terms = [(g, w) for g, w in zip(expected, weights) if _differentiable(g)]
    try:
        second_theirs = _torch_grads([g for g, _ in t_terms], [w for _, w in t_terms], t_leaves, False)
    except Exception as exc:
        raise Skip(f"torch double backward raised {type(exc).__name__}") from None
    o_terms = [(g, w) for g, w in zip(got, weights) if _differentiable(g) and w is not None]  # torch: None = no term
    if o_terms:
        total = sum((g * w).sum() for g, w in o_terms)
        second_ours = tt_grad(total, o_leaves, allow_unused=True)
    else:
        second_ours = [None] * len(o_leaves)
    for k, (a, b) in enumerate(zip(second_ours, second_theirs)):
        _compare(f"second derivative of input {k}", a, b, tolerance)


def variants(op: Any) -> List[Tuple[str, Callable]]:
    """(label, callable) for each form of the op: function, method, operator, and in-place ones on a clone."""
    forms: List[Tuple[str, Callable]] = [("function", op.op)]
    for label, attr in (("method", "method_variant"), ("operator", "operator_variant")):
        variant = getattr(op, attr, None)
        if variant is not None:
            forms.append((label, variant))
    for label, attr in (("inplace", "inplace_variant"), ("inplace operator", "inplace_operator_variant")):
        variant = getattr(op, attr, None)
        if variant is not None:
            forms.append((label, _on_clone(variant)))
    return forms


def _on_clone(inplace: Callable) -> Callable:
    def run(inp: Any, *args: Any, **kwargs: Any) -> Any:
        return inplace(inp.clone() if isinstance(inp, torch.Tensor) else inp, *args, **kwargs)

    return run


def describe_sample(sample: Any) -> str:
    """A short readable description of a sample: shapes and values of scalars."""
    def show(x: Any) -> str:
        if isinstance(x, torch.Tensor):
            grad = ", requires_grad" if x.requires_grad else ""
            return f"tensor{tuple(x.shape)}[{str(x.dtype).replace('torch.', '')}{grad}]"
        if isinstance(x, (list, tuple)) and type(x) in (list, tuple):
            inner = ", ".join(show(e) for e in x)
            return f"[{inner}]" if isinstance(x, list) else f"({inner})"
        return repr(x)

    parts = [show(sample.input)] + [show(a) for a in sample.args]
    parts += [f"{k}={show(v)}" for k, v in sample.kwargs.items()]
    return "(" + ", ".join(parts) + ")"


def samples(op: Any, limit: Optional[int], device: str = "cpu") -> Iterable[Any]:
    """The op's float64 samples. Its sample function is called directly: op.sample_inputs walks the Python stack
    to seed each sample from the calling test's name (slow under pytest, and a different seed per caller)."""
    torch.manual_seed(0)
    generated = iter(op.sample_inputs_func(op, device, torch.float64, True))
    return itertools.islice(generated, limit) if limit else generated


def judge(op: Any, limit: Optional[int] = 3, device: str = "cpu") -> OpResult:
    """Run up to `limit` samples of one op on `device` in every form; never raises."""
    name = op_key(op)
    random = getattr(op.gradcheck_wrapper, "__name__", "") == "wrapper_set_seed"
    gradgrad = bool(op.supports_gradgrad)
    compared = 0
    refused: Optional[str] = None
    bare = False
    skipped = "no samples"
    try:
        sample_list = list(samples(op, limit, device))
    except Exception as exc:
        return OpResult(name, SKIPPED, f"sample_inputs raised {type(exc).__name__}: {exc}")
    for index, sample in enumerate(sample_list):
        for label, fn in variants(op):
            where = f"sample {index} {describe_sample(sample)}, {label} form"
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    compare_sample(op, fn, sample, gradgrad)
                compared += 1
            except Skip as exc:
                skipped = str(exc)
                continue
            except Mismatch as exc:
                if random and str(exc).startswith("output"):
                    return OpResult(name, SKIPPED, f"random op: forward draws differ from torch ({exc})")
                if exc.near and tolerances(sample) != (RTOL, ATOL) and _agrees_in_float64(op, fn, sample, gradgrad):
                    compared += 1  # rounding through the low-precision tensor, in another order than torch's
                    continue
                return OpResult(name, WRONG, f"{where}: {exc}", compared)
            except Exception as exc:
                if is_refusal(exc):
                    if refused is None:
                        refused = f"{where}: {type(exc).__name__}: {_first_line(exc)}"
                        bare = type(exc) is NotImplementedError
                    continue
                crash = "".join(traceback.format_exception_only(type(exc), exc)).strip()
                return OpResult(name, WRONG, f"{where}: torchtrace crashed: {_first_line(crash)}", compared)
    if refused:
        return OpResult(name, UNSUPPORTED, refused, compared, bare)
    if compared == 0:
        return OpResult(name, SKIPPED, f"nothing compared (last sample: {skipped})", 0)
    return OpResult(name, PASS, "", compared)


def _first_line(exc: Any) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__


def run(limit: Optional[int] = 3, only: Optional[Sequence[str]] = None, out: Any = None,
        device: str = "cpu") -> List[OpResult]:
    """Judge every op (or those named in `only`) on `device`, printing one line per op as it goes."""
    out = out or sys.stdout
    results = []
    ops = [op for op in judged_ops(device) if not only or op_key(op) in only or op.name in only]
    unknown = sorted(set(only or ()) - {name for op in ops for name in (op_key(op), op.name)})
    if unknown:
        raise ValueError(f"no judged OpInfo entry is named {', '.join(unknown)} (OpInfo's names, e.g. "
                         "nn.functional.dropout, norm.nuc; `python -m torchtrace ops --coverage` lists them all)")
    for op in ops:
        start = time.perf_counter()
        result = judge(op, limit, device)
        seconds = time.perf_counter() - start
        results.append(result)
        print(f"{result.status:<12} {result.name:<45} {seconds:6.2f}s  {result.detail}", file=out, flush=True)
    return results


def totals(results: Sequence[OpResult]) -> str:
    """One line: judged ops and the count per verdict."""
    counts = {status: sum(r.status == status for r in results) for status in (PASS, UNSUPPORTED, WRONG, SKIPPED)}
    legacy = sum(r.status == UNSUPPORTED and r.bare_refusal for r in results)
    return (f"judged ops: {len(results)} (OpInfo name + variant_test_name, supports_autograd, float64) -- "
            f"PASS {counts[PASS]}, unsupported {counts[UNSUPPORTED]} ({legacy} of them refused with a bare "
            f"NotImplementedError), WRONG {counts[WRONG]}, skipped {counts[SKIPPED]}")


def main(full: bool = False, limit: int = 3, only: Optional[Sequence[str]] = None,
         device: str = "cpu") -> List[OpResult]:
    """`python -m torchtrace ops --coverage`: the table, the WRONG ops again, and the totals."""
    results = run(None if full else limit, only, device=device)
    wrong = [r for r in results if r.status == WRONG]
    if wrong:
        print("\nWRONG (a value or gradient differs from torch, or torchtrace crashed):")
        for r in wrong:
            print(f"  {r.name}: {r.detail}")
    print("\n" + totals(results))
    return results
