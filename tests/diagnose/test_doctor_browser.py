"""The doctor in the player, in a real browser (headless Chromium, as tests/inspect/test_explore_browser.py): a
diagnosis shows its finding as a badge and a message on the step of the op at fault; a diff opens both passes
side by side at the first divergent pair, the student's rule beside the reference's."""
import importlib.util
from pathlib import Path

import torch
import torch.nn.functional as F
from doctor_models import WrongTanh

import torchtrace as tt

_spec = importlib.util.spec_from_file_location(
    "explore_browser", Path(__file__).resolve().parents[1] / "inspect" / "test_explore_browser.py")
_explore_browser = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_explore_browser)
browser = _explore_browser.browser  # the same headless Chromium fixture
console_errors = _explore_browser.console_errors


def small_model():
    torch.manual_seed(0)
    return tt.port(torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Tanh(), torch.nn.Linear(6, 3))), \
        tt.randn(8, 4), torch.arange(8) % 3


def test_a_diagnosis_is_a_badge_and_a_message_on_the_step_at_fault(browser, tmp_path):
    from selenium.webdriver.common.by import By

    model, x, y = small_model()
    d = tt.diagnose(lambda: -(model(x) * 1000).softmax(-1).gather(1, y[:, None]).log().mean())
    assert d.first_nonfinite.rule == "Log"
    path = d.explore().save(tmp_path / "diagnosis.html")
    browser.get(Path(path).as_uri())
    button = browser.find_element(By.CSS_SELECTOR, '[data-act="diagnosis"]')
    assert button.text == "diagnosis (1)"
    assert len(browser.find_elements(By.CSS_SELECTOR, ".tt-badge.tt-error")) == 1
    steps = d.explore().steps
    log_step = next(i for i, s in enumerate(steps) if s.name == "LogBackward")
    player = browser.find_element(By.CSS_SELECTOR, "#torchtrace-player .tt-player")
    for _ in range(log_step):
        player.send_keys("\ue014")  # the right arrow
    panel = browser.find_element(By.CSS_SELECTOR, ".tt-panel")
    assert panel.find_element(By.TAG_NAME, "h3").text.startswith(f"step {log_step + 1}: LogBackward")
    finding = panel.find_element(By.CSS_SELECTOR, ".tt-finding.tt-error").text
    assert "nonfinite" in finding and "log of 0 is -inf" in finding
    assert not console_errors(browser)


def test_a_diff_opens_side_by_side_at_the_first_divergence(browser, tmp_path):
    from selenium.webdriver.common.by import By

    model, x, y = small_model()

    def student():
        return F.cross_entropy(model[2](WrongTanh.apply(model[0](x))), y)

    report = tt.diff(student, lambda: F.cross_entropy(model(x), y), titles=("student", "reference"))
    both = report.explore()
    path = both.save(tmp_path / "diff.html")
    browser.get(Path(path).as_uri())
    assert [h.text for h in browser.find_elements(By.CSS_SELECTOR, ".tt-pair-cell h2")] == ["student", "reference"]
    bar = browser.find_element(By.CSS_SELECTOR, ".tt-pair-bar")
    assert f"pair {both.first + 1} / {len(both.pairs)}" in bar.text and "highlighted pair" in bar.text
    titles = [p.find_element(By.TAG_NAME, "h3").text for p in browser.find_elements(By.CSS_SELECTOR, ".tt-panel")]
    assert titles[0].split(": ")[1].startswith("WrongTanhBackward")
    assert titles[1].split(": ")[1].startswith("TanhBackward")
    assert "diverges" in browser.find_elements(By.CSS_SELECTOR, ".tt-panel")[0].text
    assert not console_errors(browser)
