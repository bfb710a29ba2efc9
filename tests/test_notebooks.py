"""The teaching notebooks execute without error (smoke-sized, TORCHTRACE_SMOKE=1) and are stored without outputs."""
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parents[1] / "examples" / "notebooks"
EXPECTED = [
    "01_tracer_basics.ipynb",
    "02_writing_gradient_rules.ipynb",
    "03_layers_and_training.ipynb",
    "04_gradient_flow.ipynb",
    "05_porting_torch_models.ipynb",
    "06_higher_order.ipynb",
]


def test_the_six_notebooks_are_there():
    assert sorted(p.name for p in NOTEBOOKS.glob("*.ipynb")) == EXPECTED


@pytest.mark.parametrize("name", EXPECTED)
def test_notebook_is_stored_without_outputs(name):
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    nbformat.validate(notebook)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert code and all(not cell.outputs and cell.execution_count is None for cell in code)
    assert any(cell.cell_type == "markdown" for cell in notebook.cells)


@pytest.mark.parametrize("name", EXPECTED)
def test_notebook_executes(name, monkeypatch):
    monkeypatch.setenv("TORCHTRACE_SMOKE", "1")  # the kernel inherits the environment
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    client = NotebookClient(notebook, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOKS)}})
    client.execute()  # raises CellExecutionError, with the cell and its traceback, on the first failing cell
    outputs = [output for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs]
    assert outputs and not [output for output in outputs if output.output_type == "error"]
