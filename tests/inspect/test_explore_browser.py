"""tt.explore's page in a real browser: headless Chromium (Debian's chromium + chromium-driver, via selenium) presses
→ through every step and reads the numbers the page shows, which must be torch autograd's; no console errors.

TORCHTRACE_DOCS=1 also writes the README's screenshot, docs/explore_player.png.
"""
import os
import re
import time
from pathlib import Path

import pytest
import torch
from headless import chromium

import torchtrace as tt

DOCS = Path(__file__).resolve().parents[2] / "docs"


@pytest.fixture(scope="module")
def browser():
    with chromium() as driver:
        yield driver


def numbers(text: str) -> torch.Tensor:
    """The numbers a page shows for a tensor: all of them, or (shape): mean, min, max for a large one."""
    found = re.findall(r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?", text.split(":", 1)[1] if text.startswith("(") else text)
    return torch.tensor([float(v) for v in found], dtype=torch.float64)


def shown(t: torch.Tensor) -> torch.Tensor:
    """What the page should show for torch's tensor t, as numbers() reads it."""
    t = t.detach().double()
    return t.flatten() if t.numel() <= 16 else torch.stack([t.mean(), t.min(), t.max()])


def assert_shows(text: str, expected: torch.Tensor, what: str) -> None:
    torch.testing.assert_close(numbers(text), shown(expected), rtol=2e-3, atol=1e-4, msg=f"{what}: page shows {text}")


def open_page(browser, path):
    from selenium.webdriver.common.by import By

    started = time.perf_counter()
    browser.get(Path(path).as_uri())
    player = browser.find_element(By.CSS_SELECTOR, "#torchtrace-player .tt-player")
    browser.find_element(By.CSS_SELECTOR, ".tt-panel h3")  # the first step is drawn
    return player, time.perf_counter() - started


def text_now(browser, selector: str) -> str:
    """The text of the element `selector` finds, found again if the page redrew it meanwhile (a click or a re-layout
    replaces the panel's elements)."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    for _ in range(50):
        try:
            return browser.find_element(By.CSS_SELECTOR, selector).text
        except StaleElementReferenceException:
            time.sleep(0.1)
    raise AssertionError(f"{selector} kept being redrawn")


def explored_and_saved(output, path, params=None):
    """tt.explore(output, params) and ex.save(path), with the seconds both took."""
    started = time.perf_counter()
    ex = tt.explore(output, params)
    ex.save(path)
    return ex, time.perf_counter() - started


def report(what, ex, path, took, load):
    """The numbers the README and the lead quote (printed with pytest -s; never asserted)."""
    print(f"\n{what}: {len(ex.nodes)} nodes, {len(ex.steps)} steps: explore + save {took * 1000:.0f} ms, "
          f"{os.path.getsize(path) / 1024:.0f} KiB, page load {load * 1000:.0f} ms")


def console_errors(browser):
    return [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]


def step_through(browser, player, ex, expected_after, expected_upstream):
    """Press → once per step; at each step compare what the panel shows with torch's numbers (read once the page
    shows that step: the panel is drawn anew on each keypress, so an element found before may be replaced)."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    checked = 0
    for i, step in enumerate(ex.steps):
        if i:
            player.send_keys(Keys.ARROW_RIGHT)
        count = f"step {i + 1} / {len(ex.steps)}"
        WebDriverWait(browser, 10, ignored_exceptions=(StaleElementReferenceException,)).until(
            lambda b: b.find_element(By.CSS_SELECTOR, ".tt-count").text == count)
        for attempt in range(5):
            try:
                checked += check_step(browser, i, step, expected_after, expected_upstream)
                break
            except StaleElementReferenceException:
                if attempt == 4:
                    raise
    return checked


def check_step(browser, i, step, expected_after, expected_upstream) -> int:
    """The panel of step i against torch's numbers: 1 where a number was compared, else 0."""
    from selenium.webdriver.common.by import By

    panel = browser.find_element(By.CSS_SELECTOR, ".tt-panel")
    assert panel.find_element(By.TAG_NAME, "h3").text.startswith(f"step {i + 1}: {step.name}")
    assert len(browser.find_elements(By.CSS_SELECTOR, ".tt-node.tt-current")) == 1
    if step.kind == "accumulate":
        assert_shows(panel.find_element(By.CSS_SELECTOR, ".tt-after").text, expected_after[step.name], step.name)
        return 1
    if step.name in expected_upstream:
        assert_shows(panel.find_element(By.CSS_SELECTOR, ".tt-up").text, expected_upstream[step.name], step.name)
        return 1
    return 0


def micrograd_graph():
    """micrograd's example built the ordinary way (no recording, no wrapper), and torch autograd's twin."""
    a, b, c, f = (tt.tracer(v, requires_grad=True) for v in (2.0, -3.0, 10.0, -2.0))
    e = a * b
    d = e + c
    L = d * f
    ta, tb, tc, tf = (torch.tensor(v, requires_grad=True) for v in (2.0, -3.0, 10.0, -2.0))
    te = ta * tb
    td = te + tc
    tL = td * tf
    for t in (te, td, tL):
        t.retain_grad()
    tL.backward()
    return (a, b, c, d, e, f, L), dict(a=ta, b=tb, c=tc, d=td, e=te, f=tf, L=tL)


def test_micrograd_page_shows_torch_autograds_values_and_gradients(browser, tmp_path):
    from selenium.webdriver.common.by import By

    (a, b, c, d, e, f, L), torch_ = micrograd_graph()
    path = tmp_path / "micrograd.html"
    ex, took = explored_and_saved(L, path, dict(a=a, b=b, c=c, d=d, e=e, f=f, L=L))
    player, load = open_page(browser, path)
    report("micrograd's L = (a*b + c) * f", ex, path, took, load)
    checked = step_through(browser, player, ex, {k: torch_[k].grad for k in "abcf"},
                           {"MulBackward → e": torch_["e"].grad, "AddBackward → d": torch_["d"].grad,
                            "MulBackward → L": torch_["L"].grad})
    assert checked == 7
    boxes = {el.find_element(By.CSS_SELECTOR, ".tt-name").text: el for el in
             browser.find_elements(By.CSS_SELECTOR, ".tt-node")}
    for name, label in (("a", "a"), ("b", "b"), ("c", "c"), ("f", "f"), ("e", "Mul → e"), ("d", "Add → d"),
                        ("L", "Mul → L")):
        texts = [t.text for t in boxes[label].find_elements(By.TAG_NAME, "text")]
        assert_shows(texts[1].removeprefix("data "), torch_[name].detach(), f"value of {name}")
        assert_shows(texts[2].removeprefix("grad "), torch_[name].grad, f"gradient of {name}")
    node = browser.find_element(By.CSS_SELECTOR, '.tt-node[data-id="n0"]')  # click the output: its step
    node.click()
    assert browser.find_element(By.CSS_SELECTOR, ".tt-count").text == "step 1 / 7"
    assert "value: -8" in browser.find_element(By.CSS_SELECTOR, ".tt-panel").text
    assert not console_errors(browser)


def test_micrograd_check_and_the_readme_screenshot(browser, tmp_path):
    from selenium.webdriver.common.by import By

    a, b, c, f = (tt.tracer(v, requires_grad=True) for v in (2.0, -3.0, 10.0, -2.0))
    with tt.recording():  # keeps each op's inputs: every step gets a finite-difference check
        e = a * b
        d = e + c
        L = d * f
    path = tmp_path / "micrograd.html"
    explored_and_saved(L, path, dict(a=a, b=b, c=c, d=d, e=e, f=f, L=L))
    if os.environ.get("TORCHTRACE_DOCS"):
        browser.set_window_size(1100, 1250)
    player, _ = open_page(browser, path)
    checks = browser.find_element(By.CSS_SELECTOR, ".tt-checks")
    assert not checks.is_displayed()
    browser.find_element(By.CSS_SELECTOR, ".tt-check-button").click()
    shown = text_now(browser, ".tt-checks")
    assert shown.count("agree") == 2 and "finite differences -2" in shown
    if os.environ.get("TORCHTRACE_DOCS"):
        player.send_keys(*["\ue014"] * 4)  # → four times: the step that sends -2 x -3 = 6 to a (checks still open)
        assert text_now(browser, ".tt-checks").count("agree") == 2
        player.screenshot(str(DOCS / "explore_player.png"))
        browser.set_window_size(1280, 800)
    assert not console_errors(browser)


def test_keys_work_as_soon_as_the_page_loads(browser, tmp_path):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    (*_, L), _ = micrograd_graph()
    path = tmp_path / "keys.html"
    explored_and_saved(L, path)
    open_page(browser, path)
    assert browser.execute_script("return document.activeElement.classList.contains('tt-player')")
    ActionChains(browser).send_keys(Keys.ARROW_RIGHT).perform()  # to whatever has the focus: nothing was clicked
    assert browser.find_element(By.CSS_SELECTOR, ".tt-count").text == "step 2 / 7"
    browser.execute_script("document.activeElement.blur()")  # the focus on the page itself: keys still step
    ActionChains(browser).send_keys(Keys.ARROW_RIGHT, Keys.ARROW_RIGHT).perform()
    assert browser.find_element(By.CSS_SELECTOR, ".tt-count").text == "step 4 / 7"
    ActionChains(browser).send_keys(Keys.END).perform()
    assert browser.find_element(By.CSS_SELECTOR, ".tt-count").text == "step 7 / 7"
    assert not console_errors(browser)


def test_markup_in_a_note_or_a_name_is_shown_as_text_and_the_page_still_plays(browser, tmp_path):
    """A note or a parameter name holding `<!--<script>` or `</script>` (which end or stall an inline script when
    written raw) is shown as it was written; the player draws and steps."""
    from selenium.webdriver.common.by import By

    a = tt.tracer(torch.tensor([1.0, 2.0]), requires_grad=True)
    note = "html comment in a message: <!--<script> and </script>"
    path = tmp_path / "markup.html"
    tt.explore((a * a).sum(), params={"<!--<script>a": a}).annotate(0, "note", note, "warn").save(path)
    open_page(browser, path)
    assert note in text_now(browser, ".tt-panel")
    assert "<!--<script>a" in browser.find_element(By.CSS_SELECTOR, "#torchtrace-player").text
    assert browser.find_element(By.CSS_SELECTOR, ".tt-count").text == "step 1 / 3"
    assert not console_errors(browser)


def test_ported_mlp_shows_parameter_names_and_torchs_gradients(browser, tmp_path):
    from selenium.webdriver.common.by import By

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    x, target = torch.randn(6, 4), torch.tensor([0, 2, 1, 0, 1, 2])
    reference = torch.nn.functional.cross_entropy(model(x), target)
    reference.backward()
    expected = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()
    tt.port(model)
    path = tmp_path / "mlp.html"
    ex, took = explored_and_saved(torch.nn.functional.cross_entropy(model(x), target), path)
    player, load = open_page(browser, path)
    report("ported MLP 4-8-3 with cross-entropy", ex, path, took, load)
    labels = {t.text for t in browser.find_elements(By.CSS_SELECTOR, ".tt-node .tt-name")}
    assert {"0.weight", "0.bias", "2.weight", "2.bias"} <= labels
    assert step_through(browser, player, ex, expected, {}) == 4
    assert not console_errors(browser)


def deep_model(blocks: int) -> torch.nn.Module:
    torch.manual_seed(0)
    layers = [torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh()) for _ in range(blocks)]
    return tt.port(torch.nn.Sequential(*layers, torch.nn.Linear(8, 1)))


