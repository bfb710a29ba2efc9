"""The documentation site in a real browser (headless Chromium via selenium, the site served over HTTP as `mkdocs
serve` would): every formula is rendered by the vendored KaTeX, so no page shows raw TeX; notebook pages keep the
inline code of their headings in the table of contents; player pages link back to the site.

TORCHTRACE_SCREENSHOTS=folder also saves a screenshot of every page checked there, to look at.
"""
import functools
import http.server
import os
import re
import threading
from pathlib import Path

import pytest
from docs_site import needs_docs_extra
from headless import chromium

pytestmark = needs_docs_extra

# The home page (the README) and every notebook's page (forward mode, 00a, 01a and 07 showed raw TeX before).
NOTEBOOKS = Path(__file__).resolve().parents[1] / "examples" / "notebooks"
PAGES = ["index.html"] + [f"notebooks/{notebook.stem}/" for notebook in sorted(NOTEBOOKS.glob("*.ipynb"))]
RAW_TEX = re.compile(r"\$[^$\s][^$]*\$|\\[(\[]|\\(?:mathbb|frac|partial|nabla|langle|top|cdot|sum|sqrt|tanh|quad)\b")

# The text a reader sees, outside code (where `$x` and backslashes are code: pre, code and notebooks' code cells) and
# outside KaTeX's own output.
VISIBLE_TEXT = """
const skip = "pre, code, script, style, .katex, .md-search, .md-sidebar, .jp-CodeCell";
const walker = document.createTreeWalker(document.querySelector("article") || document.body, NodeFilter.SHOW_TEXT);
const parts = [];
for (let node = walker.nextNode(); node; node = walker.nextNode()) {
  if (!node.parentElement.closest(skip)) parts.push(node.textContent);
}
return parts.join(" ");
"""


@pytest.fixture(scope="module")
def served(docs_site):
    """The built site at http://127.0.0.1:PORT/ (fonts and scripts load as from any server)."""
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(docs_site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    thread.join()


@pytest.fixture(scope="module")
def browser():
    with chromium(window="1280,900") as driver:
        yield driver


def open_page(browser, url: str) -> None:
    """Load the page and wait until the math script ran (KaTeX's first formula is on the page)."""
    from selenium.webdriver.common.by import By

    browser.get(url)
    first = browser.find_element(By.CSS_SELECTOR, ".katex")
    folder = os.environ.get("TORCHTRACE_SCREENSHOTS")
    if folder:
        browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", first)
        browser.save_screenshot(str(Path(folder) / (url.rstrip("/").rsplit("/", 1)[-1] + ".png")))


def severe_console_errors(browser) -> list:
    return [entry["message"] for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]


@pytest.mark.parametrize("page", PAGES)
def test_every_formula_is_rendered(browser, served, page):
    from selenium.webdriver.common.by import By

    open_page(browser, served + page)
    formulas = browser.find_elements(By.CSS_SELECTOR, ".katex")
    assert formulas, f"{page}: no formula rendered"
    errors = [e.get_attribute("title") or e.text for e in browser.find_elements(By.CSS_SELECTOR, ".katex-error")]
    assert not errors, f"{page}: KaTeX could not parse {errors[:3]}"
    visible = browser.execute_script(VISIBLE_TEXT)
    raw = sorted({match.group(0)[:60] for match in RAW_TEX.finditer(visible)})
    assert not raw, f"{page} shows raw TeX: {raw[:5]}"
    assert not severe_console_errors(browser), page  # e.g. a font or script that failed to load
    fonts = browser.execute_script("return [...document.fonts].filter(f => f.family.includes('KaTeX') && "
                                   "f.status === 'loaded').length")
    assert fonts > 0, f"{page}: KaTeX's fonts did not load"


def test_a_notebook_table_of_contents_keeps_inline_code_and_reaches_its_headings(browser, served):
    from selenium.webdriver.common.by import By

    open_page(browser, served + "notebooks/00a_build_the_engine/")
    links = browser.find_elements(By.CSS_SELECTOR, ".md-sidebar--secondary a.md-nav__link")
    titles = {link.get_attribute("textContent").strip(): link.get_attribute("href") for link in links}
    title = "1. A Value with _backward closures"
    assert title in titles, sorted(titles)
    for href in titles.values():  # every entry leads to a heading of the page
        anchor = href.split("#", 1)[1]
        assert browser.find_elements(By.ID, anchor), anchor


@pytest.mark.parametrize("player", ["micrograd", "mlp"])
def test_player_pages_link_back_to_the_site(browser, served, player):
    from selenium.webdriver.common.by import By

    browser.get(f"{served}player/{player}.html")
    browser.find_element(By.CSS_SELECTOR, "#torchtrace-player .tt-player")
    back = browser.find_element(By.CSS_SELECTOR, ".torchtrace-docs-link a[href='../index.html']")
    back.click()
    assert browser.find_element(By.CSS_SELECTOR, ".md-content")  # the site's home page
    assert browser.current_url.rstrip("/").endswith(("index.html", served.rstrip("/")[-5:]))
