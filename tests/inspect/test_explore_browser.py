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
    """Press → once per step; at each step compare what the panel shows with torch's numbers."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    checked = 0
    for i, step in enumerate(ex.steps):
        if i:
            player.send_keys(Keys.ARROW_RIGHT)
        panel = browser.find_element(By.CSS_SELECTOR, ".tt-panel")
        assert panel.find_element(By.TAG_NAME, "h3").text.startswith(f"step {i + 1}: {step.name}")
        assert browser.find_element(By.CSS_SELECTOR, ".tt-count").text == f"step {i + 1} / {len(ex.steps)}"
        if step.kind == "accumulate":
            assert_shows(panel.find_element(By.CSS_SELECTOR, ".tt-after").text, expected_after[step.name], step.name)
            checked += 1
        elif step.name in expected_upstream:
            assert_shows(panel.find_element(By.CSS_SELECTOR, ".tt-up").text, expected_upstream[step.name], step.name)
            checked += 1
        current = browser.find_elements(By.CSS_SELECTOR, ".tt-node.tt-current")
        assert len(current) == 1
    return checked


def test_micrograd_page_steps_through_torch_autograds_numbers(browser, tmp_path):
    a, b, c, f = (tt.tracer(v, requires_grad=True) for v in (2.0, -3.0, 10.0, -2.0))
    with tt.recording():
        e = a * b
        d = e + c
        L = d * f
    path = tmp_path / "micrograd.html"
    ex, took = explored_and_saved(L, path, dict(a=a, b=b, c=c, f=f, e=e, d=d, L=L))
    ta, tb, tc, tf = (torch.tensor(v, requires_grad=True) for v in (2.0, -3.0, 10.0, -2.0))
    te = ta * tb
    td = te + tc
    tL = td * tf
    for t in (te, td, tL):
        t.retain_grad()
    tL.backward()
    player, load = open_page(browser, path)
    report("micrograd's L = (a*b + c) * f", ex, path, took, load)
    checked = step_through(browser, player, ex, dict(a=ta.grad, b=tb.grad, c=tc.grad, f=tf.grad),
                           {"MulBackward → e": te.grad, "AddBackward → d": td.grad, "MulBackward → L": tL.grad})
    assert checked == 7
    from selenium.webdriver.common.by import By

    texts = [t.text for t in browser.find_elements(By.CSS_SELECTOR, ".tt-node text")]
    for label in ("data -6", "grad -2", "data 4", "data -8", "grad 6", "grad -4"):
        assert label in texts  # micrograd's picture: every value and gradient, once all steps ran
    node = browser.find_element(By.CSS_SELECTOR, '.tt-node[data-id="n0"]')  # click the output: its step
    node.click()
    assert browser.find_element(By.CSS_SELECTOR, ".tt-count").text == "step 1 / 7"
    checks = browser.find_element(By.CSS_SELECTOR, ".tt-checks")
    assert not checks.is_displayed()
    browser.find_element(By.CSS_SELECTOR, ".tt-check-button").click()
    assert checks.text.count("agree") == 2 and "finite differences -2" in checks.text
    assert not console_errors(browser)
    if os.environ.get("TORCHTRACE_DOCS"):
        player.send_keys(*["\ue014"] * 4)  # → four times: the step that sends -2 x -3 = 6 to a
        browser.find_element(By.CSS_SELECTOR, ".tt-check-button").click()
        browser.set_window_size(1100, 900)
        player.screenshot(str(DOCS / "explore_player.png"))


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
    player.send_keys(Keys.END)
    last = ex.steps[-1]
    assert browser.find_element(By.CSS_SELECTOR, ".tt-panel h3").text.startswith(f"step {len(ex.steps)}: {last.name}")
    groups[0].click()  # expand one module
    assert len(browser.find_elements(By.CSS_SELECTOR, ".tt-node.tt-group")) == 75
    started = time.perf_counter()
    for _ in range(30):
        player.send_keys(Keys.ARROW_LEFT)
    per_step = (time.perf_counter() - started) / 30
    assert browser.find_element(By.CSS_SELECTOR, ".tt-count").text == f"step {len(ex.steps) - 30} / {len(ex.steps)}"
    assert not console_errors(browser)
    report("75 ported Linear+Tanh blocks", ex, path, took, load)
    print(f"{per_step * 1000:.0f} ms per ← key, selenium's round trip included")


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
