"""The players the project makes, in headless Chromium: every value shown (the doctor's, the diff's and the docs'
players say no "value gone"), every box's text inside its box and no edge label over a box on a 1,000-node model,
and the side-by-side diff page inside its window."""
import importlib.util
import sys
import types
from pathlib import Path

import pytest
import test_explore_browser as shared
import torch
import torch.nn.functional as F
from helpers import keep_values_budget

import torchtrace as tt

browser = shared.browser  # the same headless Chromium fixture
console_errors, open_page, residual_model = shared.console_errors, shared.open_page, shared.residual_model
ROOT = Path(__file__).resolve().parents[2]

VALUES_MISSING = """
return [...document.querySelectorAll(".tt-node .tt-data")].map((t) => t.textContent)
  .filter((text) => text.includes("(value gone)") || text.includes("(changed in place)"));
"""

TEXT_OUTSIDE_BOXES = """
const outside = [];
for (const node of document.querySelectorAll(".tt-node")) {
  const width = +node.querySelector("rect").getAttribute("width");
  for (const text of node.querySelectorAll("text:not(.tt-badge text)")) {
    if (!text.textContent) continue;
    const box = text.getBBox();
    if (box.x < 0 || box.x + box.width > width - 2) outside.push(text.textContent);
  }
}
return outside;
"""

LABELS_OVER_BOXES = """
const boxes = [...document.querySelectorAll(".tt-node")].map((g) => {
  const m = /translate\\(([-\\d.e]+),([-\\d.e]+)\\)/.exec(g.getAttribute("transform"));
  const r = g.querySelector("rect");
  return [+m[1], +m[2], +r.getAttribute("width"), +r.getAttribute("height")];
});
let labels = 0;
const over = [];
for (const text of document.querySelectorAll(".tt-edge text")) {
  if (!text.textContent) continue;
  labels++;
  const b = text.getBBox();
  if (boxes.some(([x, y, w, h]) => b.x < x + w && b.x + b.width > x && b.y < y + h && b.y + b.height > y)) {
    over.push(text.textContent);
  }
}
return [labels, over];
"""


def expand_all_and_go_to_the_end(driver, player):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    expand = driver.find_elements(By.CSS_SELECTOR, '[data-act="expand"]')
    if expand and expand[0].is_displayed():
        expand[0].click()
    player.send_keys(Keys.END)  # every edge has carried its gradient: every label has its text


def small_model():
    torch.manual_seed(0)
    return tt.port(torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Tanh(), torch.nn.Linear(6, 3))), \
        tt.randn(8, 4), torch.arange(8) % 3


class WrongTanh(tt.Function):
    """y = tanh x -> dy/dx = 1 - y (a student's slip: the derivative is 1 - y^2)"""

    @staticmethod
    def forward(ctx, x):
        y = x.tanh()
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return g * (1 - y)


def test_the_doctors_player_shows_every_value(browser, tmp_path):
    model, x, y = small_model()
    with keep_values_budget(0):  # the doctor keeps its values whatever the graph's budget
        d = tt.diagnose(lambda: F.cross_entropy(model(x), y))
        path = d.explore().save(tmp_path / "diagnosis.html")
    player, _ = open_page(browser, path)
    expand_all_and_go_to_the_end(browser, player)
    assert browser.execute_script(VALUES_MISSING) == []
    assert not console_errors(browser)


