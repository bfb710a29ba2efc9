"""Forward mode: one pass on dual numbers vs the two-reverse-pass construction vs torch.func.jvp, interleaved.

    python bench/forward_mode.py [--repeats 30] [--threads 1]

The MLP of notebook 06a (a batch of 128 inputs of size 64, two tanh hidden layers of 256, 10 outputs): one
Jacobian-vector product along a random input direction, as tt.jvp(method="auto") (tangent rules, one pass),
tt.jvp(method="transpose") (J v = d/du <J^T u, v>: forward, a recorded backward, a second backward) and
torch.func.jvp on the plain torch model. Contenders run one after another inside each repeat, so drifts in
machine load hit all alike; prints the median ms of each and the ratios to torch.func.jvp.
"""
import argparse
import copy
import pathlib
import statistics
import sys
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))  # this checkout
import torchtrace as tt  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    plain = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Tanh(), torch.nn.Linear(256, 256),
                                torch.nn.Tanh(), torch.nn.Linear(256, 10))
    ported = tt.port(copy.deepcopy(plain))
    batch, direction = torch.randn(128, 64), torch.randn(128, 64)
    contenders = {
        "torch.func.jvp": lambda: torch.func.jvp(plain, (batch,), (direction,))[1],
        "tt.jvp, dual numbers (one pass)": lambda: tt.jvp(ported, (batch,), (direction,))[1],
        "tt.jvp, two reverse passes": lambda: tt.jvp(ported, (batch,), (direction,), method="transpose")[1],
    }
    reference = contenders["torch.func.jvp"]()
    for name, run in contenders.items():
        assert torch.allclose(run(), reference, rtol=1e-4, atol=1e-5), name
    times = {name: [] for name in contenders}
    for _ in range(args.repeats):
        for name, run in contenders.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    base = statistics.median(times["torch.func.jvp"])
    for name, samples in times.items():
        median = statistics.median(samples)
        print(f"{name:34s} {median * 1e3:8.3f} ms   {median / base:5.2f}x torch.func.jvp")


if __name__ == "__main__":
    main()
