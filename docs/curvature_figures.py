"""The curvature page's figures are lesson 10's own plots: python docs/curvature_figures.py copies them from the
stored (executed) notebook, so the page shows what the lesson's code drew (refresh the notebook first)."""
import base64
import os

import nbformat

HERE = os.path.dirname(os.path.abspath(__file__))
LESSON = os.path.join(HERE, "..", "examples", "notebooks", "10_curvature.ipynb")
FIGURES = {  # figure name -> a line of the cell that draws it
    "curvature_newton_vs_gd": 'ax.set_title("first 12 steps on a quadratic")',
    "curvature_edge_of_stability": 'ax_sharp.set_title("sharpness (top Hessian eigenvalue); dashed: 2 / eta")',
    "curvature_density": "density = s.density(iterations=40, runs=3)",
    "curvature_landscape": "L.plot(path=checkpoints)",
}


def main() -> None:
    cells = [c for c in nbformat.read(LESSON, as_version=4).cells if c.cell_type == "code"]
    for name, line in FIGURES.items():
        (cell,) = [c for c in cells if line in c.source]
        (png,) = [o["data"]["image/png"] for o in cell.outputs if "image/png" in o.get("data", {})]
        with open(os.path.join(HERE, f"{name}.png"), "wb") as f:
            f.write(base64.b64decode(png))


if __name__ == "__main__":
    main()
