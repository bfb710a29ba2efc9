"""python -m tests.fuzz [--long] [--minutes N] [--seed S] [--count N] [--known-bugs]: fuzz from the command line."""
import argparse
import time
from typing import List, Optional

import torch

from .generator import KNOWN_CORE_BUGS
from .runner import CI_PROGRAMS, CI_SEED, fuzz


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__)
    parser.add_argument("--long", action="store_true", help="run for --minutes instead of the CI budget")
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--seed", type=int, default=None, help="first seed (default: CI's, or the clock with --long)")
    parser.add_argument("--count", type=int, default=None, help="number of programs (default: CI's budget)")
    parser.add_argument("--known-bugs", action="store_true",
                        help=f"also draw features known core bugs break: {', '.join(sorted(KNOWN_CORE_BUGS))}")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    seed = args.seed if args.seed is not None else (int(time.time()) % 1_000_000 * 1000 if args.long else CI_SEED)
    count = args.count if args.count is not None else (None if args.long else CI_PROGRAMS)
    print(f"fuzzing from seed {seed}" + (f" for {args.minutes} minutes" if args.long else f", {count} programs"))
    tally = fuzz(seed, count, args.minutes if args.long else None, args.known_bugs)
    print(tally.summary())
    return 1 if tally.failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