class Residual(torch.nn.Module):
    """x + inner(x)"""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.inner(x)


def residual_model(blocks: int) -> torch.nn.Module:
    """blocks x (x + Linear(ReLU(Linear(LayerNorm(x))))) between two Linear layers: 11 nodes a block."""
    torch.manual_seed(0)
    inner = [torch.nn.Sequential(torch.nn.LayerNorm(8), torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8))
             for _ in range(blocks)]
    return tt.port(torch.nn.Sequential(torch.nn.Linear(4, 8), *map(Residual, inner), torch.nn.Linear(8, 1)))


EDGES_THROUGH_BOXES = """
const boxes = [...document.querySelectorAll(".tt-node")].map((g) => {
  const m = /translate\\(([-\\d.e]+),([-\\d.e]+)\\)/.exec(g.getAttribute("transform"));
  const r = g.querySelector("rect");
  return [+m[1], +m[2], +r.getAttribute("width"), +r.getAttribute("height")];
});
let through = 0, sampled = 0;
for (const path of document.querySelectorAll(".tt-edge path")) {
  const length = path.getTotalLength();
  for (let at = 0; at <= length; at += 4) {
    const p = path.getPointAtLength(at);
    sampled++;
    if (boxes.some(([x, y, w, h]) => p.x > x + 1 && p.x < x + w - 1 && p.y > y + 1 && p.y < y + h - 1)) through++;
  }
}
return [through, sampled, boxes.length];
"""


