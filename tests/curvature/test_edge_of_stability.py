"""The edge of stability of lesson 10, asserted: under full-batch gradient descent at learning rate η the
sharpness rises from well below 2/η to within 10% of it and hovers there, for two η, while the loss falls
non-monotonically. The experiment is the lesson's own code (its cell tagged `edge-of-stability`), run full size;
the numbers the lesson stores say the same."""
import re
from pathlib import Path

import nbformat
import pytest
import torch

LESSON = Path(__file__).resolve().parents[2] / "examples" / "notebooks" / "10_curvature.ipynb"
STEPS = 1000  # the lesson's full-size run (smoke mode runs fewer steps)
ETAS = (0.5, 0.4)


def lesson_cells(tag):
    return [cell for cell in nbformat.read(LESSON, as_version=4).cells
            if cell.cell_type == "code" and tag in cell.metadata.get("tags", [])]


@pytest.fixture(scope="module")
def experiment():
    """The lesson's setup and experiment cells, run here; what the setup changes process-wide (the default dtype,
    the random state) is put back afterwards, so no later test runs in the lesson's float64."""
    namespace = {}
    setup = [cell for cell in nbformat.read(LESSON, as_version=4).cells if cell.cell_type == "code"][0]
    dtype, rng = torch.get_default_dtype(), torch.get_rng_state()
    try:
        exec(setup.source, namespace)
        (code,) = lesson_cells("edge-of-stability")
        exec(code.source, namespace)
        yield namespace
    finally:
        torch.set_default_dtype(dtype)
        torch.set_rng_state(rng)


@pytest.mark.parametrize("eta", ETAS)
def test_sharpness_rises_to_two_over_eta_and_hovers_there(experiment, eta):
    _, _, losses, sharpness, _ = experiment["gradient_descent"](eta, STEPS)
    edge = experiment["at_the_edge"](sharpness, STEPS)
    assert sharpness[0][1] < 0.75 * 2 / eta  # progressive sharpening: it starts well below the threshold
    assert abs(edge / (2 / eta) - 1) < 0.10
    late = [s for step, s in sharpness if step >= STEPS // 2]
    assert max(late) < 1.25 * 2 / eta and min(late) > 0.75 * 2 / eta  # it hovers: no escape either way
    rises = sum(later > earlier for earlier, later in zip(losses, losses[1:]))
    assert rises > 0 and losses[-1] < 0.2 * losses[0]  # non-monotone, yet it trains


def test_the_stored_lesson_reports_the_same():
    results = [cell for cell in nbformat.read(LESSON, as_version=4).cells if cell.cell_type == "code"
               and "at_the_edge(sharpness, steps)" in cell.source and "for eta in" in cell.source]
    (cell,) = results
    printed = "".join(output.get("text", "") for output in cell.outputs)
    away = [float(x) for x in re.findall(r"2/eta = [\d.]+: ([\d.]+)% away", printed)]
    assert len(away) == 2 and all(x < 10 for x in away), printed
    assert f"of {STEPS} steps" in printed, "the lesson is stored from its full-size run"
