"""One training step of the same small MLP in micrograd, torchtrace and torch autograd (pip install micrograd).

    python bench/vs_micrograd.py

micrograd differentiates scalars (one Python object per number); torchtrace and torch differentiate
tensors. The MLP is micrograd's own (2 -> 16 -> 16 -> 1, ReLU), on 32 points; times are medians.
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


def main() -> None:
    xs = points()
    ys = [1.0 if a * b > 0 else -1.0 for a, b in xs]
    results = {
        "micrograd": median_seconds(micrograd_step(xs, ys), 5),
        "torchtrace": median_seconds(tensor_step(lambda t: tt.as_tracer(t, requires_grad=True), xs, ys), 200),
        "torch autograd": median_seconds(tensor_step(lambda t: t.requires_grad_(), xs, ys), 200),
    }
    base = results["torch autograd"]
    for name, seconds in results.items():
        print(f"{name:<15} {seconds * 1e3:9.3f} ms/step   {seconds / base:8.1f}x torch autograd")


if __name__ == "__main__":
    main()