def assert_no_edge_through_a_box(browser):
    through, sampled, boxes = browser.execute_script(EDGES_THROUGH_BOXES)
    assert sampled > boxes and through == 0, f"{through} of {sampled} points sampled on the edges lie inside a box"


def per_key_ms(browser, key, presses):
    """Milliseconds per key press as the page handles it (keydown dispatched in the page: no selenium round trip)."""
    return browser.execute_script(f"""
        const player = document.querySelector(".tt-player"), started = performance.now();
        for (let i = 0; i < {presses}; i++) {{
          player.dispatchEvent(new KeyboardEvent("keydown", {{key: "{key}", bubbles: true}}));
        }}
        return (performance.now() - started) / {presses};""")


def test_a_300_node_graph_groups_by_module_and_plays_through(browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    model = deep_model(75)
    x = torch.randn(16, 8)
    path = tmp_path / "deep.html"
    ex, took = explored_and_saved(model(x).pow(2).mean(), path)
    assert len(ex.nodes) >= 300
    player, load = open_page(browser, path)
    groups = browser.find_elements(By.CSS_SELECTOR, ".tt-node.tt-group")
    assert len(groups) == 76  # one box per top-level module: the graph starts collapsed
    names = {g.find_element(By.CSS_SELECTOR, ".tt-name").get_attribute("textContent") for g in groups}
    assert names >= {"0 · Sequential", "75 · Linear"}  # text read even where the box is outside the view
    player.send_keys(Keys.END)
    last = ex.steps[-1]
    assert browser.find_element(By.CSS_SELECTOR, ".tt-panel h3").text.startswith(f"step {len(ex.steps)}: {last.name}")
    visible = [g for g in groups if g.is_displayed()]  # inside the view (the rest is a pan or a zoom away)
    assert visible and len(visible) < len(groups)
    visible[0].click()  # expand one module
    assert len(browser.find_elements(By.CSS_SELECTOR, ".tt-node.tt-group")) == 75
    player.send_keys(*[Keys.ARROW_LEFT] * 30)
    assert browser.find_element(By.CSS_SELECTOR, ".tt-count").text == f"step {len(ex.steps) - 30} / {len(ex.steps)}"
    assert_no_edge_through_a_box(browser)
    assert not console_errors(browser)
    report("75 ported Linear+Tanh blocks", ex, path, took, load)


def test_a_287_step_residual_model_is_a_readable_graph(browser, tmp_path):
    from selenium.webdriver.common.by import By

    model = residual_model(25)
    path = tmp_path / "residual.html"
    ex, took = explored_and_saved(model(torch.randn(5, 4)).pow(2).mean(), path)
    assert 280 <= len(ex.steps) <= 300
    player, load = open_page(browser, path)
    report("25 residual blocks (LayerNorm, Linear, ReLU, Linear, +)", ex, path, took, load)
    names = [t.get_attribute("textContent") for t in browser.find_elements(By.CSS_SELECTOR, ".tt-group .tt-name")]
    assert "3 · Residual" in names and "26 · Linear" in names  # modules by name, not one row of indices
    assert_no_edge_through_a_box(browser)
    rows = {round(float(g.get_attribute("transform").split(",")[1].rstrip(")")))
            for g in browser.find_elements(By.CSS_SELECTOR, ".tt-group")}
    assert len(rows) > 1  # a long graph wraps into bands instead of one strip
    browser.find_element(By.CSS_SELECTOR, '[data-act="expand"]').click()
    assert len(browser.find_elements(By.CSS_SELECTOR, ".tt-node")) == len(ex.nodes)
    assert_no_edge_through_a_box(browser)  # every skip connection goes around the boxes it passes
    assert not console_errors(browser)


def test_a_603_node_chain_fits_zooms_and_searches(browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    x = tt.tracer(torch.randn(3), requires_grad=True)
    y = x
    for _ in range(300):
        y = torch.tanh(y) * 1.5
    out = y.sum()
    path = tmp_path / "chain.html"
    ex, took = explored_and_saved(out, path, {"x": x})
    assert len(ex.nodes) == 603 - 1  # 300 x (tanh, mul), the sum and x
    player, load = open_page(browser, path)
    report("a chain of 600 ops", ex, path, took, load)
    assert_no_edge_through_a_box(browser)
    zoom = lambda: browser.execute_script(  # noqa: E731
        "return document.querySelector('.tt-zoom').getAttribute('transform')")
    scale = lambda: float(zoom().split("scale(")[1].rstrip(")"))  # noqa: E731
    browser.find_element(By.CSS_SELECTOR, '[data-act="fit"]').click()
    fitted = scale()
    width, height = browser.execute_script(
        "const b = document.querySelector('.tt-zoom').getBBox(); return [b.width, b.height]")
    graph = browser.find_element(By.CSS_SELECTOR, ".tt-graph")
    assert fitted * width <= graph.size["width"] + 1 and fitted * height <= graph.size["height"] + 1
    browser.find_element(By.CSS_SELECTOR, '[data-act="zoomIn"]').click()
    assert scale() > fitted
    search = browser.find_element(By.CSS_SELECTOR, ".tt-search")
    search.send_keys("x")
    assert browser.find_element(By.CSS_SELECTOR, ".tt-found").text == "1 found"
    search.send_keys(Keys.ENTER)  # jumps to the leaf x: its step, centred
    assert browser.find_element(By.CSS_SELECTOR, ".tt-panel h3").text == f"step {len(ex.steps)}: x"
    assert browser.find_elements(By.CSS_SELECTOR, ".tt-node.tt-match.tt-focus")
    assert not console_errors(browser)


def test_a_1000_node_model_loads_and_steps(browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    model = residual_model(91)
    path = tmp_path / "thousand.html"
    ex, took = explored_and_saved(model(torch.randn(5, 4)).pow(2).mean(), path)
    assert len(ex.nodes) >= 1000
    player, load = open_page(browser, path)
    report("91 residual blocks", ex, path, took, load)
    assert len(browser.find_elements(By.CSS_SELECTOR, ".tt-group")) == 93
    started = time.perf_counter()
    player.send_keys(*[Keys.ARROW_RIGHT] * 20)
    round_trip = (time.perf_counter() - started) / 20
    assert browser.find_element(By.CSS_SELECTOR, ".tt-count").text == f"step 21 / {len(ex.steps)}"
    collapsed = per_key_ms(browser, "ArrowRight", 200)
    search = browser.find_element(By.CSS_SELECTOR, ".tt-search")
    search.send_keys("50.inner.1.weight", Keys.ENTER)  # opens module 50 and goes to that parameter's step
    wanted = next(s.index for s in ex.steps if s.name == "50.inner.1.weight")
    heading = browser.find_element(By.CSS_SELECTOR, ".tt-panel h3").text
    assert heading.startswith(f"step {wanted + 1}: 50.inner.1.weight")
    browser.find_element(By.CSS_SELECTOR, '[data-act="expand"]').click()
    started = time.perf_counter()
    browser.find_element(By.CSS_SELECTOR, '[data-act="fit"]').click()
    assert len(browser.find_elements(By.CSS_SELECTOR, ".tt-node")) == len(ex.nodes)
    expanded = per_key_ms(browser, "ArrowLeft", 100)
    assert not console_errors(browser)
    print(f"per → key: {round_trip * 1000:.0f} ms with selenium's round trip; in the page {collapsed:.1f} ms "
          f"(modules collapsed), {expanded:.1f} ms (all {len(ex.nodes)} nodes drawn)")


def test_two_players_step_together_and_show_the_diagnosis_layer(browser, tmp_path):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    from torchtrace.inspect.explore import side_by_side

    (*_, L), _ = micrograd_graph()
    ex_a = tt.explore(L)
    ex_b = tt.explore(lambda a, b, c, f: (a * b + c) * f, *(torch.tensor(v) for v in (2.0, -3.0, 10.0, -2.0)))
    ex_a.annotate(ex_a.steps[4], "killed", "e sends nothing back", severity="error")
    pairs = [(0, 0), (2, 2), (4, 4), (6, 6)]
    path = tmp_path / "pair.html"
    side_by_side(ex_a, ex_b, pairs, first=2, titles=("by hand", "by function")).save(path)
    browser.get(path.as_uri())
    counts = lambda: [c.text for c in browser.find_elements(By.CSS_SELECTOR, ".tt-player .tt-count")]  # noqa: E731
    assert counts() == ["step 5 / 7", "step 5 / 7"]  # the highlighted pair first
    bar = browser.find_element(By.CSS_SELECTOR, ".tt-pair-bar")
    assert "pair 3 / 4" in bar.text and "highlighted" in bar.text
    finding = browser.find_element(By.CSS_SELECTOR, ".tt-finding")
    assert "e sends nothing back" in finding.text and "killed" in finding.text
    assert len(browser.find_elements(By.CSS_SELECTOR, ".tt-badge")) == 1
    ActionChains(browser).send_keys(Keys.ARROW_RIGHT).perform()  # keys work before any click
    assert counts() == ["step 7 / 7", "step 7 / 7"]
    assert "highlighted" not in bar.text
    players = browser.find_elements(By.CSS_SELECTOR, ".tt-player")
    players[1].send_keys(Keys.HOME)
    assert counts() == ["step 1 / 7", "step 1 / 7"]
    browser.find_elements(By.CSS_SELECTOR, '.tt-player [data-act="diagnosis"]')[0].click()
    assert not browser.find_element(By.CSS_SELECTOR, ".tt-badge").is_displayed()
    assert not console_errors(browser)


def test_widget_module_renders_in_the_browser(browser, tmp_path):
    """The ES module the Jupyter widget loads, rendered by its default export with a stand-in for the widget model,
    then drawn again as when the model's data changes."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    from torchtrace.inspect.explore.page import widget_module

    x = tt.tracer([1.0, -2.0], requires_grad=True)
    ex = tt.explore((x * x).sum())
    import json

    page = tmp_path / "widget.html"
    page.write_text(f"""<!DOCTYPE html><html><body><div id="el"></div><script>
const code = {json.dumps(widget_module())};
const data = {json.dumps(json.dumps(ex.data()))};
const changed = [];
const model = {{get: () => data, on: (event, handler) => changed.push(handler)}};
import(URL.createObjectURL(new Blob([code], {{type: "text/javascript"}})))
  .then((m) => {{ m.default.render({{model, el: document.getElementById("el")}}); changed.forEach((f) => f()); }});
</script></body></html>""", encoding="utf-8")
    browser.get(page.as_uri())
    heading = browser.find_element(By.CSS_SELECTOR, "#el .tt-panel h3")
    assert heading.text.startswith("step 1: SumBackward")
    browser.find_element(By.CSS_SELECTOR, "#el .tt-player").send_keys(Keys.ARROW_RIGHT)  # drawn twice: one step
    assert browser.find_element(By.CSS_SELECTOR, "#el .tt-count").text == "step 2 / 3"
    assert not console_errors(browser)
