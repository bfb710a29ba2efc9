"""Execute the teaching notebooks and store them WITH their outputs; compare outputs for staleness.

    python examples/notebooks/refresh.py              # re-execute every notebook (full size) and store it
    python examples/notebooks/refresh.py 00 04        # only the notebooks whose names start with these
    python examples/notebooks/refresh.py README       # only README.md's generated code listings

Every run also rewrites README.md's generated listings (docs/gen/listings.py): the blocks that show torchtrace's
output, such as the code `to_code` writes, are made by running torchtrace, never typed by hand.

Each notebook is executed twice: full size (what is stored and what a student sees) and smoke size
(TORCHTRACE_SMOKE=1, what CI re-executes). Cells whose text output differs between the two (training curves,
accuracies after a few steps) get the cell tag `smoke-varies`; tests/test_notebooks.py re-executes every
notebook in smoke mode and requires every other cell's text output to equal the stored one (`normalised`
below: stdout, results, the text labels of SVG drawings; timings, memory addresses and stderr — where tqdm
and warnings go — are ignored, and so are the digits of numbers printed as 1e-5 or smaller: float rounding,
which another CPU may do differently). A tagged cell must still produce the same kinds of outputs.
"""
import html
import importlib.util
import os
import re
import sys
from pathlib import Path
from typing import Dict, List, Optional

import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
TAG = "smoke-varies"
RAISES = "raises-exception"
NOTEBOOKS = sorted(HERE.glob("*.ipynb"))
SOLUTIONS = sorted((HERE / "solutions").glob("*.ipynb"))

_ADDRESS = re.compile(r"0x[0-9a-fA-F]+")
_TIME = re.compile(r"\b\d+(?:\.\d+)?\s?(?:s|ms|µs|us|min)\b")
_ROUNDING = re.compile(r"-?\d+(?:\.\d+)?e-(?:0?[5-9]|[1-9]\d)\b")  # 1e-5 and below: float rounding, CPU-dependent
_SVG_TEXT = re.compile(r"<text[^>]*>(.*?)</text>", re.S)
_NUMBER = r"(-?\d+(?:\.\d+)?(?:e[-+]?\d+)?)"
_DIFFERENCE = re.compile(r"(?:difference from torch autograd|max \|diff\| =)\D*?" + _NUMBER)
_TABLE_HEADER = "|torch - torchtrace|"  # a table whose rows end with the difference


