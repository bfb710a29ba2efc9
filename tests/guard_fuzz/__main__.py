"""python -m tests.guard_fuzz [--long] [--minutes N] [--seed S]: the guard fuzzer from the command line."""
import argparse
import time
from typing import List, Optional

import torch

from .runner import CI_PROGRAMS, CI_SEED, fuzz


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.guard_fuzz", description=__doc__)
    parser.add_argument("--long", action="store_true", help="run fresh seeds for --minutes instead of the CI budget")
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    seed = args.seed if args.seed is not None else (int(time.time()) % 1_000_000 * 100 if args.long else CI_SEED)
    tally = fuzz(seed, None if args.long else CI_PROGRAMS, args.minutes * 60 if args.long else None)
    print(f"seed {seed}: {tally.summary()}")
    for failure in tally.failures:
        print(failure)
    return 1 if tally.failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
