"""Whole training steps of ported torch models: torchtrace vs torch autograd, in one process, interleaved, medians.

    python bench/models.py [--repeats 30] [--device cpu] [--threads N]

One step = zero_grad + forward + loss + backward + Adam step. The torchtrace side is the model after
tt.port with tt.optim.Adam; the torch side is an identical deep copy with torch.optim.Adam. Models (the
same classes tests/test_port.py checks gradient by gradient against torch autograd):
  * LeNet-5 on a batch of 64 1x28x28 images, float32, cross-entropy over 10 classes;
  * a 2-layer GPT-style transformer (vocab 64, d 64, 4 heads, causal self-attention written with
    masked_fill + softmax, GELU MLP, tied lm head), batch 16 x 32 tokens, float32, next-token cross-entropy.
Prints ms per step for each side, the part spent in the optimizer step, and the ratio torchtrace / torch.
"""
import argparse
import copy
import pathlib
import statistics
import sys
import time
from typing import Callable, List, Tuple

import torch
import torch.nn.functional as F

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # this checkout's torchtrace, and the models the tests verify
from test_port import GPT, LeNet, sequence_loss  # noqa: E402

import torchtrace as tt  # noqa: E402
from torchtrace.port import port  # noqa: E402


def lenet_case(device: str) -> Tuple[torch.nn.Module, torch.Tensor, torch.Tensor, Callable]:
    images = torch.randn(64, 1, 28, 28, device=device)
    return LeNet().to(device), images, torch.randint(0, 10, (64,), device=device), F.cross_entropy


def gpt_case(device: str) -> Tuple[torch.nn.Module, torch.Tensor, torch.Tensor, Callable]:
    tokens = torch.randint(0, 64, (16, 33), device=device)
    model = GPT(vocab=64, d=64, heads=4, length=32, layers=2).to(device)
    return model, tokens[:, :-1], tokens[:, 1:], sequence_loss


def sync(device: str) -> None:
    if device != "cpu":
        torch.cuda.synchronize()


def timed_step(model: torch.nn.Module, optimizer, x: torch.Tensor, target: torch.Tensor, loss_fn: Callable,
               device: str) -> Tuple[float, float]:
    """(seconds for the whole step, seconds for optimizer.step())."""
    sync(device)
    start = time.perf_counter()
    optimizer.zero_grad()
    loss_fn(model(x), target).backward()
    sync(device)
    middle = time.perf_counter()
    optimizer.step()
    sync(device)
    end = time.perf_counter()
    return end - start, end - middle


def compare(name: str, case: Callable, repeats: int, device: str) -> float:
    torch.manual_seed(0)
    theirs, x, target, loss_fn = case(device)
    ours = port(copy.deepcopy(theirs))
    sides = [(ours, tt.optim.Adam(ours.parameters(), lr=1e-3)),
             (theirs, torch.optim.Adam(theirs.parameters(), lr=1e-3))]
    for _ in range(3):  # warm-up
        for model, optimizer in sides:
            timed_step(model, optimizer, x, target, loss_fn, device)
    times: List[List[Tuple[float, float]]] = [[], []]
    for _ in range(repeats):  # interleaved, so drifts in machine load hit both sides alike
        for side, (model, optimizer) in enumerate(sides):
            times[side].append(timed_step(model, optimizer, x, target, loss_fn, device))
    (ours_step, ours_opt), (theirs_step, theirs_opt) = (
        (statistics.median(t for t, _ in ts), statistics.median(o for _, o in ts)) for ts in times)
    drift = max((a - b).abs().max().item() for a, b in zip(ours.parameters(), theirs.parameters()))
    ratio = ours_step / theirs_step
    print(f"{name:<30} torchtrace {ours_step * 1e3:8.2f} ms/step (Adam {ours_opt * 1e3:6.2f})   torch autograd "
          f"{theirs_step * 1e3:8.2f} ms/step (Adam {theirs_opt * 1e3:6.2f})   ratio {ratio:5.2f}x   "
          f"max |param diff| after {repeats + 3} steps {drift:.1e}")
    return ratio


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, device {args.device}")
    compare("LeNet-5, batch 64", lenet_case, args.repeats, args.device)
    compare("GPT 2x64, batch 16 x 32 tokens", gpt_case, args.repeats, args.device)


if __name__ == "__main__":
    main()
