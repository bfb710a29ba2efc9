"""Imports run one way: tracer -> dispatch -> function/node/engine; the core never imports the tools above it.

"One way" is checked as graph theory says it: the import graph (every `import` and `from ... import` in a file,
at module level or inside a function) has no strongly connected component of more than one member, between
files and between packages. A package here is a folder of torchtrace (`torchtrace.nn`, `torchtrace.inspect`,
`torchtrace.inspect.explore`) or a module at the package root (`torchtrace.tracer`); the public facade
`torchtrace/__init__.py`, which imports everything to offer its names, is left out as an importer.
"""
import ast
import pathlib
import subprocess
import sys
from typing import Dict, List, Set

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "torchtrace"
FACADE = "torchtrace"

Graph = Dict[str, Set[str]]


def module_name(path: pathlib.Path, root: pathlib.Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: pathlib.Path, root: pathlib.Path) -> Set[str]:
    """The modules of the package at `root` that a file imports (at any level, imports inside functions included).

    `from torchtrace.ops import reduction` imports the module torchtrace.ops.reduction, not the package's
    own code, so it counts as that module only.
    """
    top = root.name
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == top and not node.level:
            submodules = {f"{node.module}.{alias.name}" for alias in node.names}
            modules = {s for s in submodules if _exists(root, s)}
            found.update(modules)
            if modules != submodules:  # some names are not submodules: the package's (or module's) own code
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.split(".")[0] == top)
    return found


def _exists(root: pathlib.Path, module: str) -> bool:
    path = root.parent / module.replace(".", "/")
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def file_graph(root: pathlib.Path) -> Graph:
    """module -> the package's modules it imports (the facade imports nothing here)."""
    graph = {module_name(p, root): imported_modules(p, root) for p in root.rglob("*.py")}
    graph[root.name] = set()
    return graph


def unit_of(module: str, folders: Set[str], top: str) -> str:
    """The package a module belongs to: the folder it sits in (torchtrace.nn.conv -> torchtrace.nn), a folder's own
    __init__ is the folder, and a module at the root (torchtrace.tracer) is a package of its own."""
    if module in folders:
        return module
    parent = module.rpartition(".")[0]
    return module if parent in ("", top) else parent


def package_graph(root: pathlib.Path) -> Graph:
    """package -> the packages its files import."""
    folders = {module_name(p, root) for p in root.rglob("__init__.py")}
    graph: Graph = {}
    for module, targets in file_graph(root).items():
        unit = unit_of(module, folders, root.name)
        edges = graph.setdefault(unit, set())
        edges.update(t for t in (unit_of(target, folders, root.name) for target in targets) if t != unit)
    return graph


def cycles(graph: Graph) -> List[List[str]]:
    """Strongly connected components with more than one member (Tarjan's algorithm, iterative), and self-imports."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    on_stack: Set[str] = set()
    stack: List[str] = []
    found: List[List[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, targets = work[-1]
            for target in targets:
                if target not in graph:
                    continue
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1 or node in graph.get(node, ()):
                        found.append(sorted(component))
    return found


def test_no_import_cycle_between_files():
    found = cycles(file_graph(PACKAGE))
    assert not found, f"{len(found)} import cycles between files: {found}"


def test_no_import_cycle_between_packages():
    found = cycles(package_graph(PACKAGE))
    assert not found, f"{len(found)} import cycles between packages: {found}"


def test_a_planted_cycle_is_found(tmp_path):
    """A package whose two files import each other only inside functions, and whose two subpackages import each
    other through a third file: both levels must fail."""
    root = tmp_path / "planted"
    (root / "low").mkdir(parents=True)
    (root / "high").mkdir()
    for init in (root, root / "low", root / "high"):
        (init / "__init__.py").write_text("")
    (root / "a.py").write_text("def f():\n    from planted import b\n")
    (root / "b.py").write_text("def g():\n    import planted.a\n")
    (root / "low" / "core.py").write_text("from planted.high.tool import x\n")
    (root / "high" / "tool.py").write_text("x = 1\n")
    (root / "high" / "user.py").write_text("from planted.low import core\n")
    assert ["planted.a", "planted.b"] in cycles(file_graph(root))
    assert ["planted.high", "planted.low"] in cycles(package_graph(root))
    assert not any("planted.high.tool" in c for c in cycles(file_graph(root)))  # a one-way chain is no cycle


def _owned_names(path: pathlib.Path) -> Set[str]:
    """Names a module owns: those it defines (functions, classes, assignments) and those it takes from outside
    torchtrace (torch's schedulers, re-exported), not names it imports from another torchtrace module."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.ImportFrom) and not (node.module or "").startswith("torchtrace"):
            names.update(alias.asname or alias.name for alias in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
    return names


def test_names_are_imported_from_the_module_that_defines_them():
    """`from torchtrace.x import name` names the module that owns `name`, not one that re-imports it (packages'
    __init__ files, which offer their modules' names, excepted)."""
    wrong = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.ImportFrom) and (node.module or "").startswith("torchtrace")):
                continue
            source = PACKAGE.parent / (node.module.replace(".", "/") + ".py")
            if not source.exists():
                continue  # a package: its __init__ offers its modules' names
            owned = _owned_names(source)
            wrong += [f"{module_name(path, PACKAGE)}: {alias.name} from {node.module}" for alias in node.names
                      if alias.name not in owned]
    assert not wrong, f"names imported from a module that does not own them: {wrong}"


def test_the_engine_loads_no_inspection_tool():
    code = ("import sys, torchtrace.autograd.engine, torchtrace.tracer; "
            "print([m for m in sys.modules if m.startswith('torchtrace.inspect')])")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_the_core_imports_nothing_above_it():
    core = [PACKAGE / "tracer.py", PACKAGE / "tensor_protocols.py", *sorted((PACKAGE / "autograd").glob("*.py"))]
    above = ("torchtrace.inspect", "torchtrace.check", "torchtrace.nn", "torchtrace.ops", "torchtrace.port",
             "torchtrace.compiler", "torchtrace.interop")
    offenders = {module_name(p, PACKAGE): sorted(m for m in imported_modules(p, PACKAGE) if m.startswith(above))
                 for p in core}
    offenders = {k: v for k, v in offenders.items() if v}
    assert not offenders, f"the core imports tools above it: {offenders}"
