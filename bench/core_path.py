"""Which lines of torchtrace one training step of a small MLP executes: the path a student steps through.

    python bench/core_path.py [--lines]

Traces (sys.settrace) the forward and backward of a 2-16-16-1 tanh MLP built from tt.nn layers on a batch
of 32 with an MSE loss, parameters' .grad None before it (as after optimizer.zero_grad()), after one warm-up
step (so one-time work such as signature caches is not counted), and prints the distinct executed lines of each
torchtrace file, and the total. `--lines` prints the lines. The step runs on the readable path (tt.readable()): the
generated fast lanes (torchtrace/lanes) take the same calls in straight-line code; `--lanes` counts them instead.
"""
import argparse
import collections
import contextlib
import linecache
import pathlib
import sys
from typing import Any, Dict, Set

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]  # this checkout's torchtrace
import torch  # noqa: E402

import torchtrace as tt  # noqa: E402

PACKAGE = str(ROOT / "torchtrace")


def executed_lines(step: Any) -> Dict[str, Set[int]]:
    """{file under torchtrace/: the line numbers `step()` executed}."""
    seen: Dict[str, Set[int]] = collections.defaultdict(set)

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        filename = frame.f_code.co_filename
        if not filename.startswith(PACKAGE):
            return None
        if event == "line":
            seen[filename].add(frame.f_lineno)
        return tracer

    sys.settrace(tracer)
    try:
        step()
    finally:
        sys.settrace(None)
    return seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", action="store_true", help="print every executed line")
    parser.add_argument("--lanes", action="store_true", help="count the generated fast lanes instead")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = tt.nn.Sequential(tt.nn.Linear(2, 16), tt.nn.Tanh(), tt.nn.Linear(16, 16), tt.nn.Tanh(), tt.nn.Linear(16, 1))
    x, target = torch.randn(32, 2), torch.randn(32, 1)
    loss_fn = tt.nn.MSELoss()

    def step() -> None:
        loss_fn(model(x), target).backward()

    with contextlib.nullcontext() if args.lanes else tt.readable():
        step()  # warm-up
        for p in model.parameters():
            p.grad = None
        seen = executed_lines(step)
    total = 0
    for filename in sorted(seen, key=lambda f: -len(seen[f])):
        lines = sorted(seen[filename])
        total += len(lines)
        print(f"{len(lines):5d}  {pathlib.Path(filename).relative_to(ROOT)}")
        if args.lines:
            for number in lines:
                print(f"       {number:4d} {linecache.getline(filename, number).rstrip()}")
    print(f"{total:5d}  lines in {len(seen)} files")


if __name__ == "__main__":
    main()
