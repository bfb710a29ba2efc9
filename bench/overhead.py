"""torchtrace vs torch autograd, side by side in one process: forward + backward, interleaved, medians.

    python bench/overhead.py [--repeats 30] [--device cpu] [--threads 1] [--clock wall|thread]

Prints the ratio (torchtrace time / torch autograd time) and microseconds per op for
  * a chain of 200 small ops on 8x8 tensors (the per-op overhead of the Python engine),
  * a chain of large 1024x1024 matmuls (where the arithmetic dominates), and
  * the forward pass alone of the small chain against two floors: a "bare subclass" whose __torch_function__ is
    torch._C._disabled_torch_function_impl (torch then skips the handler), and a "retagging subclass" whose handler
    runs the op and retags the result with two attributes, the floor of any Python-level tracer; the ratio
    torchtrace / retagging is what recording costs on top of the unavoidable dispatch.
The chains' ratio is given of medians and of means: a median drops the rare steps in which Python's cyclic garbage
collector scans its oldest generation, which a training run pays on average (the mean keeps them).
Each torchtrace row is measured twice: on the generated fast lanes, and on the readable path (tt.readable()).
"""
import argparse
import contextlib
import statistics
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

import torchtrace as tt

# perf_counter (wall time) by default; --clock thread measures this thread's CPU time, which a machine shared with
# other jobs disturbs far less (torch runs on this thread alone with --threads 1).
CLOCK = [time.perf_counter]

def small_chain(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """200 elementwise ops: 100 x (mul, add)."""
    y = x
    for _ in range(100):
        y = y * a + b
    return y.sum()


def matmul_chain(x: torch.Tensor, *weights: torch.Tensor) -> torch.Tensor:
    y = x
    for w in weights:
        y = y @ w
    return y.sum()


def make_inputs(shapes: List[Tuple[int, ...]], device: str, scale: float) -> List[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return [(torch.rand(s, generator=generator) * scale).to(device) for s in shapes]


def one_step(fn: Callable, leaves: List[torch.Tensor], device: str) -> float:
    for leaf in leaves:
        leaf.grad = None
    if device != "cpu":
        torch.cuda.synchronize()
    start = CLOCK[0]()
    fn(*leaves).backward()
    if device != "cpu":
        torch.cuda.synchronize()
    return CLOCK[0]() - start


def readable_step(fn: Callable, leaves: List[torch.Tensor], device: str) -> float:
    with tt.readable():
        return one_step(fn, leaves, device)


def compare(name: str, fn: Callable, shapes: List[Tuple[int, ...]], n_ops: int, repeats: int, device: str,
            scale: float) -> float:
    plain = make_inputs(shapes, device, scale)
    ours = [tt.as_tracer(p.clone(), requires_grad=True) for p in plain]
    theirs = [p.clone().requires_grad_(True) for p in plain]
    for _ in range(3):  # warm-up
        one_step(fn, ours, device), readable_step(fn, ours, device), one_step(fn, theirs, device)
    times_ours, times_readable, times_theirs = [], [], []
    for _ in range(repeats):  # interleaved, so drifts in machine load hit all sides alike
        times_ours.append(one_step(fn, ours, device))
        times_readable.append(readable_step(fn, ours, device))
        times_theirs.append(one_step(fn, theirs, device))
    ours_s, readable_s, theirs_s = (statistics.median(t) for t in (times_ours, times_readable, times_theirs))
    torch.testing.assert_close(ours[0].grad, theirs[0].grad, rtol=1e-3, atol=1e-3)
    ratio = ours_s / theirs_s
    mean_ratio = statistics.mean(times_ours) / statistics.mean(times_theirs)
    print(f"{name:<28} torchtrace {ours_s / n_ops * 1e6:9.2f} us/op   torch autograd {theirs_s / n_ops * 1e6:9.2f} "
          f"us/op   ratio {ratio:5.2f}x (mean {mean_ratio:5.2f}x)   (readable path {readable_s / n_ops * 1e6:9.2f} "
          f"us/op, {readable_s / theirs_s:5.2f}x)")
    return ratio


class BareSubclass(torch.Tensor):
    """A subclass whose handler is torch's own pass-through: torch skips it, so this is plain torch plus a type."""

    __torch_function__ = torch._C._disabled_torch_function_impl


class RetaggingSubclass(torch.Tensor):
    """The cheapest intercepting subclass that marks its results: run the op, retag it, set two attributes."""

    @classmethod
    def __torch_function__(cls, func: Callable, types: tuple, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
        out = torch._C._disabled_torch_function_impl(func, types, args, kwargs or {})
        if type(out) is torch.Tensor:
            out.__class__ = cls
            out._node, out._requires_grad = None, True
        return out


def forward_only(repeats: int, device: str) -> None:
    """The small chain's forward: torchtrace (fast lanes, readable path), the two subclass floors, plain torch and
    torch autograd, interleaved, medians."""
    plain = make_inputs([(8, 8)] * 3, device, 1.0)
    ours = [tt.as_tracer(p.clone(), requires_grad=True) for p in plain]
    contenders = {
        "torchtrace": (ours, contextlib.nullcontext), "torchtrace, readable path": (ours, tt.readable),
        "bare subclass": ([p.clone().as_subclass(BareSubclass) for p in plain], contextlib.nullcontext),
        "retagging subclass": ([p.clone().as_subclass(RetaggingSubclass) for p in plain], contextlib.nullcontext),
        "plain torch, no grad": (plain, torch.no_grad),
        "torch autograd": ([p.clone().requires_grad_(True) for p in plain], contextlib.nullcontext),
    }
    times: Dict[str, List[float]] = {name: [] for name in contenders}
    for i in range(repeats + 3):
        for name, (leaves, block) in contenders.items():
            with block():
                start = CLOCK[0]()
                small_chain(*leaves)
                elapsed = CLOCK[0]() - start
            if i >= 3:  # the first rounds warm up
                times[name].append(elapsed / 201 * 1e6)
    us = {name: statistics.median(t) for name, t in times.items()}
    print("forward only, 200 small ops, us per op:")
    for name, value in us.items():
        print(f"    {name:<28} {value:7.2f}")
    print(f"    torchtrace / retagging subclass {us['torchtrace'] / us['retagging subclass']:4.2f}x   "
          f"torchtrace / bare subclass {us['torchtrace'] / us['bare subclass']:4.2f}x   readable / retagging "
          f"{us['torchtrace, readable path'] / us['retagging subclass']:4.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--large-repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--clock", choices=("wall", "thread"), default="wall",
                        help="wall: time.perf_counter; thread: time.thread_time (CPU time; use with --threads 1)")
    args = parser.parse_args()
    CLOCK[0] = time.thread_time if args.clock == "thread" else time.perf_counter
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, device {args.device}, clock {args.clock}")
    compare("200 small ops (8x8)", small_chain, [(8, 8), (8, 8), (8, 8)], 201, args.repeats, args.device, 1.0)
    compare("4 matmuls (1024x1024)", matmul_chain, [(1024, 1024)] * 5, 5, args.large_repeats, args.device, 0.03)
    forward_only(args.repeats, args.device)


if __name__ == "__main__":
    main()
