"""python -m torchtrace {demo, ops} [options]: a short tour, or the torch callables that have gradient rules.

Each subcommand has its own --help: `python -m torchtrace ops --help`.
"""
import argparse
import os
import sys
from collections import defaultdict
from typing import Dict, List, Optional

from torchtrace.autograd.function import RULES
from torchtrace.naming import callable_name


def is_public(name: str) -> bool:
    """`torch.exp`, `torch.Tensor.__add__`: public; `torch._C._nn.glu`, `torch._ops.aten.slice`: private spellings."""
    return not any(part.startswith("_") and not (part.startswith("__") and part.endswith("__"))
                   for part in name.split("."))


def public_ops() -> Dict[str, List[str]]:
    """The public names of the torch callables with rules, grouped by the file that holds their rule."""
    families: Dict[str, List[str]] = defaultdict(list)
    for func, rule in RULES.items():
        name = callable_name(func)
        if is_public(name):
            families[rule.__module__.rsplit(".", 1)[-1]].append(name)
    return {family: sorted(set(names)) for family, names in sorted(families.items())}


def list_ops() -> None:
    """Print the public names of the supported torch callables, grouped by family, and their total."""
    families = public_ops()
    for family, names in families.items():
        print(f"{family} ({len(names)}):")
        for name in names:
            print(f"    {name}")
    print(f"total: {sum(len(names) for names in families.values())}")


def _demo(args: argparse.Namespace) -> None:
    from torchtrace.demo import run

    run(args.epochs, args.out_dir)


def _ops(args: argparse.Namespace) -> None:
    if not args.coverage:
        list_ops()
        return
    from torchtrace.coverage import WRONG
    from torchtrace.coverage import main as coverage

    results = coverage(full=args.full, limit=args.samples, only=args.only)
    if any(r.status == WRONG for r in results):
        raise SystemExit(1)


def parser() -> argparse.ArgumentParser:
    """The command line: one subcommand per tool, each with its own options and --help."""
    main_parser = argparse.ArgumentParser(prog="python -m torchtrace", description=__doc__,
                                          formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = main_parser.add_subparsers(dest="command", required=True, metavar="{demo,ops}")
    demo = commands.add_parser("demo", help="train a small CNN on the digits, with the trace, drawing and checks",
                               description="A short tour on scikit-learn's bundled digits (nothing downloaded).")
    demo.add_argument("--epochs", type=int, default=6, help="training epochs (default 6)")
    demo.add_argument("--out-dir", default=None,
                      help="where the graph's SVG is written (default: a new temporary folder, printed)")
    demo.set_defaults(run=_demo)
    ops = commands.add_parser("ops", help="list the torch callables that have gradient rules",
                              description="The public names of the torch callables with gradient rules, by family; "
                                          "or, with --coverage, PyTorch's OpInfo database run on tracers and "
                                          "compared with torch autograd.")
    ops.add_argument("--coverage", action="store_true", help="judge every OpInfo op against torch autograd")
    ops.add_argument("--full", action="store_true", help="with --coverage: every sample (default: the first few)")
    ops.add_argument("--samples", type=int, default=3, help="with --coverage: samples per op without --full")
    ops.add_argument("--only", nargs="+", help="with --coverage: judge only these ops (name or name.variant)")
    ops.set_defaults(run=_ops)
    return main_parser


def main(argv: Optional[List[str]] = None) -> None:
    args = parser().parse_args(argv)
    try:
        args.run(args)
        sys.stdout.flush()
    except BrokenPipeError:  # `python -m torchtrace ops | head`: the reader left; stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the interpreter's final flush does not fail again
        raise SystemExit(0) from None


if __name__ == "__main__":
    main()
