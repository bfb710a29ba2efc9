"""The documentation site, built once per test session with `mkdocs build --strict` (any warning fails the build)."""
import importlib.util
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
MISSING = [name for name in ("mkdocs", "material", "mkdocstrings_handlers.python", "mkdocs_jupyter", "mkdocs_gen_files",
                             "mkdocs_literate_nav") if importlib.util.find_spec(name.split(".")[0]) is None]
needs_docs_extra = pytest.mark.skipif(bool(MISSING), reason=f"the docs extra is not installed (missing {MISSING}): "
                                                            "pip install -c constraints.txt -e '.[docs]'")


def build(out: pathlib.Path) -> pathlib.Path:
    """`mkdocs build --strict` of this checkout into `out`; fails the test with mkdocs' output on any warning."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "DISABLE_MKDOCS_2_WARNING": "true", "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out
