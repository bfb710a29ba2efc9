"""Compiled torchtrace (tt.compile) vs eager torchtrace vs torch autograd: whole steps, interleaved, medians.

    python bench/compile.py [--repeats 50] [--threads 1]

One step = zero the gradients + forward + backward (+ optimizer step where named). Contenders run one
after another inside each repeat, so drifts in machine load hit all alike. Cases:
  * the 200-op chain of 8x8 tensors of bench/overhead.py (fwd+bwd);
  * a 2-16-16-1 tanh MLP on a batch of 32, MSE loss, SGD step (also as one compiled training step: zero_grad,
    forward, backward and the update in one generated function);
  * LeNet-5 on 64 1x28x28 images, cross-entropy, Adam step (the model of bench/models.py);
  * the 2-layer GPT of bench/models.py, batch 16 x 32 tokens, Adam step.
Prints ms per step for each contender and the ratios to torch autograd: the whole step (of medians, and of means,
which keep the steps in which Python's garbage collector scans its oldest generation), and its forward and
backward parts apart (where checked replay spends its time: the forward runs the user's Python and matches each
call, the backward runs the statements' rules behind one node).
"""
import argparse
import copy
import pathlib
import statistics
import sys
import time
from typing import Callable, List, Tuple

import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench"), str(ROOT / "tests")]  # this checkout, its benches and test models
from models import gpt_case, lenet_case, mlp_case  # noqa: E402
from overhead import small_chain  # noqa: E402

import torchtrace as tt  # noqa: E402
from torchtrace.port import port  # noqa: E402


def chain_case(device: str) -> Tuple[torch.nn.Module, torch.Tensor, torch.Tensor, Callable]:
    class Chain(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = torch.nn.Parameter(torch.rand(8, 8)), torch.nn.Parameter(torch.rand(8, 8))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return small_chain(x, self.a, self.b)

    return Chain().to(device), torch.rand(8, 8, device=device), torch.zeros((), device=device), lambda y, _: y


def sides(case: Callable, optimizer: str, device: str) -> Tuple[list, Callable, Callable]:
    """[(name, step function)] for torch autograd, eager torchtrace and tt.compile; and the compile cost."""
    torch.manual_seed(0)
    theirs, x, target, loss_fn = case(device)
    ours = port(copy.deepcopy(theirs))
    compiled_model = port(copy.deepcopy(theirs))

    def make_optimizer(model: torch.nn.Module, torch_side: bool) -> Callable:
        if optimizer == "none":
            return lambda: None
        kind = {"sgd": (torch.optim.SGD, tt.optim.SGD), "adam": (torch.optim.Adam, tt.optim.Adam)}[optimizer]
        return (kind[0] if torch_side else kind[1])(model.parameters(), lr=1e-3).step

    def loss_of(model: torch.nn.Module) -> Callable:
        return lambda inputs, targets: loss_fn(model(inputs), targets)

    start = time.perf_counter()
    compiled_loss = tt.compile(loss_of(compiled_model), (x, target))
    compile_s = time.perf_counter() - start

    def stepper(model: torch.nn.Module, loss: Callable, torch_side: bool) -> Callable:
        optimizer_step = make_optimizer(model, torch_side)
        params = list(model.parameters())

        def step() -> Tuple[float, float]:
            """Runs one step; returns the seconds of its forward and of its backward."""
            for p in params:
                p.grad = None
            sync(device)
            start = time.perf_counter()
            value = loss(x, target)
            sync(device)
            middle = time.perf_counter()
            value.backward()
            sync(device)
            end = time.perf_counter()
            optimizer_step()
            return middle - start, end - middle
        return step

    contenders = [("torch autograd", stepper(theirs, loss_of(theirs), True)),
                  ("eager torchtrace", stepper(ours, loss_of(ours), False)),
                  ("compiled torchtrace", stepper(compiled_model, compiled_loss, False))]
    if optimizer == "sgd":
        contenders.append(("compiled whole step", whole_step(port(copy.deepcopy(theirs)), loss_fn, x, target, device)))
    return contenders, compile_s, (theirs, ours, compiled_model, compiled_loss)


def whole_step(model: torch.nn.Module, loss_fn: Callable, x: torch.Tensor, target: torch.Tensor,
               device: str) -> Callable:
    """tt.compile of zero_grad + forward + backward + SGD step: one compiled call (its forward is the whole step)."""
    optimizer = tt.optim.SGD(model.parameters(), lr=1e-3)

    def train_step(inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        optimizer.zero_grad()
        loss = loss_fn(model(inputs), targets)
        loss.backward()
        optimizer.step()
        return loss

    compiled = tt.compile(train_step, (x, target))

    def step() -> Tuple[float, float]:
        sync(device)
        start = time.perf_counter()
        compiled(x, target)
        sync(device)
        return time.perf_counter() - start, 0.0
    return step


def run(name: str, case: Callable, optimizer: str, repeats: int, device: str) -> None:
    contenders, compile_s, models = sides(case, optimizer, device)
    for _ in range(3):  # warm-up (the compiled function's first call records its program)
        for _, step in contenders:
            step()
    times: List[List[Tuple[float, float, float]]] = [[] for _ in contenders]
    for _ in range(repeats):  # interleaved, so drifts in machine load hit all contenders alike
        for i, (_, step) in enumerate(contenders):
            sync(device)
            start = time.perf_counter()
            forward, backward = step()
            sync(device)
            times[i].append((time.perf_counter() - start, forward, backward))
    medians = [[statistics.median(t[k] for t in ts) for k in range(3)] for ts in times]
    means = [statistics.mean(t[0] for t in ts) for ts in times]
    drift = max((a - b).abs().max().item() for a, b in zip(models[0].parameters(), models[2].parameters()))
    compiled = models[3]
    print(f"{name}   (tt.compile: {compile_s * 1e3:.1f} ms, {compiled.calls} calls, {compiled.replayed} replayed to "
          f"the end, {len(compiled.program.paths())} path(s); max |param diff| compiled vs torch {drift:.1e})")
    base = medians[0]
    for (label, _), (whole, forward, backward), mean in zip(contenders, medians, means):
        parts = f"fwd {forward * 1e3:8.3f} ms ({forward / base[1]:4.2f}x)" + (
            f"   bwd {backward * 1e3:8.3f} ms ({backward / base[2]:4.2f}x)" if backward else "")
        print(f"    {label:<20} {parts}   whole step {whole * 1e3:8.3f} ms ({whole / base[0]:4.2f}x; mean "
              f"{mean / means[0]:4.2f}x)")


def sync(device: str) -> None:
    if device != "cpu":
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    parser.add_argument("--only", default="", help="comma-separated subset: chain,mlp,lenet,gpt")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, device {args.device}; "
          "ratios are to torch autograd in the same run")
    cases = {"chain": ("200-op chain fwd+bwd", chain_case, "none"), "mlp": ("MLP 2-16-16-1 + SGD", mlp_case, "sgd"),
             "lenet": ("LeNet-5 b64 + Adam", lenet_case, "adam"), "gpt": ("GPT 2x64 16x32 + Adam", gpt_case, "adam")}
    for key in (args.only.split(",") if args.only else cases):
        name, case, optimizer = cases[key]
        run(name, case, optimizer, args.repeats, args.device)


if __name__ == "__main__":
    main()
