"""Compiled torchtrace (tt.compile) vs eager torchtrace vs torch autograd: whole steps, interleaved, medians.

    python bench/compile.py [--repeats 50] [--threads 1]

One step = zero the gradients + forward + backward (+ optimizer step where named). Contenders run one
after another inside each repeat, so drifts in machine load hit all alike. Cases:
  * the 200-op chain of 8x8 tensors of bench/overhead.py (fwd+bwd);
  * a 2-16-16-1 tanh MLP on a batch of 32, MSE loss, SGD step (also as one compiled training step: zero_grad,
    forward, backward and the update in one generated function);
  * LeNet-5 on 64 1x28x28 images, cross-entropy, Adam step (the model of bench/models.py);
  * the 2-layer GPT of bench/models.py, batch 16 x 32 tokens, Adam step.
Prints ms per step for each contender and the ratios to torch autograd, then the one-time compile cost.
`--lines N` also times every line of the generated forward and backward (thread CPU time, median over the
repeats) and prints the N costliest lines and the time per rule: where the compiled step spends its time.
"""
import argparse
import ast
import builtins
import collections
import copy
import pathlib
import statistics
import sys
import time
from typing import Callable, Dict, List, Tuple

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

        def step() -> float:
            """Runs one step; returns the seconds of its forward + backward part."""
            for p in params:
                p.grad = None
            sync(device)
            start = time.perf_counter()
            loss(x, target).backward()
            sync(device)
            middle = time.perf_counter()
            optimizer_step()
            return middle - start
        return step

    contenders = [("torch autograd", stepper(theirs, loss_of(theirs), True)),
                  ("eager torchtrace", stepper(ours, loss_of(ours), False)),
                  ("compiled torchtrace", stepper(compiled_model, compiled_loss, False))]
    if optimizer == "sgd":
        contenders.append(("compiled whole step", whole_step(port(copy.deepcopy(theirs)), loss_fn, x, target, device)))
    return contenders, compile_s, (theirs, ours, compiled_model, compiled_loss)


def whole_step(model: torch.nn.Module, loss_fn: Callable, x: torch.Tensor, target: torch.Tensor,
               device: str) -> Callable:
    """tt.compile of zero_grad + forward + backward + SGD step: one generated function (its fwd+bwd is the step)."""
    optimizer = tt.optim.SGD(model.parameters(), lr=1e-3)

    def train_step(inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        optimizer.zero_grad()
        loss = loss_fn(model(inputs), targets)
        loss.backward()
        optimizer.step()
        return loss

    compiled = tt.compile(train_step, (x, target))

    def step() -> float:
        sync(device)
        start = time.perf_counter()
        compiled(x, target)
        sync(device)
        return time.perf_counter() - start
    return step


def run(name: str, case: Callable, optimizer: str, repeats: int, device: str, lines: int = 0) -> None:
    contenders, compile_s, models = sides(case, optimizer, device)
    for _ in range(3):  # warm-up
        for _, step in contenders:
            step()
    times: List[List[Tuple[float, float]]] = [[] for _ in contenders]
    for _ in range(repeats):  # interleaved, so drifts in machine load hit all contenders alike
        for i, (_, step) in enumerate(contenders):
            sync(device)
            start = time.perf_counter()
            forward_backward = step()
            sync(device)
            times[i].append((time.perf_counter() - start, forward_backward))
    whole = [statistics.median(t for t, _ in ts) for ts in times]
    fwd_bwd = [statistics.median(f for _, f in ts) for ts in times]
    drift = max((a - b).abs().max().item() for a, b in zip(models[0].parameters(), models[2].parameters()))
    print(f"{name}   (compile once: {compile_s * 1e3:.0f} ms, traces in all: {models[3].traces}; "
          f"max |param diff| compiled vs torch {drift:.1e})")
    for (label, _), w, f in zip(contenders, whole, fwd_bwd):
        print(f"    {label:<20} fwd+bwd {f * 1e3:8.3f} ms ({f / fwd_bwd[0]:4.2f}x)   whole step {w * 1e3:8.3f} ms "
              f"({w / whole[0]:4.2f}x)")
    if lines:
        torch.manual_seed(0)
        _, x, target, _ = case(device)
        profile_lines(models[3], x, target, repeats, lines)


def profile_lines(compiled: Callable, x: torch.Tensor, target: torch.Tensor, repeats: int, top: int) -> None:
    """Run the generated forward + backward with each line timed; print the costliest lines and rules."""
    spec = compiled.latest
    label, labels = "", {}
    for number, line in enumerate(spec.source.splitlines(), 1):  # the rule a line belongs to: its block's comment
        text = line.strip()
        if text.startswith("# ") and text[2:3].isupper() and ("[" in text or ":" in text):
            label = text[2:].split(":")[0].split("  [")[0]
        labels[number] = label
    tree, texts = ast.parse(spec.source), []
    for function in tree.body:
        if isinstance(function, ast.FunctionDef) and function.name in ("forward", "backward"):
            body = []
            for statement in function.body:
                if isinstance(statement, (ast.Return, ast.Expr)):
                    body.append(statement)
                    continue
                texts.append((function.name, ast.unparse(statement), labels.get(statement.lineno, "")))
                body += ast.parse("_start = _clock()").body + [statement]
                body += ast.parse(f"_times[{len(texts) - 1}].append(_clock() - _start)").body
            function.body = body
    namespace = {"_clock": time.thread_time, "_times": [[] for _ in texts]}
    exec(builtins.compile(ast.fix_missing_locations(tree), "<generated>", "exec"), namespace)
    params = {name: torch.Tensor.as_subclass(t, torch.Tensor).detach() for name, t in spec.captured_named}
    for i in range(repeats + 3):
        if i == 3:
            for t in namespace["_times"]:
                t.clear()
        outputs, saved = namespace["forward"](x, target, params)
        namespace["backward"](params, saved, torch.ones_like(outputs[0]))
    cost = [statistics.median(t) for t in namespace["_times"]]
    per_rule: Dict[str, float] = collections.Counter()
    for (section, _, rule), c in zip(texts, cost):
        per_rule[f"{section} {rule}"] += c
    print(f"    generated lines, thread CPU time, median of {repeats}:")
    for i in sorted(range(len(texts)), key=lambda i: -cost[i])[:top]:
        print(f"      {cost[i] * 1e6:8.1f} us  {texts[i][0]:<8} {texts[i][1][:100]}")
    print("    per rule: " + ", ".join(f"{name} {c * 1e3:.2f} ms" for name, c in per_rule.most_common(top)))


def sync(device: str) -> None:
    if device != "cpu":
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    parser.add_argument("--only", default="", help="comma-separated subset: chain,mlp,lenet,gpt")
    parser.add_argument("--lines", type=int, default=0, help="also time each generated line; print the N costliest")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, device {args.device}; "
          "ratios are to torch autograd in the same run")
    cases = {"chain": ("200-op chain fwd+bwd", chain_case, "none"), "mlp": ("MLP 2-16-16-1 + SGD", mlp_case, "sgd"),
             "lenet": ("LeNet-5 b64 + Adam", lenet_case, "adam"), "gpt": ("GPT 2x64 16x32 + Adam", gpt_case, "adam")}
    for key in (args.only.split(",") if args.only else cases):
        name, case, optimizer = cases[key]
        run(name, case, optimizer, args.repeats, args.device, args.lines)


if __name__ == "__main__":
    main()
