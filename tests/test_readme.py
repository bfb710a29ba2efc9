"""Every Python block of the README runs, in a fresh interpreter, and prints exactly what its comments say; every
other listing of torchtrace's output in the README is generated (docs/gen/listings.py) and current.

The README's convention, checked here strictly:
- blocks fenced as ```python run in order, in one namespace, in a fresh `python` process (as a new user's);
- a statement that prints must carry its output as comments: the comment on its last line is the first printed
  line, and each following line made only of `# ...` is the next printed line (a blank line ends the output);
- `...` inside an expected line matches any text (as doctest's ELLIPSIS); use it only for float noise that
  differs between CPUs;
- a statement that prints nothing may carry prose comments, but none that claims a value (`# tensor(`,
  `# tracer(`, `# True`, `# False`, a number): values are shown only where the code prints them.
"""
import ast
import importlib.util
import io
import json
import os
import re
import subprocess
import sys
import tokenize
from contextlib import redirect_stdout
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
_CLAIM = re.compile(r"^(tensor\(|tracer\(|True$|False$|-?\d)")
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
RUN_DOCS = [ROOT / "docs" / "forward_mode.md"]  # docs pages whose Python blocks run as the README's do


def python_blocks(text: str) -> List[str]:
    return _BLOCK.findall(text)


def comments_by_line(source: str) -> Dict[int, str]:
    """1-based line number -> the text of the comment on that line (without '# ')."""
    found = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            found[token.start[0]] = re.sub(r"^# ?", "", token.string)
    return found


def statements(source: str) -> List[Tuple[ast.stmt, List[str]]]:
    """Each top-level statement with its comment lines: the one on its last line, then whole-line comments below."""
    lines = source.splitlines()
    comments = comments_by_line(source)
    result = []
    for node in ast.parse(source).body:
        expected = [comments[node.end_lineno]] if node.end_lineno in comments else []
        following = node.end_lineno  # 1-based number of the last line used
        while following < len(lines) and lines[following].lstrip().startswith("#"):
            expected.append(comments[following + 1])
            following += 1
        result.append((node, expected))
    return result


def matches(expected: str, printed: str) -> bool:
    pattern = ".*".join(re.escape(part) for part in expected.rstrip().split("..."))
    return re.fullmatch(pattern, printed.rstrip()) is not None


def run_blocks(text: str) -> List[str]:
    """Executes every block; returns the problems found (empty when the README is true)."""
    namespace: dict = {"__name__": "__readme__"}
    problems = []
    for number, block in enumerate(python_blocks(text), 1):
        for node, expected in statements(block):
            out = io.StringIO()
            with redirect_stdout(out):
                exec(compile(ast.Module([node], type_ignores=[]), f"README block {number}", "exec"), namespace)
            printed = out.getvalue().splitlines()
            where = f"block {number}, line {node.lineno}: {ast.get_source_segment(block, node).splitlines()[0]!r}"
            if printed:
                if len(printed) != len(expected) or not all(matches(e, p) for e, p in zip(expected, printed)):
                    problems.append(f"{where}\n  comments say: {expected}\n  it prints:    {printed}")
            elif any(_CLAIM.match(comment) for comment in expected):
                problems.append(f"{where}\n  comments claim a value {expected} but the statement prints nothing")
    return problems


def test_convention_helpers():
    source = "print(1)  # 1\nx = 2  # prose\nprint(x, x)  # 2 2\nprint('a\\nb')  # a\n# b\n"
    assert [e for _, e in statements(source)] == [["1"], ["prose"], ["2 2"], ["a", "b"]]
    assert matches("CheckReport(max = ...)", "CheckReport(max = 1.2e-07)") and not matches("tensor(1.)", "tensor(2.)")
    assert run_blocks("```python\nprint(1 + 1)  # 2\nx = 3  # 3\nprint(x)  # 4\n```\n") == [
        "block 1, line 2: 'x = 3'\n  comments claim a value ['3'] but the statement prints nothing",
        "block 1, line 3: 'print(x)'\n  comments say: ['4']\n  it prints:    ['3']",
    ]


def test_install_commands_name_real_extras_and_the_one_torch_pin():
    text = README.read_text(encoding="utf-8")
    setup = (ROOT / "setup.py").read_text(encoding="utf-8")
    extras = set(re.findall(r'"(\w+)": [A-Z]+', setup[setup.index("extras_require"):]))
    named = set(re.findall(r'-e "\.\[(\w+)\]"', text)) | set(re.findall(r"`\.\[(\w+)\]`", text))
    assert {"examples", "test", "notebooks", "bench"} <= named <= extras
    pins = [line for line in (ROOT / "constraints.txt").read_text().splitlines() if line and not line.startswith("#")]
    assert pins == ["torch==2.13.0"] and "torch==2.13.0" in text
    assert "--index-url https://download.pytorch.org/whl/cpu" in text  # the CPU-only wheel, as PyTorch documents


def test_readme_has_python_blocks():
    assert len(python_blocks(README.read_text(encoding="utf-8"))) >= 2


@pytest.mark.parametrize("page", [README] + RUN_DOCS, ids=lambda p: p.name)
def test_every_readme_block_prints_what_its_comments_say(page):
    done = subprocess.run([sys.executable, __file__, str(page)], capture_output=True, text=True, timeout=300,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr
    problems = json.loads(done.stdout.splitlines()[-1])
    assert not problems, "\n".join(problems)


def listings():
    """docs/gen/listings.py: the README's generated listings."""
    spec = importlib.util.spec_from_file_location("readme_listings", ROOT / "docs" / "gen" / "listings.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_listing_of_output_is_generated():
    """A fenced block that is neither Python (run above) nor a shell command shows output: a listing made by
    running torchtrace, not text typed by hand."""
    text = README.read_text(encoding="utf-8")
    generated = {listings().shown(text, name) for name in listings().marked(text)}
    typed = [body[:80] for language, body in _FENCE.findall(text)
             if language not in ("python", "bash") and body not in generated]
    assert not typed, f"listings typed by hand: {typed}"


def test_generated_listings_are_what_torchtrace_prints_now():
    module, text = listings(), README.read_text(encoding="utf-8")
    names = module.marked(text)
    assert {"mlp_backward_code", "original_snippet_output"} <= set(names)
    stale = [name for name in names if module.shown(text, name) != module.LISTINGS[name]()]
    assert not stale, f"stale listings {stale}: python examples/notebooks/refresh.py README rewrites them"


def test_a_stale_listing_is_rewritten():
    module = listings()
    planted = "before\n<!-- listing: original_snippet_output -->\n```text\nSequence(typed by hand)\n```\nafter\n"
    assert module.shown(planted, "original_snippet_output") == "Sequence(typed by hand)\n"
    fresh = module.regenerated(planted)
    assert fresh.startswith("before\n") and fresh.endswith("```\nafter\n")
    assert module.shown(fresh, "original_snippet_output") == module.original_snippet_output()


if __name__ == "__main__":
    print(json.dumps(run_blocks(Path(sys.argv[1]).read_text(encoding="utf-8"))))
