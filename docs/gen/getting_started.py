"""Docs site: the getting-started page is the README, with its links made relative to the docs folder."""
import pathlib

import mkdocs_gen_files

ROOT = pathlib.Path(__file__).resolve().parents[2]

readme = (ROOT / "README.md").read_text(encoding="utf-8")
with mkdocs_gen_files.open("index.md", "w") as page:
    page.write(readme.replace("](docs/", "]("))
mkdocs_gen_files.set_edit_path("index.md", "../README.md")
