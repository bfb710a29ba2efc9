"""Whitelist.txt lists every torch API that torchtrace/ uses; torch.autograd is never used.

Regenerate the list after adding rules: python tests/test_whitelist.py --write
"""
import ast
import pathlib
import sys
from typing import Dict, Optional, Set

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "torchtrace"
WHITELIST = ROOT / "Whitelist.txt"


def _dotted(node: ast.AST, aliases: Dict[str, str]) -> Optional[str]:
    """`F.relu` -> 'torch.nn.functional.relu' when F is bound to a torch module; None otherwise."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name) and node.id in aliases:
        return ".".join([aliases[node.id], *reversed(parts)])
    return None


def _aliases(tree: ast.Module) -> Dict[str, str]:
    aliases: Dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for name in node.names:
                if name.name == "torch" or name.name.startswith("torch."):
                    aliases[name.asname or "torch"] = name.name if name.asname else "torch"
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torch":
            for name in node.names:
                aliases[name.asname or name.name] = f"{node.module}.{name.name}"
    for node in tree.body:  # module-level `T = torch.Tensor`
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            target = _dotted(node.value, aliases)
            if target:
                aliases[node.targets[0].id] = target
    return aliases


def torch_apis_used() -> Dict[str, Set[str]]:
    """Every fully-qualified torch name used in the package -> the files that use it."""
    used: Dict[str, Set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        aliases = _aliases(tree)
        inner = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        for node in ast.walk(tree):
            if id(node) in inner or not isinstance(node, (ast.Attribute, ast.Name)):
                continue
            name = _dotted(node, aliases)
            if name and name != "torch":
                used.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    return used


def whitelist() -> Set[str]:
    lines = WHITELIST.read_text(encoding="utf-8").splitlines()
    return {line.strip() for line in lines if line.strip() and not line.startswith("#")}


def test_every_torch_api_used_is_whitelisted():
    missing = {name: files for name, files in torch_apis_used().items() if name not in whitelist()}
    assert not missing, f"torch APIs used but not in Whitelist.txt: {missing}"


def test_whitelist_has_no_stale_entries():
    stale = whitelist() - set(torch_apis_used())
    assert not stale, f"Whitelist.txt lists APIs torchtrace no longer uses: {sorted(stale)}"


# The one exception: this file wraps torch.autograd.Function.apply (a user Function on tracers runs as a torchtrace
# node) and torch.autograd.grad/backward (a clear error on tracers). It never calls torch autograd on tracers.
AUTOGRAD_BRIDGE = "torchtrace/interop/patches.py"


def test_torch_autograd_is_never_used():
    users = {f for name, files in torch_apis_used().items() if name.startswith("torch.autograd") for f in files}
    assert users <= {AUTOGRAD_BRIDGE}, f"torch.autograd used in {sorted(users - {AUTOGRAD_BRIDGE})}"
    offenders = [str(p.relative_to(ROOT)) for p in PACKAGE.rglob("*.py")
                 if "torch.autograd" in p.read_text(encoding="utf-8")]
    assert set(offenders) <= {AUTOGRAD_BRIDGE}, f"torch.autograd appears in {offenders}"


def test_scanner_resolves_aliases():
    tree = ast.parse("import torch\nimport torch.nn.functional as F\nT = torch.Tensor\nx = F.relu\ny = T.add\n")
    aliases = _aliases(tree)
    assert _dotted(tree.body[3].value, aliases) == "torch.nn.functional.relu"
    assert _dotted(tree.body[4].value, aliases) == "torch.Tensor.add"


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    header = ("# Every torch API that torchtrace/ uses (tests/test_whitelist.py checks it).\n"
              "# torch.Tensor.backward and requires_grad_ appear only in torchtrace/check.py, the cross-check\n"
              "# against torch autograd; the engine itself never engages torch's autograd.\n"
              f"# The torch.autograd names are used only by {AUTOGRAD_BRIDGE}: it wraps torch.autograd.Function.apply\n"
              "# to run user Functions as torchtrace nodes (and refuses torch.autograd.grad/backward on tracers);\n"
              "# it never calls torch autograd.\n")
    WHITELIST.write_text(header + "\n".join(sorted(torch_apis_used())) + "\n", encoding="utf-8")
    print(f"wrote {len(torch_apis_used())} entries to {WHITELIST}")