def environment(smoke: bool) -> Dict[str, str]:
    """The kernel's environment: this checkout's torchtrace first, one thread, a non-interactive backend."""
    env = {"OMP_NUM_THREADS": "1", "MPLBACKEND": "module://matplotlib_inline.backend_inline",
           "PYTHONHASHSEED": "0", "TORCHTRACE_SMOKE": "1" if smoke else "0"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return env


def execute(path: Path, smoke: bool, timeout: int = 600) -> nbformat.NotebookNode:
    """The notebook at `path`, executed in a fresh kernel (raises CellExecutionError on the first failing cell)."""
    notebook = nbformat.read(path, as_version=4)
    saved = {key: os.environ.get(key) for key in environment(smoke)}
    os.environ.update(environment(smoke))  # the kernel inherits this process's environment
    try:
        NotebookClient(notebook, timeout=timeout, kernel_name="python3",
                       resources={"metadata": {"path": str(path.parent)}}).execute()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return notebook


def _text(value) -> str:
    text = "".join(value) if isinstance(value, list) else str(value)
    text = _ROUNDING.sub("<rounding>", _TIME.sub("<time>", _ADDRESS.sub("0x…", text)))
    return "\n".join(line.rstrip() for line in text.strip().splitlines())


def normalised_output(output: nbformat.NotebookNode) -> Optional[str]:
    """What must not change when the code does not: None for outputs that legitimately vary (stderr)."""
    kind = output.output_type
    if kind == "stream":
        return None if output.name == "stderr" else "stdout: " + _text(output.text)
    if kind == "error":
        return f"error: {output.ename}: {_text(output.evalue)}"
    data = output.get("data", {})
    if "image/svg+xml" in data:
        labels = [html.unescape(t).strip() for t in _SVG_TEXT.findall("".join(data["image/svg+xml"]))]
        return "svg: " + _text(" | ".join(t for t in labels if t))
    if "image/png" in data:
        return "png"
    return f"{kind}: " + _text(data.get("text/plain", ""))


def _merged(cell: nbformat.NotebookNode) -> List[nbformat.NotebookNode]:
    """The cell's outputs without stderr, consecutive stdout chunks joined (how the kernel splits them varies)."""
    merged: List[nbformat.NotebookNode] = []
    for output in cell.outputs:
        if output.output_type == "stream" and output.name == "stderr":
            continue
        if output.output_type == "stream" and merged and merged[-1].output_type == "stream":
            merged[-1] = nbformat.v4.new_output("stream", name="stdout", text=merged[-1].text + output.text)
        else:
            merged.append(output)
    return merged


def kinds(cell: nbformat.NotebookNode) -> List[str]:
    """The output kinds of a cell, in order, for cells whose values may differ in smoke mode."""
    return [output.output_type if output.output_type in ("stream", "error") else sorted(output.get("data", {}))[0]
            for output in _merged(cell)]


def texts(cell: nbformat.NotebookNode) -> List[str]:
    """The normalised outputs of a cell, in order."""
    return [normalised_output(output) for output in _merged(cell)]


def silent_error_cells(notebook: nbformat.NotebookNode) -> List[int]:
    """Indices (among code cells, from 1) of cells tagged `raises-exception` that raised nothing."""
    cells = [cell for cell in notebook.cells if cell.cell_type == "code"]
    return [i for i, cell in enumerate(cells, 1) if RAISES in cell.metadata.get("tags", [])
            and not any(o.output_type == "error" for o in cell.outputs)]


def differences_from_torch(notebook: nbformat.NotebookNode, limit: float = 1e-6) -> List[str]:
    """Printed lines that report a gradient (or output) difference from torch autograd above `limit`.

    Reports are `... difference from torch autograd: X`, tt.check's `max |diff| = X` and the rows of a table
    headed `|torch - torchtrace|`; an error shown on purpose (a caught GradientMismatch, a `wrong:` verdict) is
    not a report.
    """
    found = []
    for cell in notebook.cells:
        for output in cell.get("outputs", []) if cell.cell_type == "code" else []:
            if output.output_type != "stream" or output.name != "stdout":
                continue
            in_table = False
            for line in "".join(output.text).splitlines():
                if "GradientMismatch" in line or line.startswith(("wrong", "First diverging")):
                    continue
                values = [float(v) for v in _DIFFERENCE.findall(line)]
                if in_table and line.split():
                    values.append(float(line.split()[-1]))
                in_table = in_table or _TABLE_HEADER in line
                if any(v > limit for v in values):
                    found.append(line.strip())
    return found


def _clean(notebook: nbformat.NotebookNode) -> None:
    """Drop what differs between runs and is not output: execution timestamps, widget state."""
    notebook.metadata.pop("widgets", None)
    for cell in notebook.cells:
        cell.metadata.pop("execution", None)


def refresh(path: Path) -> None:
    """Execute `path` full size and smoke size; store the full run with `smoke-varies` tags."""
    full, smoke = execute(path, smoke=False), execute(path, smoke=True)
    silent = silent_error_cells(full)
    if silent:
        raise RuntimeError(f"{path.name}: code cells {silent} are tagged {RAISES!r} but raised nothing")
    for cell, small in zip(full.cells, smoke.cells):
        if cell.cell_type != "code":
            continue
        tags = [t for t in cell.metadata.get("tags", []) if t != TAG]
        if texts(cell) != texts(small):
            tags.append(TAG)
        if tags:
            cell.metadata["tags"] = tags
        else:
            cell.metadata.pop("tags", None)
    _clean(full)
    nbformat.validate(full)
    nbformat.write(full, path)


def listings():
    """docs/gen/listings.py, which writes README.md's generated listings."""
    spec = importlib.util.spec_from_file_location("readme_listings", ROOT / "docs" / "gen" / "listings.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(prefixes: List[str]) -> None:
    for path in NOTEBOOKS + SOLUTIONS:
        if not prefixes or any(path.name.startswith(p) for p in prefixes):
            print("executing", path.relative_to(ROOT), flush=True)
            refresh(path)
    sys.path.insert(0, str(ROOT))  # this checkout's torchtrace
    print("README.md's listings:", "rewritten" if listings().refresh_readme() else "unchanged", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
