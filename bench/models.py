"""Whole training steps of ported torch models: torchtrace vs torch autograd, in one process, interleaved, medians.

    python bench/models.py [--repeats 30] [--device cpu] [--threads N] [--clock wall|thread]
                           [--cases mlp,wide,cnn,convbn,gpt]

The ratio is given of medians and of means (the mean keeps the steps in which Python's garbage collector scans its
oldest generation, a cost a training run pays).
One step = zero_grad + forward + loss + backward + optimizer step. The torchtrace side is the model after
tt.port with torchtrace's optimizer; the torch side is an identical deep copy with torch's. Models (LeNet and
GPT are the classes tests/test_port.py checks gradient by gradient against torch autograd):
  * MLP: a 2-16-16-1 tanh MLP on a batch of 32, MSE loss, SGD (Python per-op overhead dominates);
  * wide: a 784-1024-1024-10 ReLU MLP on a batch of 256, cross-entropy, SGD (the arithmetic dominates);
  * CNN: LeNet-5 on a batch of 64 1x28x28 images, float32, cross-entropy over 10 classes;
  * conv-BN: three 3x3 convolutions (32 channels) each with batch norm and ReLU, average pooling and a linear layer,
    on a batch of 16 3x32x32 images, cross-entropy, SGD (the backward kernels of convolution and batch norm dominate);
  * GPT: a 2-layer GPT-style transformer (vocab 64, d 64, 4 heads, causal self-attention written with
    masked_fill + softmax, GELU MLP, tied lm head), batch 16 x 32 tokens, float32, next-token cross-entropy; Adam.
A third contender is the interception floor: the torch model whose parameters are a subclass that records nothing
(bench/overhead.py's retagging subclass: each forward op handed to torch and its result retagged; torch autograd
records and runs the backward; its optimizer steps on the plain tensors). What torchtrace costs beyond it is its
recording and its backward; a ratio below the floor's is out of reach of any tensor subclass that intercepts ops.
`--cases mlp,cnn` runs only those; `--readable` runs torchtrace on its readable path (tt.readable()) instead of the
generated fast lanes. Prints ms per step for each side, the part spent in the optimizer step, and the
ratio torchtrace / torch.
"""
import argparse
import contextlib
import copy
import pathlib
import statistics
import sys
import time
from typing import Callable, List, Tuple

import torch
import torch.nn.functional as F

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "bench")]  # this checkout, the models the tests verify
from overhead import RetaggingSubclass  # noqa: E402
from test_port import GPT, LeNet, sequence_loss  # noqa: E402

import torchtrace as tt  # noqa: E402
from torchtrace.port import port  # noqa: E402

# perf_counter (wall time) by default; --clock thread measures this thread's CPU time, which a machine shared with
# other jobs disturbs far less (torch runs on this thread alone with --threads 1).
CLOCK = [time.perf_counter]

def mlp_case(device: str) -> Tuple[torch.nn.Module, torch.Tensor, torch.Tensor, Callable]:
    model = torch.nn.Sequential(torch.nn.Linear(2, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16), torch.nn.Tanh(),
                                torch.nn.Linear(16, 1)).to(device)
    return model, torch.randn(32, 2, device=device), torch.randn(32, 1, device=device), F.mse_loss


def wide_case(device: str) -> Tuple[torch.nn.Module, torch.Tensor, torch.Tensor, Callable]:
    model = torch.nn.Sequential(torch.nn.Linear(784, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024),
                                torch.nn.ReLU(), torch.nn.Linear(1024, 10)).to(device)
    return model, torch.randn(256, 784, device=device), torch.randint(0, 10, (256,), device=device), F.cross_entropy


def lenet_case(device: str) -> Tuple[torch.nn.Module, torch.Tensor, torch.Tensor, Callable]:
    images = torch.randn(64, 1, 28, 28, device=device)
    return LeNet().to(device), images, torch.randint(0, 10, (64,), device=device), F.cross_entropy


def conv_bn_case(device: str) -> Tuple[torch.nn.Module, torch.Tensor, torch.Tensor, Callable]:
    def block(c_in: int, c_out: int) -> List[torch.nn.Module]:
        return [torch.nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), torch.nn.BatchNorm2d(c_out), torch.nn.ReLU()]

    model = torch.nn.Sequential(*block(3, 32), *block(32, 32), *block(32, 32), torch.nn.AdaptiveAvgPool2d(1),
                                torch.nn.Flatten(), torch.nn.Linear(32, 10)).to(device)
    return model, torch.randn(16, 3, 32, 32, device=device), torch.randint(0, 10, (16,), device=device), F.cross_entropy


def gpt_case(device: str) -> Tuple[torch.nn.Module, torch.Tensor, torch.Tensor, Callable]:
    tokens = torch.randint(0, 64, (16, 33), device=device)
    model = GPT(vocab=64, d=64, heads=4, length=32, layers=2).to(device)
    return model, tokens[:, :-1], tokens[:, 1:], sequence_loss


