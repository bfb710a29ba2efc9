"""Headless Chromium for the browser tests: Debian's chromium and chromium-driver, driven by selenium. Without them
the test is skipped, saying what to install."""
import contextlib
import shutil
import tempfile
from typing import Any, Iterator

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@contextlib.contextmanager
def chromium(window: str = "1280,800") -> Iterator[Any]:
    """A selenium driver of a fresh headless Chromium (its own profile, browser console logged), quit afterwards."""
    if CHROMIUM is None or DRIVER is None:
        pytest.skip("Chromium and chromedriver are not installed (Debian: apt-get install -y chromium chromium-driver)")
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install selenium)")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    profile = tempfile.mkdtemp(prefix="tt-chromium-")
    for flag in FLAGS + [f"--window-size={window}", f"--user-data-dir={profile}"]:
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    driver.implicitly_wait(5)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
