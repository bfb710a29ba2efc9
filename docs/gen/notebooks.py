"""Docs site: every notebook under examples/notebooks (found at build time), shown with its stored outputs."""
import pathlib

import mkdocs_gen_files

NOTEBOOKS = pathlib.Path(__file__).resolve().parents[2] / "examples" / "notebooks"

for notebook in sorted(NOTEBOOKS.glob("*.ipynb")):
    with mkdocs_gen_files.open(f"notebooks/{notebook.name}", "w") as page:
        page.write(notebook.read_text(encoding="utf-8"))
