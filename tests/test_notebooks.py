"""The teaching notebooks and their solutions are stored with their outputs, and those outputs are not stale.

Each notebook is re-executed in smoke mode (TORCHTRACE_SMOKE=1, a fresh kernel importing this checkout);
every code cell's normalised text output must equal the stored one, except cells tagged `smoke-varies`
(their numbers depend on the number of training steps), which must still produce the same kinds of output.
After a change that alters an output, run `python examples/notebooks/refresh.py` and commit the notebooks.

Lessons cannot drift from the code: a cell tagged `raises-exception` (a refusal shown on purpose) must raise
when re-executed, the ops the lessons show refused must still have no rule, and no stored output may report a
difference from torch autograd above 1e-6. Each of these checks is shown failing on a planted drift below.
"""
import importlib.util
import re
from pathlib import Path

import nbformat
import pytest
import torch

import torchtrace as tt
from torchtrace.autograd.function import RULES

NOTEBOOKS = Path(__file__).resolve().parents[1] / "examples" / "notebooks"
EXPECTED = [  # in learning order
    "00_backprop_by_hand.ipynb",
    "00a_build_the_engine.ipynb",
    "01_tracer_basics.ipynb",
    "01a_training_by_hand.ipynb",
    "02_writing_gradient_rules.ipynb",
    "03_layers_and_training.ipynb",
    "04_gradient_flow.ipynb",
    "05_porting_torch_models.ipynb",
    "06_higher_order.ipynb",
    "06a_forward_and_reverse_mode.ipynb",
    "07_backward_as_code.ipynb",
    "08_debugging_gradients.ipynb",
    "09_mixed_precision.ipynb",
    "10_curvature.ipynb",
]
SOLUTIONS = [name.replace(".ipynb", "_solutions.ipynb") for name in EXPECTED]
ALL = EXPECTED + [f"solutions/{name}" for name in SOLUTIONS]

_spec = importlib.util.spec_from_file_location("notebook_refresh", NOTEBOOKS / "refresh.py")
refresh = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(refresh)


def code_cells(notebook):
    return [cell for cell in notebook.cells if cell.cell_type == "code"]


def test_every_notebook_has_its_solutions():
    assert sorted(p.name for p in NOTEBOOKS.glob("*.ipynb")) == sorted(EXPECTED)
    assert sorted(p.name for p in (NOTEBOOKS / "solutions").glob("*.ipynb")) == sorted(SOLUTIONS)


@pytest.mark.parametrize("name", EXPECTED)
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
    errors = [i for i, cell in enumerate(cells, 1) for o in cell.outputs if o.output_type == "error"
              and refresh.RAISES not in cell.metadata.get("tags", [])]
    assert not errors, f"code cells {errors} stored an error without the '{refresh.RAISES}' tag"
    assert not refresh.silent_error_cells(notebook), "a cell tagged to raise was stored without its error"


@pytest.mark.parametrize("name", ALL)
def test_stored_outputs_are_what_the_code_prints(name):
    stored = nbformat.read(NOTEBOOKS / name, as_version=4)
    fresh = refresh.execute(NOTEBOOKS / name, smoke=True, timeout=300)  # raises on the first failing cell
    assert not refresh.silent_error_cells(fresh), f"{name}: cells {refresh.silent_error_cells(fresh)} are tagged " \
        f"'{refresh.RAISES}' but raised nothing: the lesson shows a refusal that no longer happens"
    for index, (old, new) in enumerate(zip(code_cells(stored), code_cells(fresh))):
        where = f"{name}, code cell {index + 1}:\n{old.source[:200]}"
        if refresh.RAISES not in old.metadata.get("tags", []):
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
    assert refresh.normalised_output(out("stream", name="stdout", text="eager torchtrace     3569 us per step")) == \
        refresh.normalised_output(out("stream", name="stdout", text="eager torchtrace     412 us per step"))
    assert refresh.normalised_output(out("stream", name="stdout", text="loss 0.1235")) != \
        refresh.normalised_output(out("stream", name="stdout", text="loss 0.1234"))
    assert refresh.normalised_output(out("stream", name="stdout", text="diff 2.38e-07, 1.5e-05 vs 3.1e-04")) == \
        "stdout: diff <rounding>, <rounding> vs 3.1e-04"
    svg = '<svg><text x="1">a | data 2.0000</text><text>grad &#45;1.5</text></svg>'
    assert refresh.normalised_output(out("display_data", data={"image/svg+xml": svg, "text/plain": "<Digraph>"})) \
        == "svg: a | data 2.0000 | grad -1.5"


@pytest.mark.parametrize("name", ALL)
def test_no_stored_output_reports_a_difference_from_torch_above_1e_6(name):
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    assert not refresh.differences_from_torch(notebook), "a lesson prints a gradient that differs from torch"


