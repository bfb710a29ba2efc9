"""Imports run one way: tracer -> dispatch -> function/node/engine; the core never imports the tools above it."""
import ast
import pathlib
import subprocess
import sys

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "torchtrace"


def imported_modules(path: pathlib.Path) -> set:
    """torchtrace modules a file imports (at any level, lazy imports included).

    `from torchtrace.ops import reduction` imports the module torchtrace.ops.reduction, not the package's
    own code, so it counts as that module only.
    """
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("torchtrace"):
            submodules = {f"{node.module}.{alias.name}" for alias in node.names}
            modules = {s for s in submodules if (PACKAGE.parent / (s.replace(".", "/") + ".py")).exists()}
            found.update(modules or {node.module})
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("torchtrace"))
    return found


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_no_two_modules_import_each_other():
    graph = {module_name(p): imported_modules(p) for p in PACKAGE.rglob("*.py")}
    cycles = sorted({tuple(sorted((a, b))) for a, targets in graph.items() for b in targets
                     if b in graph and a != b and a in graph[b]
                     and not a == "torchtrace" and not b == "torchtrace"})
    assert not cycles, f"modules importing each other: {cycles}"


def test_the_engine_loads_no_inspection_tool():
    code = ("import sys, torchtrace.autograd.engine; "
            "print([m for m in sys.modules if m.startswith('torchtrace.inspect')])")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_the_core_imports_nothing_above_it():
    core = [PACKAGE / "tracer.py", *sorted((PACKAGE / "autograd").glob("*.py"))]
    above = ("torchtrace.inspect", "torchtrace.check", "torchtrace.nn", "torchtrace.ops", "torchtrace.port")
    offenders = {module_name(p): sorted(m for m in imported_modules(p) if m.startswith(above)) for p in core}
    offenders = {k: v for k, v in offenders.items() if v}
    assert not offenders, f"the core imports tools above it: {offenders}"
