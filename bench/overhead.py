"""torchtrace vs torch autograd, side by side in one process: forward + backward, interleaved, medians.

    python bench/overhead.py [--repeats 30] [--device cpu] [--threads 1]

Prints the ratio (torchtrace time / torch autograd time) and microseconds per op for
  * a chain of 200 small ops on 8x8 tensors (the per-op overhead of the Python engine), and
  * a chain of large 1024x1024 matmuls (where the arithmetic dominates).
"""
import argparse
import statistics
import time
from typing import Callable, List, Tuple

import torch

import torchtrace as tt


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
    start = time.perf_counter()
    fn(*leaves).backward()
    if device != "cpu":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def compare(name: str, fn: Callable, shapes: List[Tuple[int, ...]], n_ops: int, repeats: int, device: str,
            scale: float) -> float:
    plain = make_inputs(shapes, device, scale)
    ours = [tt.as_tracer(p.clone(), requires_grad=True) for p in plain]
    theirs = [p.clone().requires_grad_(True) for p in plain]
    for _ in range(3):  # warm-up
        one_step(fn, ours, device), one_step(fn, theirs, device)
    times_ours, times_theirs = [], []
    for _ in range(repeats):  # interleaved, so drifts in machine load hit both sides alike
        times_ours.append(one_step(fn, ours, device))
        times_theirs.append(one_step(fn, theirs, device))
    ours_s, theirs_s = statistics.median(times_ours), statistics.median(times_theirs)
    torch.testing.assert_close(ours[0].grad, theirs[0].grad, rtol=1e-3, atol=1e-3)
    ratio = ours_s / theirs_s
    print(f"{name:<28} torchtrace {ours_s / n_ops * 1e6:9.2f} us/op   torch autograd {theirs_s / n_ops * 1e6:9.2f} "
          f"us/op   ratio {ratio:5.2f}x")
    return ratio


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--large-repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, device {args.device}")
    compare("200 small ops (8x8)", small_chain, [(8, 8), (8, 8), (8, 8)], 201, args.repeats, args.device, 1.0)
    compare("4 matmuls (1024x1024)", matmul_chain, [(1024, 1024)] * 5, 5, args.large_repeats, args.device, 0.03)


if __name__ == "__main__":
    main()
