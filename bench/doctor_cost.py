"""The gradient doctor's cost: tt.diagnose(fn) against an eager torchtrace forward and backward of the same loss.

    python bench/doctor_cost.py [--repeats 15] [--threads 1]

On the five models of the doctor's tests (tests/diagnose/doctor_models.py: an MLP, a CNN with batch norm, a small
GPT, and models with the architecture of BERT and GPT-2), healthy, with their fixed batch. Each repeat runs the
eager pass (the loss, then loss.backward()) and tt.diagnose of the same loss one after the other, so drifts in
machine load hit both alike; prints the median ms of each and their ratio (the doctor's budget is 3x).
"""
import argparse
import pathlib
import statistics
import sys
import time

import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout
sys.path.insert(0, str(ROOT / "tests" / "diagnose"))
from doctor_models import MODELS, batch, build, loss_fn  # noqa: E402

import torchtrace as tt  # noqa: E402


def _ms(fn) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"{'model':6}  {'eager fwd+bwd ms':>16}  {'tt.diagnose ms':>14}  {'ratio':>5}")
    for kind in MODELS:
        model = build(kind)
        inputs, target = batch(kind)
        loss = lambda: loss_fn(model, kind, inputs, target)  # noqa: E731
        eager = lambda: loss().backward()  # noqa: E731
        doctor = lambda: tt.diagnose(loss)  # noqa: E731
        eager(), doctor()  # warm up
        times = {"eager": [], "doctor": []}
        for _ in range(args.repeats):
            times["eager"].append(_ms(eager))
            times["doctor"].append(_ms(doctor))
        e, d = statistics.median(times["eager"]), statistics.median(times["doctor"])
        print(f"{kind:6}  {e:16.2f}  {d:14.2f}  {d / e:5.2f}")


if __name__ == "__main__":
    main()
