"""python -m torchtrace demo | ops : a short tour in the terminal, or the list of supported torch callables."""
import argparse
from collections import defaultdict
from typing import List, Optional

import torch

import torchtrace as tt
from torchtrace.autograd.function import RULES, callable_name


def demo() -> None:
    """Record a graph, print its backprop trace, cross-check it, and fit a tiny model with its gradients."""
    print("1. A tracer records every torch call made on it.")
    x = tt.tracer([1.0, 2.0, 3.0], requires_grad=True)
    y = (x * x + 2 * x).Sum()
    print(f"   x = {x}\n   y = (x * x + 2 * x).Sum() = {y}")
    y.backward(show=True)
    print(f"   x.grad = {x.grad}   (dy/dx = 2x + 2)\n")

    print("2. Every gradient is checked against torch autograd and finite differences.")
    def fn(a, b):
        return torch.softmax(a @ b, dim=-1).log().mean()

    a, b = torch.randn(4, 3), torch.randn(3, 5)
    print(f"   tt.check:     {tt.check(fn, a, b)}")
    print(f"   tt.gradcheck: {tt.gradcheck(fn, a, b)}\n")

    print("3. Ordinary torch code trains on torchtrace's gradients (least squares, plain SGD).")
    torch.manual_seed(0)
    inputs = torch.randn(64, 3)
    targets = inputs @ torch.tensor([[2.0], [-1.0], [0.5]]) + 0.3
    w, bias = tt.zeros(3, 1, requires_grad=True), tt.zeros(1, requires_grad=True)
    for step in range(201):
        loss = ((inputs @ w + bias - targets) ** 2).mean()
        loss.backward()
        with torch.no_grad():
            for p in (w, bias):
                p -= 0.1 * p.grad
                p.grad = None
        if step % 50 == 0:
            print(f"   step {step:3d}  loss {loss.item():.6f}")
    print(f"   learned w = {[round(v, 3) for v in w.flatten().tolist()]}, b = {bias.item():.3f}\n")
    print(f"{len(RULES)} torch callables have hand-written gradient rules (python -m torchtrace ops lists them).")


def list_ops() -> None:
    """Print the supported torch callables grouped by the file that holds their rule."""
    families = defaultdict(list)
    for func, rule in RULES.items():
        families[rule.__module__.rsplit(".", 1)[-1]].append(callable_name(func))
    for family in sorted(families):
        print(f"{family} ({len(families[family])}):")
        for name in sorted(families[family]):
            print(f"    {name}")
    print(f"total: {len(RULES)}")


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m torchtrace", description=__doc__)
    parser.add_argument("command", choices=["demo", "ops"])
    args = parser.parse_args(argv)
    {"demo": demo, "ops": list_ops}[args.command]()


if __name__ == "__main__":
    main()