def test_a_planted_difference_from_torch_is_found():
    out = nbformat.v4.new_output
    cell = nbformat.v4.new_code_cell("...")
    cell.outputs = [out("stream", name="stdout", text="largest gradient difference from torch autograd: 6.24e-02\n"
                        "CheckReport(ok: 1 outputs and 1 input gradients match torch autograd over 2 graph nodes, "
                        "max |diff| = 4.77e-07)\n"),
                    out("stream", name="stdout", text="parameter   max |torch - torchtrace|\nfc.weight   1.5e-07\n"
                        "fc.bias   3.0e-03\n"),
                    out("stream", name="stdout", text="GradientMismatch: gradient of input 0 differs from torch "
                        "autograd: max |diff| = 1.3\n")]
    notebook = nbformat.v4.new_notebook(cells=[cell])
    assert refresh.differences_from_torch(notebook) == [
        "largest gradient difference from torch autograd: 6.24e-02", "fc.bias   3.0e-03"]


REFUSED_IN_EXERCISES = {"torch.special.modified_bessel_i0"}  # notebook 05's exercise writes its rule


def refused_in_lessons():
    """The torch callables whose refusal a lesson shows (named by the stored UnsupportedOperationError outputs),
    and those an exercise says have no rule."""
    names = set(REFUSED_IN_EXERCISES)
    for path in sorted(NOTEBOOKS.glob("*.ipynb")) + sorted((NOTEBOOKS / "solutions").glob("*.ipynb")):
        for cell in code_cells(nbformat.read(path, as_version=4)):
            for output in cell.outputs:
                if output.output_type == "error" and output.ename == "UnsupportedOperationError":
                    names.add(re.match(r"([\w.]+):", output.evalue).group(1))
    return sorted(names)


def still_refused(name: str) -> bool:
    """Does calling `name` on a tracer that requires a gradient still raise UnsupportedOperationError?"""
    func = torch
    for part in name.split(".")[1:]:
        func = getattr(func, part)
    try:
        func(tt.randn(4, requires_grad=True))
    except tt.UnsupportedOperationError:
        return True
    return False


def test_the_ops_lessons_show_refused_still_have_no_rule():
    names = refused_in_lessons()
    assert "torch.special.bessel_j0" in names
    gained = [name for name in names if not still_refused(name)]
    assert not gained, f"{gained} gained a rule: the lessons that show them refused need another op"


def test_a_planted_rule_makes_the_refusal_check_fail(monkeypatch):
    class BesselJ0(tt.Function):
        """y = J0(x)  ->  dy/dx = -J1(x)"""

        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return torch.special.bessel_j0(x)

        @staticmethod
        def backward(ctx, grad):
            return -grad * torch.special.bessel_j1(ctx.saved_tensors[0])

    assert still_refused("torch.special.bessel_j0")
    monkeypatch.setitem(RULES, torch.special.bessel_j0, BesselJ0)
    assert not still_refused("torch.special.bessel_j0")


def test_a_cell_that_should_raise_but_does_not_fails_the_run(tmp_path):
    planted = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("import torch\nimport torchtrace as tt\nx = tt.randn(3, requires_grad=True)"),
        nbformat.v4.new_code_cell("torch.special.bessel_j0(x)  # refused", metadata={"tags": [refresh.RAISES]}),
        nbformat.v4.new_code_cell("torch.exp(x)  # has a rule: the drift", metadata={"tags": [refresh.RAISES]}),
    ])
    nbformat.write(planted, tmp_path / "planted.ipynb")
    fresh = refresh.execute(tmp_path / "planted.ipynb", smoke=True, timeout=120)
    assert refresh.silent_error_cells(fresh) == [3]


_RULE_COUNT = re.compile(r"\b\d[\d,]*\s+(?:supported\s+)?(?:torch\s+)?(?:callables|rules|ops|operations)\b", re.I)


def rule_counts_in_prose(text: str) -> list:
    """Numbers of supported callables or rules written as prose: the next rule added would falsify them."""
    return _RULE_COUNT.findall(text)


def test_prose_states_no_count_of_rules_that_a_new_rule_would_falsify():
    assert rule_counts_in_prose("`python -m torchtrace ops` lists every supported callable (about 380 callables)")
    prose = {"README.md": (NOTEBOOKS.parents[1] / "README.md").read_text(encoding="utf-8")}
    for path in sorted(NOTEBOOKS.glob("*.ipynb")) + sorted((NOTEBOOKS / "solutions").glob("*.ipynb")):
        notebook = nbformat.read(path, as_version=4)
        prose[path.name] = "\n".join(cell.source for cell in notebook.cells if cell.cell_type == "markdown")
    found = {name: rule_counts_in_prose(text) for name, text in prose.items() if rule_counts_in_prose(text)}
    assert not found, f"print counts from the code (len(tt.supported_ops())) instead: {found}"
