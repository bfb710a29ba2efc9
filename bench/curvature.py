"""Curvature: tt.hvp against torch.func's HVPs, and tt.spectrum's time and memory, in one process, interleaved.

    python bench/curvature.py [--repeats 7] [--threads 1]

An MLP 20-100-100-1 (tanh, 12 301 parameters) on a batch of 256 with an MSE loss: one Hessian-vector product along
a random direction as torch.func.jvp(torch.func.grad(f)) (forward-over-reverse), torch autograd's gradient of
<grad f, v> (reverse-over-reverse), tt.hvp with either method, and one torchtrace gradient (tt.grad) for scale;
the best of `--repeats` calls each, contenders taking turns. Then tt.spectrum(k=1, iterations=20) on an MLP
64-256-256-64-10 (99 530 parameters) with a batch of 512: its time, and its peak resident memory above the process
before the call (Linux's ru_maxrss, so it runs last).
"""
import argparse
import pathlib
import resource
import sys
import time
from typing import Callable, Dict, List

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))  # this checkout
import torchtrace as tt  # noqa: E402


def mlp(*sizes: int) -> torch.nn.Sequential:
    layers: List[torch.nn.Module] = []
    for a, b in zip(sizes, sizes[1:]):
        layers += [torch.nn.Linear(a, b), torch.nn.Tanh()]
    return torch.nn.Sequential(*layers[:-1])


def reverse_over_reverse(loss: Callable, params: tuple, v: tuple) -> tuple:
    leaves = [p.clone().requires_grad_(True) for p in params]
    grads = torch.autograd.grad(loss(*leaves), leaves, create_graph=True)
    return torch.autograd.grad(grads, leaves, v)


def forward(params: tuple, x: torch.Tensor) -> torch.Tensor:
    """The MLP written out (w1, b1, w2, b2, ...): tanh between the layers."""
    h = x
    for k in range(0, len(params), 2):
        h = h @ params[k].T + params[k + 1]
        if k + 2 < len(params):
            h = torch.tanh(h)
    return h


def hvp_contenders() -> Dict[str, Callable[[], object]]:
    torch.manual_seed(0)
    params = tuple(p.detach() for p in mlp(20, 100, 100, 1).parameters())
    x, y = torch.randn(256, 20), torch.randn(256, 1)
    v = tuple(torch.randn_like(p) for p in params)
    argnums = tuple(range(len(params)))

    def loss(*ps: torch.Tensor) -> torch.Tensor:
        return ((forward(ps, x) - y) ** 2).mean()

    leaves = [tt.as_tracer(p.clone(), requires_grad=True) for p in params]
    return {
        "torch.func jvp(grad) (forward-over-reverse)": lambda: torch.func.jvp(torch.func.grad(loss, argnums),
                                                                              params, v)[1],
        "torch autograd, grad of grad (reverse-over-reverse)": lambda: reverse_over_reverse(loss, params, v),
        "tt.hvp forward-over-reverse": lambda: tt.hvp(loss, params, v),
        "tt.hvp reverse-over-reverse": lambda: tt.hvp(loss, params, v, method="reverse-over-reverse"),
        "tt.grad (one gradient, for scale)": lambda: tt.grad(loss(*leaves), leaves),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    contenders = hvp_contenders()
    best = {name: float("inf") for name in contenders}
    for _ in range(args.repeats):
        for name, run in contenders.items():
            start = time.perf_counter()
            run()
            best[name] = min(best[name], time.perf_counter() - start)
    base = best["torch.func jvp(grad) (forward-over-reverse)"]
    print(f"MLP 20-100-100-1 (12 301 parameters), batch 256, best of {args.repeats}:")
    for name, seconds in best.items():
        print(f"  {name:52s} {seconds * 1e3:8.1f} ms   {seconds / base:5.2f}x torch.func jvp(grad)")
    torch.manual_seed(0)
    model = tt.port(mlp(64, 256, 256, 64, 10))
    data = (torch.randn(512, 64), torch.randint(0, 10, (512,)))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    tt.spectrum(lambda m, batch: torch.nn.functional.cross_entropy(m(batch[0]), batch[1]), model, data, k=1,
                iterations=20)
    seconds = time.perf_counter() - start
    peak = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    print(f"tt.spectrum(k=1, iterations=20), MLP 64-256-256-64-10 (99 530 parameters), batch 512: {seconds:.1f} s, "
          f"peak resident memory +{peak:.0f} MiB")


if __name__ == "__main__":
    main()