def sync(device: str) -> None:
    if device != "cpu":
        torch.cuda.synchronize()


def retagged(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of model whose parameters are RetaggingSubclass tensors (still torch autograd's leaves)."""
    copied = copy.deepcopy(model)
    for module in copied.modules():
        for name, param in module._parameters.items():
            if param is not None:
                module._parameters[name] = torch.nn.Parameter(param.detach().clone().as_subclass(RetaggingSubclass))
    return copied


def timed_step(model: torch.nn.Module, optimizer, x: torch.Tensor, target: torch.Tensor, loss_fn: Callable,
               device: str) -> Tuple[float, float]:
    """(seconds for the whole step, seconds for optimizer.step())."""
    sync(device)
    start = CLOCK[0]()
    optimizer.zero_grad()
    loss_fn(model(x), target).backward()
    sync(device)
    middle = CLOCK[0]()
    with torch._C.DisableTorchFunctionSubclass():  # (the floor's update on plain tensors, as torchtrace's optimizers)
        optimizer.step()
    sync(device)
    end = CLOCK[0]()
    return end - start, end - middle


OPTIMIZERS = {"sgd": (tt.optim.SGD, torch.optim.SGD), "adam": (tt.optim.Adam, torch.optim.Adam)}


def compare(name: str, case: Callable, optimizer_kind: str, repeats: int, device: str) -> float:
    torch.manual_seed(0)
    theirs, x, target, loss_fn = case(device)
    ours, floor = port(copy.deepcopy(theirs)), retagged(theirs)
    our_optimizer, their_optimizer = OPTIMIZERS[optimizer_kind]
    sides = [(ours, our_optimizer(ours.parameters(), lr=1e-3)), (theirs, their_optimizer(theirs.parameters(), lr=1e-3)),
             (floor, their_optimizer(floor.parameters(), lr=1e-3))]
    for _ in range(3):  # warm-up
        for model, optimizer in sides:
            timed_step(model, optimizer, x, target, loss_fn, device)
    times: List[List[Tuple[float, float]]] = [[], [], []]
    for repeat in range(repeats):  # interleaved, so drifts in machine load hit all sides alike; in turns, so none
        for turn in range(len(sides)):  # always runs just after another (a step after torchtrace's runs slower)
            side = (repeat + turn) % len(sides)
            model, optimizer = sides[side]
            times[side].append(timed_step(model, optimizer, x, target, loss_fn, device))
    (ours_step, ours_opt), (theirs_step, theirs_opt), (floor_step, _) = (
        (statistics.median(t for t, _ in ts), statistics.median(o for _, o in ts)) for ts in times)
    drift = max((a - b).abs().max().item() for a, b in zip(ours.parameters(), theirs.parameters()))
    ratio = ours_step / theirs_step
    mean_ratio = statistics.mean(t for t, _ in times[0]) / statistics.mean(t for t, _ in times[1])
    print(f"{name:<30} torchtrace {ours_step * 1e3:8.3f} ms/step (optimizer {ours_opt * 1e3:6.3f})   torch autograd "
          f"{theirs_step * 1e3:8.3f} ms/step (optimizer {theirs_opt * 1e3:6.3f})   ratio {ratio:5.2f}x "
          f"(mean {mean_ratio:5.2f}x)   interception floor {floor_step / theirs_step:5.2f}x   "
          f"max |param diff| after {repeats + 3} steps {drift:.1e}")
    return ratio


CASES = {"mlp": ("MLP 2-16-16-1 b32 + SGD", mlp_case, "sgd"),
         "wide": ("wide MLP 784-1024-1024-10 b256 + SGD", wide_case, "sgd"),
         "cnn": ("LeNet-5 b64 + Adam", lenet_case, "adam"),
         "convbn": ("conv-BN-ReLU x3 b16 32x32 + SGD", conv_bn_case, "sgd"),
         "gpt": ("GPT 2x64 b16x32 + Adam", gpt_case, "adam")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated subset of " + ", ".join(CASES))
    parser.add_argument("--readable", action="store_true", help="torchtrace on its readable path (tt.readable())")
    parser.add_argument("--clock", choices=("wall", "thread"), default="wall",
                        help="wall: time.perf_counter; thread: time.thread_time (CPU time; use with --threads 1)")
    args = parser.parse_args()
    CLOCK[0] = time.thread_time if args.clock == "thread" else time.perf_counter
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, device {args.device}, clock {args.clock}, "
          f"torchtrace on its {'readable path' if args.readable else 'fast lanes'}")
    with tt.readable() if args.readable else contextlib.nullcontext():
        for key in args.cases.split(","):
            name, case, optimizer_kind = CASES[key]
            compare(name, case, optimizer_kind, args.repeats, args.device)


if __name__ == "__main__":
    main()
