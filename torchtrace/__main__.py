"""python -m torchtrace demo | ops [--coverage [--full]] : a short tour, the supported torch callables, or the OpInfo
coverage report (PyTorch's op database run on tracers vs torch autograd)."""
import argparse
from collections import defaultdict
from typing import List, Optional

from torchtrace.autograd.function import RULES
from torchtrace.naming import callable_name


def list_ops() -> None:
    """Print the supported torch callables grouped by the file that holds their rule."""
    families = defaultdict(list)
    for func, rule in RULES.items():
        families[rule.__module__.rsplit(".", 1)[-1]].append(callable_name(func))
    for family in sorted(families):
        print(f"{family} ({len(families[family])}):")
        for name in sorted(families[family]):
            print(f"    {name}")
    print(f"total: {len(RULES)}")


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m torchtrace", description=__doc__)
    parser.add_argument("command", choices=["demo", "ops"])
    parser.add_argument("--epochs", type=int, default=6, help="demo: training epochs")
    parser.add_argument("--out-dir", default=".", help="demo: where the graph SVG is written")
    parser.add_argument("--coverage", action="store_true", help="ops: judge every OpInfo op against torch autograd")
    parser.add_argument("--full", action="store_true", help="ops --coverage: every sample (default: the first few)")
    parser.add_argument("--samples", type=int, default=3, help="ops --coverage: samples per op without --full")
    parser.add_argument("--only", nargs="+", help="ops --coverage: judge only these ops (name or name.variant)")
    args = parser.parse_args(argv)
    if args.command == "demo":
        from torchtrace.demo import run

        run(args.epochs, args.out_dir)
    elif args.coverage:
        from torchtrace.coverage import WRONG
        from torchtrace.coverage import main as coverage

        results = coverage(full=args.full, limit=args.samples, only=args.only)
        if any(r.status == WRONG for r in results):
            raise SystemExit(1)
    else:
        list_ops()


if __name__ == "__main__":
    main()
