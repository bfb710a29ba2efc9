"""Table machinery shared by the elementwise rule tests (test_trigonometric, test_special, test_rounding; test_pointwise
takes Arg, case and DTYPES).

An `Arg` is drawn once, in float64, at collection; each test makes it in its own dtype (and lays it out
non-contiguously on request). `run` checks a case against torch autograd in that dtype and, for float64,
against finite differences.
"""
from typing import Any, Callable, List, Sequence, Tuple

import pytest
import torch
from helpers import check_op, float_tolerances, non_contiguous
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import mutually_broadcastable_shapes

import torchtrace as tt

DTYPES = pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
NAN, INF = float("nan"), float("inf")
_gen = torch.Generator().manual_seed(0)


class Arg:
    """An input made at test time in the test's dtype (float64 data is drawn once, at collection)."""

    def __init__(self, data: torch.Tensor, nc: bool = False):
        self.data, self.nc = data, nc

    def make(self, dtype: torch.dtype) -> torch.Tensor:
        t = self.data.to(dtype) if self.data.is_floating_point() else self.data.clone()
        return non_contiguous(t) if self.nc else t

    def __add__(self, shift: float) -> "Arg":
        return Arg(self.data + shift, self.nc)

    def __sub__(self, shift: float) -> "Arg":
        return Arg(self.data - shift, self.nc)


def uniform(low: float, high: float, *shape: int, nc: bool = False) -> Arg:
    """Values drawn uniformly from [low, high)."""
    return Arg(torch.rand(shape, generator=_gen, dtype=torch.float64) * (high - low) + low, nc)


def signed(low: float, high: float, *shape: int, nc: bool = False) -> Arg:
    """|x| in [low, high) with a random sign: away from 0 and from the kinks of sign-like functions."""
    sign = torch.where(torch.rand(shape, generator=_gen) < 0.5, -1.0, 1.0).double()
    return Arg(sign * uniform(low, high, *shape).data, nc)


def double(low: float, high: float, *shape: int) -> torch.Tensor:
    """A plain float64 tensor uniform in [low, high) (double-backward cases take tensors, not Args)."""
    return uniform(low, high, *shape).data


def values(*vals: float) -> Arg:
    """Exact values (edges: 0, -0, +-inf, NaN, domain boundaries)."""
    return Arg(torch.tensor(vals, dtype=torch.float64))


def integers(*vals: int) -> Arg:
    return Arg(torch.tensor(vals))


def case(name: str, fn: Callable, *args: Any) -> Any:
    return pytest.param(fn, args, id=name)


def run(fn: Callable, args: Sequence[Any], dtype: torch.dtype, gradcheck: bool = True) -> None:
    """tt.check in `dtype`; the finite-difference check (always float64) runs with the float64 case."""
    inputs = [a.make(dtype) if isinstance(a, Arg) else a for a in args]
    check_op(fn, *inputs, gradcheck=gradcheck and dtype == torch.float64, **float_tolerances(dtype))


def run_edges(fn: Callable, args: Sequence[Any], dtype: torch.dtype) -> None:
    """Edge values: the same gradients (inf / NaN / 0 included) as torch autograd; no finite differences."""
    run(fn, args, dtype, gradcheck=False)


def broadcast_pair(shapes: Any, dtype: torch.dtype, seed: int, first: Tuple[float, float],
                   second: Tuple[float, float]) -> List[torch.Tensor]:
    """Two inputs of hypothesis-drawn broadcast-compatible shapes, uniform in the given ranges."""
    gen = torch.Generator().manual_seed(seed)
    return [(torch.rand(s, generator=gen, dtype=torch.float64) * (high - low) + low).to(dtype)
            for s, (low, high) in zip(shapes.input_shapes, (first, second))]


SHAPE_PAIRS = mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=3, min_side=1, max_side=4)
BROADCAST_SETTINGS = settings(max_examples=25, deadline=None)


def broadcast_test(table: dict) -> Callable:
    """A test over `table` (name -> (fn, range of a, range of b)): for every broadcast-compatible pair of shapes
    hypothesis draws, in float32 and float64, fn(a, b) matches torch autograd and both inputs get a gradient.
    A test module binds it: `test_broadcasting_property = broadcast_test(BROADCAST)`."""

    @pytest.mark.parametrize("name", list(table))
    @BROADCAST_SETTINGS
    @given(shapes=SHAPE_PAIRS, dtype=st.sampled_from([torch.float32, torch.float64]), seed=st.integers(0, 2 ** 16))
    def test_broadcasting_property(name: str, shapes: Any, dtype: torch.dtype, seed: int) -> None:
        fn, first, second = table[name]
        report = tt.check(fn, *broadcast_pair(shapes, dtype, seed, first, second), **float_tolerances(dtype))
        assert report.ok and report.n_gradients == 2

    return test_broadcasting_property
