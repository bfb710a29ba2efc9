"""One-line op tests: run a function on tracers and under torch autograd, then against finite differences."""
import contextlib
import functools
import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

import pytest
import torch

import torchtrace as tt
from torchtrace.autograd.state import LANES_ON
from torchtrace.lanes.operators import OPERATORS
from torchtrace.nested import flatten


def as_double(inputs: Any) -> list:
    leaves, rebuild = flatten(list(inputs))
    return rebuild([x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in leaves])


def check_op(fn: Callable, *inputs: Any, rtol: float = 1e-5, atol: float = 1e-6, gradcheck: bool = True,
             gradcheck_atol: float = 1e-5) -> None:
    """tt.check in the inputs' own dtype, and tt.gradcheck on float64 copies."""
    report = tt.check(fn, *inputs, rtol=rtol, atol=atol)
    assert report.ok
    if gradcheck:
        assert tt.gradcheck(fn, *as_double(inputs), atol=gradcheck_atol)


def non_contiguous(t: torch.Tensor) -> torch.Tensor:
    """The same values laid out non-contiguously (a transposed copy viewed back)."""
    if t.dim() < 2:
        return torch.stack([t, t], -1)[..., 0]
    return t.transpose(0, 1).contiguous().transpose(0, 1)


def double_backward_matches(fn: Callable, *inputs: torch.Tensor) -> None:
    """Gradient of (sum of first-order gradients) w.r.t. the inputs: torchtrace create_graph vs torch."""
    ours = [tt.tracer(x, requires_grad=True) for x in inputs]
    grads = tt.grad(fn(*ours).sum(), ours, create_graph=True)
    second = tt.grad(sum((g * g).sum() for g in grads), ours, allow_unused=True)
    theirs = [x.detach().clone().requires_grad_(True) for x in inputs]
    out = fn(*theirs).sum()
    total = sum((g * g).sum() for g in _torch_grads(out, theirs))
    expected = _torch_grads(total, theirs)
    for a, b in zip(second, expected):
        a = torch.zeros_like(b) if a is None else a
        torch.testing.assert_close(a.as_subclass(torch.Tensor), b, rtol=1e-5, atol=1e-6)


def _torch_grads(out: torch.Tensor, inputs: list) -> list:
    grads = [torch.zeros_like(x) for x in inputs]
    for x in inputs:
        x.grad = None
    out.backward(create_graph=True, inputs=inputs)
    for i, x in enumerate(inputs):
        if x.grad is not None:
            grads[i] = x.grad
        x.grad = None
    return grads


EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def load_example(name: str) -> ModuleType:
    """Import examples/<name>.py as a module (examples/ is not a package)."""
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# The original torchtrace README's snippet C: how its myConv model prints, and its backprop trace.
ORIGINAL_SNIPPET_C_MODEL = """\
Sequence(
    (0):Sequence(
        (0):Conv2d 3 -> 8
        (1):ReLU()
        (2):Conv2d 8 -> 4
        (3):ReLU()
        (4):Conv2d 4 -> 2
        (5):ReLU()
    )
    (1):Linear layer (98 X 1)
)"""
ORIGINAL_SNIPPET_C_TRACE = """\
BackProp:
↘︎ Sum()
↘︎ Linear layer (98 X 1)
↘︎ View((3, -1))
↘︎ ReLU()
↘︎ Conv2d 4 -> 2   GRAD:torch.Size([3, 2, 7, 7]) -> torch.Size([3, 4, 9, 9])
↘︎ ReLU()
↘︎ Conv2d 8 -> 4   GRAD:torch.Size([3, 4, 9, 9]) -> torch.Size([3, 8, 20, 20])
↘︎ ReLU()
↘︎ Conv2d 3 -> 8   GRAD:torch.Size([3, 8, 20, 20]) -> torch.Size([3, 3, 84, 84])
↘︎ Input"""


def float_tolerances(dtype: torch.dtype) -> dict:
    """check_op tolerances: float32 sums of many products round differently from torch's kernels."""
    return {"rtol": 1e-4, "atol": 1e-5} if dtype == torch.float32 else {}


def callables_dispatched(monkeypatch: Any) -> set:
    """The torch callables whose rule the dispatcher runs from now on (for 'every rule is exercised' tests)."""
    from torchtrace.autograd import dispatch
    from torchtrace.autograd.function import RULES

    seen: set = set()
    run_rule = dispatch.run_rule

    def spy(tracer_type: type, rule: type, func: Any, args: tuple, kwargs: dict) -> Any:
        seen.add(func)
        return run_rule(tracer_type, rule, func, args, kwargs)

    monkeypatch.setattr(dispatch, "run_rule", spy)
    entry = tt.tracer.__torch_function__.__func__  # a rule's common call takes its generated lane, not run_rule

    def entry_spy(cls: type, func: Any, types: Any, args: tuple = (), kwargs: Any = None) -> Any:
        if func in RULES:
            seen.add(func)
        return entry(cls, func, types, args, kwargs)

    monkeypatch.setattr(tt.tracer, "__torch_function__", classmethod(entry_spy))
    for name in OPERATORS:  # a * b on tracers goes to its lane without the entry (lanes/operators.py): torch's again
        if name in vars(tt.tracer):  # (with the lanes off the class has none of its own)
            monkeypatch.delattr(tt.tracer, name)
    return seen


