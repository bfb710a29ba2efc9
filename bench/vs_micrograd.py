"""One training step of the same small MLP in micrograd, torchtrace and torch autograd.

    pip install -c constraints.txt -e ".[bench]"    # micrograd
    python bench/vs_micrograd.py

micrograd differentiates scalars (one Python object per number); torchtrace and torch differentiate
tensors. The MLP is micrograd's own (2 -> 16 -> 16 -> 1, ReLU), on 32 points; the three run in turn, round
after round, and the script prints the median ratio and the range of the middle half of the rounds' ratios.
"""
import random
import statistics
import time
from typing import Callable, List

import torch

import torchtrace as tt


def points(n: int = 32) -> List[List[float]]:
    rng = random.Random(0)
    return [[rng.uniform(-1, 1), rng.uniform(-1, 1)] for _ in range(n)]


def median_seconds(step: Callable[[], None], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def micrograd_step(xs: List[List[float]], ys: List[float]) -> Callable[[], None]:
    from micrograd.nn import MLP

    random.seed(0)
    model = MLP(2, [16, 16, 1])

    def step() -> None:
        loss = sum((model(x) - y) ** 2 for x, y in zip(xs, ys))
        model.zero_grad()
        loss.backward()

    return step


def tensor_step(make: Callable, xs: List[List[float]], ys: List[float]) -> Callable[[], None]:
    torch.manual_seed(0)
    shapes = [(2, 16), (16,), (16, 16), (16,), (16, 1), (1,)]
    params = [make(torch.randn(s) * 0.5) for s in shapes]
    x, y = torch.tensor(xs), torch.tensor(ys).unsqueeze(1)

    def step() -> None:
        w1, b1, w2, b2, w3, b3 = params
        out = torch.relu(torch.relu(x @ w1 + b1) @ w2 + b2) @ w3 + b3
        loss = ((out - y) ** 2).sum()
        for p in params:
            p.grad = None
        loss.backward()

    return step


def main(rounds: int = 7) -> None:
    """Interleaves the three contenders round by round, so that a burst of load on a shared machine hits all
    of them; prints the median time per step, the median per-round ratio and the middle half of those ratios."""
    xs = points()
    ys = [1.0 if a * b > 0 else -1.0 for a, b in xs]
    steps = {
        "micrograd": (micrograd_step(xs, ys), 1),
        "torchtrace": (tensor_step(lambda t: tt.as_tracer(t, requires_grad=True), xs, ys), 30),
        "torch autograd": (tensor_step(lambda t: t.requires_grad_(), xs, ys), 30),
    }
    for step, _ in steps.values():  # warm up
        step()
    times: dict = {name: [] for name in steps}
    for _ in range(rounds):
        for name, (step, repeats) in steps.items():
            times[name].append(median_seconds(step, repeats))
    base = times["torch autograd"]
    for name, seconds in times.items():
        ratios = sorted(t / b for t, b in zip(seconds, base))
        low, high = ratios[len(ratios) // 4], ratios[-1 - len(ratios) // 4]
        print(f"{name:<15} {statistics.median(seconds) * 1e3:9.3f} ms/step   {statistics.median(ratios):8.1f}x torch "
              f"autograd (middle half of the rounds: {low:.1f}x-{high:.1f}x)")


if __name__ == "__main__":
    main()