@pytest.mark.parametrize("window", ["1280,800", "1024,700"])
def test_the_diff_page_shows_every_value_and_fits_its_window(browser, tmp_path, window):
    from selenium.webdriver.common.by import By

    model, x, y = small_model()
    with keep_values_budget(0):
        report = tt.diff(lambda: F.cross_entropy(model[2](WrongTanh.apply(model[0](x))), y),
                         lambda: F.cross_entropy(model(x), y), titles=("student", "reference"))
        path = report.explore().save(tmp_path / "diff.html")
    width, height = (int(v) for v in window.split(","))
    browser.set_window_size(width, height)
    try:
        browser.get(Path(path).as_uri())
        browser.find_element(By.CSS_SELECTOR, ".tt-panel h3")
        page = browser.execute_script(
            "const d = document.documentElement; return [d.scrollWidth, d.scrollHeight, innerWidth, innerHeight]")
        assert page[0] <= page[2] and page[1] <= page[3], f"the page is {page[:2]}, its window {page[2:]}"
        drawn = browser.execute_script("""
            return [...document.querySelectorAll(".tt-graph")].map((g) => {
              const view = g.getBoundingClientRect(), graph = g.querySelector(".tt-zoom").getBoundingClientRect();
              return [graph.left - view.left, view.right - graph.right, graph.top - view.top,
                      view.bottom - graph.bottom, view.height];
            });""")
        assert len(drawn) == 2
        for margins in drawn:  # each graph whole inside its view, the view a usable height
            assert min(margins[:4]) >= -1 and margins[4] >= 140, margins
        browser.save_screenshot(str(tmp_path / "diff.png"))
        assert browser.execute_script(VALUES_MISSING) == []
        assert not console_errors(browser)
    finally:
        browser.set_window_size(1280, 800)


def built_docs_players(folder: Path) -> dict:
    """docs/gen/players.py run as the docs build runs it, its pages written into `folder`."""
    fake = types.ModuleType("mkdocs_gen_files")
    fake.open = lambda name, mode="r": open(folder / Path(name).name, mode, encoding="utf-8")
    spec = importlib.util.spec_from_file_location("docs_players", ROOT / "docs" / "gen" / "players.py")
    module = importlib.util.module_from_spec(spec)
    saved = sys.modules.get("mkdocs_gen_files")
    sys.modules["mkdocs_gen_files"] = fake
    try:
        spec.loader.exec_module(module)
    finally:
        if saved is None:
            del sys.modules["mkdocs_gen_files"]
        else:
            sys.modules["mkdocs_gen_files"] = saved
    return {path.stem: path for path in folder.glob("*.html")}


def test_the_docs_players_show_every_value(browser, tmp_path):
    pages = built_docs_players(tmp_path)
    assert set(pages) == {"micrograd", "mlp", "residual"}
    for name, path in pages.items():
        player, _ = open_page(browser, path)
        expand_all_and_go_to_the_end(browser, player)
        assert browser.execute_script(VALUES_MISSING) == [], name
        assert not console_errors(browser)


def test_a_1000_node_model_keeps_text_inside_boxes_and_labels_off_them(browser, tmp_path):
    model = residual_model(91)
    ex = tt.explore(model(torch.randn(5, 4)).pow(2).mean())
    assert len(ex.nodes) >= 1000 and all(n.value for n in ex.nodes) and ex.notice == ""
    path = ex.save(tmp_path / "thousand.html")
    player, _ = open_page(browser, path)
    expand_all_and_go_to_the_end(browser, player)
    assert browser.execute_script("return document.querySelectorAll('.tt-node').length") == len(ex.nodes)
    assert browser.execute_script(TEXT_OUTSIDE_BOXES) == []
    labels, over = browser.execute_script(LABELS_OVER_BOXES)
    assert labels > 1000 and over == [], over[:5]
    assert browser.execute_script(VALUES_MISSING) == []
    assert not console_errors(browser)


def test_a_graph_beyond_the_budget_says_how_many_values_are_gone(browser, tmp_path):
    from selenium.webdriver.common.by import By

    with keep_values_budget(0):
        a, b, c, f = (tt.tracer(v, requires_grad=True) for v in (2.0, -3.0, 10.0, -2.0))
        ex = tt.explore((a * b + c) * f)
    player, _ = open_page(browser, ex.save(tmp_path / "gone.html"))
    notice = browser.find_element(By.CSS_SELECTOR, ".tt-notice")
    assert notice.is_displayed() and notice.text.startswith("1 of 7 values were not kept")
    assert "tt.explore(fn, *inputs)" in notice.text
    assert browser.execute_script(VALUES_MISSING) == ["() (value gone)"]