# tests of the generated lanes themselves, skipped in a run on the readable path (TORCHTRACE_READABLE=1)
needs_lanes = pytest.mark.skipif(not LANES_ON[0], reason="TORCHTRACE_READABLE=1: the fast lanes are off for this run")


# ---- tables of cases, {name: (fn, [shape of each input])}, as the tests of ops/construction, distances, ... use ----

def rand(shapes: Any, dtype: torch.dtype) -> list:
    """One standard-normal tensor per shape."""
    return [torch.randn(s, dtype=dtype) for s in shapes]


def check_case(fn: Callable, shapes: Any, dtype: torch.dtype = torch.float64, contiguous: bool = True) -> None:
    """check_op on random inputs of these shapes in `dtype` (float32 with float32's tolerances); the first input
    laid out non-contiguously with contiguous=False."""
    inputs = rand(shapes, dtype)
    if not contiguous:
        inputs[0] = non_contiguous(inputs[0])
        assert not inputs[0].is_contiguous()
    check_op(fn, *inputs, **float_tolerances(dtype))


def check_case_double_backward(fn: Callable, shapes: Any) -> None:
    """double_backward_matches on random float64 inputs of these shapes."""
    double_backward_matches(fn, *rand(shapes, torch.float64))


def assert_every_rule_exercised(seen: set, module: str, cases: Any = None, exempt: Any = ()) -> None:
    """Every torch callable that a rule of `module` is registered for is in `seen` (see callables_dispatched), but
    those in `exempt` (callables, or rule classes for all of theirs). With a table of `cases`, each is first called
    once on float64 leaf tracers."""
    from torchtrace.autograd.function import RULES

    for fn, shapes in (cases or {}).values():
        fn(*[tt.tracer(x, requires_grad=True) for x in rand(shapes, torch.float64)])
    registered = {f for f, rule in RULES.items() if rule.__module__ == module}
    missing = {f for f in registered - seen if f not in exempt and RULES[f] not in exempt}
    assert registered and not missing, f"no test case calls {sorted(map(str, missing))}"


# ---- PyTorch's OpInfo samples -----------------------------------------------------------------------------------

def opinfos(names: Any) -> dict:
    """{name: [the OpInfos of that name that support autograd]} for the OpInfo names in `names`."""
    return _opinfos(frozenset(names))


@functools.lru_cache(maxsize=None)
def _opinfos(names: frozenset) -> dict:
    from torch.testing._internal.common_methods_invocations import op_db

    found: dict = {}
    for op in op_db:
        if op.name in names and op.supports_autograd:
            found.setdefault(op.name, []).append(op)
    return found


def sample_as_function(sample: Any, call: Callable) -> tuple:
    """(fn of the sample's tensors that require grad, those tensors): fn returns call(input, *args, **kwargs) with
    the sample's other arguments held fixed."""
    leaves, rebuild = flatten([sample.input, list(sample.args), dict(sample.kwargs)])
    positions = [k for k, x in enumerate(leaves) if isinstance(x, torch.Tensor) and x.requires_grad]
    fixed = [x.detach() if isinstance(x, torch.Tensor) else x for x in leaves]

    def fn(*tensors: torch.Tensor) -> Any:
        values = list(fixed)
        for k, t in zip(positions, tensors):
            values[k] = t
        input, args, kwargs = rebuild(values)
        return call(input, *args, **kwargs)

    return fn, [fixed[k] for k in positions]


@contextlib.contextmanager
def keep_values_budget(n: int):
    """Within the block, tt.explore.keep_values(n): graphs keep up to n bytes of their ops' values; then the budget
    before."""
    before = tt.explore.keep_values()
    tt.explore.keep_values(n)
    try:
        yield
    finally:
        tt.explore.keep_values(before)


# ------------------------------------------------------------------ the catalogue of example Functions
# One definition each, for every test that needs a user's Function: a right one, and deliberately wrong ones
# that tt.check, tt.explore and the OpInfo coverage must catch.

class Cube(tt.Function):
    """y = x^3 -> dy/dx = 3 x^2"""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x * x

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * 3 * x * x


class WrongCube(Cube):
    """y = x^3 -> dy/dx = 3 x^2, with a deliberately wrong backward (6 x^2: off by a factor of 2)"""

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * 6 * x * x


class WrongSquare(tt.Function):
    """y = x^2 -> dy/dx = 2x, with a deliberately wrong backward (x: it forgets the 2), for tests that must catch it"""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * x


class TorchSquare(torch.autograd.Function):
    """y = x^2 -> dy/dx = 2x, as a torch autograd Function (torchtrace runs its forward/backward as one node)"""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 2 * g * x


class RoundSTE(torch.autograd.Function):
    """Straight-through estimator: round forward, identity backward (a surrogate gradient on purpose)."""

    @staticmethod
    def forward(ctx, x):
        return torch.round(x)

    @staticmethod
    def backward(ctx, g):
        return g


class ExpSaveOutput(torch.autograd.Function):
    """y = exp(x), saving its output (torch's own Function API, run on tracers through the bridge)."""

    @staticmethod
    def forward(ctx, x):
        y = torch.exp(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return g * y
