"""The documentation site builds with `mkdocs build --strict` (any warning fails), shows every notebook, every public
name and every rule, and loads nothing from the network."""
import html
import pathlib
import re

import pytest
from docs_site import ROOT, needs_docs_extra

import torchtrace as tt
from torchtrace.autograd.function import RULES
from torchtrace.ops.listing import families, supported_ops

pytestmark = needs_docs_extra


@pytest.fixture(scope="module")
def site(docs_site) -> pathlib.Path:
    return docs_site


def text(page: pathlib.Path) -> str:
    return page.read_text(encoding="utf-8")


def test_every_notebook_has_a_page_with_its_stored_outputs(site):
    notebooks = sorted((ROOT / "examples" / "notebooks").glob("*.ipynb"))
    assert notebooks
    for notebook in notebooks:
        page = site / "notebooks" / notebook.stem / "index.html"
        assert page.exists(), notebook.name
        assert "jp-OutputArea" in text(page) or "output" in text(page)
    navigation = text(site / "index.html")
    assert all(f"notebooks/{notebook.stem}/" in navigation for notebook in notebooks)


@pytest.mark.parametrize("namespace", ["torchtrace", "torchtrace.nn", "torchtrace.nn.parallel", "torchtrace.optim"])
def test_the_api_reference_has_every_public_name(site, namespace):
    module = {"torchtrace": tt, "torchtrace.nn": tt.nn, "torchtrace.nn.parallel": tt.nn.parallel,
              "torchtrace.optim": tt.optim}[namespace]
    page = text(site / "api" / namespace / "index.html")
    for name in module.__all__:
        assert f'id="{name.lower()}"' in page, f"{namespace}.{name}"


def test_docstrings_are_rendered(site):
    page = text(site / "api" / "torchtrace.optim" / "index.html")
    assert "m &lt;- beta1 * m + (1 - beta1) * g" in page  # Adam's update rule, from its docstring
    parallel = text(site / "api" / "torchtrace.nn.parallel" / "index.html")
    assert "so that each backward averages its parameters" in parallel


def test_the_ops_page_lists_every_supported_callable_with_its_math_line(site):
    page = text(site / "ops" / "index.html")
    rows = re.findall(r"<tr><td><code>(.*?)</code></td><td>(.*?)</td><td><code>(.*?)</code></td></tr>", page)
    listed = sorted(name for names in families().values() for name in names)
    assert sorted(html.unescape(name) for name, _, _ in rows) == listed  # what `python -m torchtrace ops` prints
    assert f"{len(supported_ops())} torch callables have a hand-written gradient rule" in page
    assert {rule for _, rule, _ in rows} == {RULES[func].__name__ for func in supported_ops()}
    assert all(" -&gt; " in math or " -> " in math for _, _, math in rows)


def test_pages_load_nothing_from_the_network(site):
    pages = list(site.rglob("*.html"))
    assert len(pages) > 15
    external = re.compile(r"""<(?:script|link|img|iframe|source)\b[^>]*\b(?:src|href)=["'](?:https?:)?//|"""
                          r"""url\(["']?(?:https?:)?//|@import\s+["']?(?:https?:)?//""")
    for page in pages:
        found = external.search(text(page))
        assert found is None, f"{page.relative_to(site)} loads {text(page)[found.start():found.start() + 120]}"
    stylesheets = "".join(text(css) for css in site.rglob("*.css"))
    assert "fonts.googleapis" not in stylesheets and not re.search(r"url\([\"']?https?://", stylesheets)


def test_the_player_pages_step_through_what_the_code_computes_now(site):
    for name, expected in {"micrograd": ('"a"', "-3"), "mlp": ("0.weight", "CrossEntropy")}.items():
        page = text(site / "player" / f"{name}.html")
        assert "<script" in page and all(part in page for part in expected), name
    listing = text(site / "player" / "index.html")
    assert "micrograd.html" in listing and "mlp.html" in listing


def test_notebook_outputs_keep_their_lines(site):
    """mkdocs-jupyter wraps outputs anywhere (word-break: break-all), which cut generated code mid-word: the site's
    own stylesheet, linked on every notebook page, keeps each printed line whole (a long one scrolls)."""
    page = text(site / "notebooks" / "07_backward_as_code" / "index.html")
    assert "assets/notebooks.css" in page and "d_fc2_weight" in page
    css = text(site / "assets" / "notebooks.css")
    rule = re.search(r"\.jp-OutputArea-output pre \{(.*?)\}", css, re.S).group(1)
    assert "white-space: pre;" in rule and "word-break: normal;" in rule and "overflow-x: auto;" in rule
