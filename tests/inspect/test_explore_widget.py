"""tt.explore in Jupyter: a notebook that displays `ex`, executed by nbclient, shows the anywidget with the steps."""
import json
import os
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[2]
WIDGET = "application/vnd.jupyter.widget-view+json"
CODE = """
import torchtrace as tt
a, b, c, f = (tt.tracer(v, requires_grad=True) for v in (2.0, -3.0, 10.0, -2.0))
e = a * b
d = e + c
L = d * f
ex = tt.explore(L)
ex
"""


def test_notebook_displays_the_player_widget(monkeypatch):
    pytest.importorskip("anywidget", reason="the widget needs anywidget (pip install anywidget)")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(CODE)])
    NotebookClient(notebook, timeout=120, kernel_name="python3").execute()
    (output,) = notebook.cells[0].outputs
    assert output.output_type == "execute_result"
    assert output.data["text/plain"] == "<tt.explore: 7 steps (3 rules, 4 sums into .grad)>"
    model_id = output.data[WIDGET]["model_id"]
    state = notebook.metadata.widgets["application/vnd.jupyter.widget-state+json"]["state"][model_id]["state"]
    data = json.loads(state["data"])
    assert [s["name"] for s in data["steps"]] == ["MulBackward → L", "f", "AddBackward → d", "c", "MulBackward → e",
                                                  "b", "a"]
    assert [s["gradient"] for s in data["steps"][4]["sent"]] == ["6", "-4"]
    assert "torchtracePlayer" in state["_esm"]
