"""The teaching notebooks and their solutions are stored with their outputs, and those outputs are not stale.

Each notebook is re-executed in smoke mode (TORCHTRACE_SMOKE=1, a fresh kernel importing this checkout);
every code cell's normalised text output must equal the stored one, except cells tagged `smoke-varies`
(their numbers depend on the number of training steps), which must still produce the same kinds of output.
After a change that alters an output, run `python examples/notebooks/refresh.py` and commit the notebooks.
"""
import importlib.util
from pathlib import Path

import nbformat
import pytest

NOTEBOOKS = Path(__file__).resolve().parents[1] / "examples" / "notebooks"
EXPECTED = [
    "00_backprop_by_hand.ipynb",
    "01_tracer_basics.ipynb",
    "02_writing_gradient_rules.ipynb",
    "03_layers_and_training.ipynb",
    "04_gradient_flow.ipynb",
    "05_porting_torch_models.ipynb",
    "06_higher_order.ipynb",
]
COMPILE_NOTEBOOK = "07_backward_as_code.ipynb"  # executed below; its timings vary, so no stored-output comparison
SOLUTIONS = [name.replace(".ipynb", "_solutions.ipynb") for name in EXPECTED + [COMPILE_NOTEBOOK]]
ALL = EXPECTED + [f"solutions/{name}" for name in SOLUTIONS]

_spec = importlib.util.spec_from_file_location("notebook_refresh", NOTEBOOKS / "refresh.py")
refresh = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(refresh)


def code_cells(notebook):
    return [cell for cell in notebook.cells if cell.cell_type == "code"]


def test_every_notebook_has_its_solutions():
    assert sorted(p.name for p in NOTEBOOKS.glob("*.ipynb")) == sorted(EXPECTED + [COMPILE_NOTEBOOK])
    assert sorted(p.name for p in (NOTEBOOKS / "solutions").glob("*.ipynb")) == SOLUTIONS


@pytest.mark.parametrize("name", EXPECTED + [COMPILE_NOTEBOOK])
def test_notebook_ends_with_exercises_and_a_checker(name):
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    markdown = [i for i, cell in enumerate(notebook.cells) if cell.cell_type == "markdown"
                and cell.source.startswith("## Exercises")]
    assert len(markdown) == 1, "one '## Exercises' section"
    after = "\n".join(cell.source for cell in notebook.cells[markdown[0]:])
    assert "tt.check" in after and "solutions/" in after


@pytest.mark.parametrize("name", ALL)
def test_notebook_is_stored_executed(name):
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    nbformat.validate(notebook)
    cells = code_cells(notebook)
    assert cells and all(cell.execution_count is not None for cell in cells), "stored without outputs: refresh it"
    counts = [cell.execution_count for cell in cells]
    assert counts == list(range(1, len(cells) + 1)), "cells executed out of order: refresh it"
    assert not [o for cell in cells for o in cell.outputs if o.output_type == "error"]


@pytest.mark.parametrize("name", ALL)
def test_stored_outputs_are_what_the_code_prints(name):
    stored = nbformat.read(NOTEBOOKS / name, as_version=4)
    fresh = refresh.execute(NOTEBOOKS / name, smoke=True, timeout=300)  # raises on the first failing cell
    for index, (old, new) in enumerate(zip(code_cells(stored), code_cells(fresh))):
        where = f"{name}, code cell {index + 1}:\n{old.source[:200]}"
        assert not [o for o in new.outputs if o.output_type == "error"], where
        if refresh.TAG in old.metadata.get("tags", []):
            assert refresh.kinds(new) == refresh.kinds(old), where
        else:
            assert refresh.texts(new) == refresh.texts(old), f"stale output in {where}\n(refresh.py re-stores it)"


def test_normalisation_ignores_only_what_varies():
    out = nbformat.v4.new_output
    assert refresh.normalised_output(out("stream", name="stderr", text="100%|███| 3/3 [00:01<00:00]")) is None
    assert refresh.normalised_output(out("stream", name="stdout", text="took 12.5 s at 0x7f3a  \n")) == \
        "stdout: took <time> at 0x…"
    assert refresh.normalised_output(out("stream", name="stdout", text="loss 0.1235")) != \
        refresh.normalised_output(out("stream", name="stdout", text="loss 0.1234"))
    assert refresh.normalised_output(out("stream", name="stdout", text="diff 2.38e-07, 1.5e-05 vs 3.1e-04")) == \
        "stdout: diff <rounding>, <rounding> vs 3.1e-04"
    svg = '<svg><text x="1">a | data 2.0000</text><text>grad &#45;1.5</text></svg>'
    assert refresh.normalised_output(out("display_data", data={"image/svg+xml": svg, "text/plain": "<Digraph>"})) \
        == "svg: a | data 2.0000 | grad -1.5"


def test_backward_as_code_notebook_runs(monkeypatch):
    import nbformat
    from nbclient import NotebookClient

    monkeypatch.setenv("TORCHTRACE_SMOKE", "1")
    monkeypatch.setenv("PYTHONPATH", str(NOTEBOOKS.parents[1]))
    notebook = nbformat.read(NOTEBOOKS / COMPILE_NOTEBOOK, as_version=4)
    NotebookClient(notebook, timeout=600, resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    printed = "".join(o.get("text", "") for c in notebook.cells for o in c.get("outputs", []))
    assert "def backward" in printed
