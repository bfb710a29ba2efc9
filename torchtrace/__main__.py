"""python -m torchtrace {demo, ops, diagnose} [options]: a short tour, the torch callables that have gradient rules,
or a training script run with the gradient doctor watching.

Each subcommand has its own --help: `python -m torchtrace ops --help`.
"""
import argparse
import os
import sys
from typing import List, Optional

from torchtrace.ops.listing import families


def list_ops() -> None:
    """Print the public names of the supported torch callables, grouped by family, and their total."""
    grouped = families()
    for family, names in grouped.items():
        print(f"{family} ({len(names)}):")
        for name in names:
            print(f"    {name}")
    print(f"total: {sum(len(names) for names in grouped.values())}")


def _rules() -> list:
    from torchtrace.autograd.function import RULES

    return list(RULES.values())


def _demo(args: argparse.Namespace) -> None:
    from torchtrace.demo import run

    run(args.epochs, args.out_dir)


def _ops(args: argparse.Namespace) -> None:
    if args.show:
        from torchtrace.lanes.forward import show
        from torchtrace.lanes.walk import step_source

        try:
            print(show(args.show), end="")
        except KeyError as exc:
            raise SystemExit(exc.args[0]) from None
        backward = step_source(next(rule for rule in _rules() if rule.__name__ == args.show))
        print(f"\n{backward}" if backward else "\n(its backward is the rule's own, hand-written)", end="\n")
        return
    if args.compile or args.traced:
        from torchtrace.compiler.tracing import report

        report.show_traced(args.traced) if args.traced else report.main(args.only, args.samples)
        return
    if not args.coverage:
        list_ops()
        return
    from torchtrace.coverage import WRONG
    from torchtrace.coverage import main as coverage

    try:
        results = coverage(full=args.full, limit=args.samples, only=args.only, device=args.device)
    except ValueError as exc:
        raise SystemExit(f"python -m torchtrace ops --coverage: {exc}") from None
    if any(r.status == WRONG for r in results):
        raise SystemExit(1)


def _diagnose(args: argparse.Namespace) -> None:
    from torchtrace.doctor.script import run_script

    if not os.path.isfile(args.script):
        raise SystemExit(f"python -m torchtrace diagnose: no such script: {args.script}")
    session = run_script(args.script, args.args, steps=args.steps)
    if any(f.kind != "zero_by_construction" for _, f in session.findings):
        raise SystemExit(1)


def at_least_one(text: str) -> int:
    """argparse's type for a count: an integer >= 1 (0 or -1 epochs, steps or samples ran nothing and exited 0)."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def parser() -> argparse.ArgumentParser:
    """The command line: one subcommand per tool, each with its own options and --help."""
    main_parser = argparse.ArgumentParser(prog="python -m torchtrace", description=__doc__,
                                          formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = main_parser.add_subparsers(dest="command", required=True, metavar="{demo,ops,diagnose}")
    demo = commands.add_parser("demo", help="train a small CNN on the digits, with the trace, drawing and checks",
                               description="A short tour on scikit-learn's bundled digits (nothing downloaded).")
    demo.add_argument("--epochs", type=at_least_one, default=6, help="training epochs (default 6)")
    demo.add_argument("--out-dir", default=None,
                      help="where the graph's SVG is written (default: a new temporary folder, printed)")
    demo.set_defaults(run=_demo)
    ops = commands.add_parser("ops", help="list the torch callables that have gradient rules",
                              description="The public names of the torch callables with gradient rules, by family; "
                                          "or, with --coverage, PyTorch's OpInfo database run on tracers and "
                                          "compared with torch autograd; or, with --compile, every rule traced "
                                          "symbolically on those samples (clean: straight-line code).")
    ops.add_argument("--show", metavar="RULE", help="print the fast lane generated from a rule (e.g. Mul, Tanh)")
    ops.add_argument("--coverage", action="store_true", help="judge every OpInfo op against torch autograd")
    ops.add_argument("--full", action="store_true", help="with --coverage: every sample (default: the first few)")
    ops.add_argument("--samples", type=at_least_one, default=3,
                     help="with --coverage or --compile: samples per op (--coverage: without --full)")
    ops.add_argument("--only", nargs="+", help="with --coverage or --compile: only these OpInfo entries (name or "
                                               "name.variant)")
    ops.add_argument("--device", default="cpu", help="with --coverage: where both sides run (e.g. cuda)")
    ops.add_argument("--compile", action="store_true",
                     help="trace every rule symbolically on OpInfo samples: clean (straight-line code for tt.compile) "
                          "or why not; --samples per entry (default 3)")
    ops.add_argument("--traced", metavar="NAME",
                     help="the straight-line forward and backward traced from rule NAME (e.g. Mul, LeakyRelu)")
    ops.set_defaults(run=_ops)
    diagnose = commands.add_parser("diagnose", help="run a training script with the gradient doctor watching",
                                   description="Run SCRIPT as python would, diagnosing its first backward passes "
                                               "(tt.diagnose on each loss.backward()): non-finite values, dead or "
                                               "saturated layers, parameters without a path to the loss. Exits 1 when "
                                               "it found a problem.")
    diagnose.add_argument("script", help="the Python script to run")
    diagnose.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed on to the script")
    diagnose.add_argument("--steps", type=at_least_one, default=20, help="backward passes to diagnose (default 20)")
    diagnose.set_defaults(run=_diagnose)
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
