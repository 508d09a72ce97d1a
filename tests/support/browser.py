"""A real browser for page tests: Debian's headless Chromium driven by Selenium through the
chromedriver apt installed (scripts/setup), so Selenium downloads nothing."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service

# without the networking flags Chromium keeps trying Google's hosts, which this machine refuses
FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--window-size=1400,1500")


@pytest.fixture
def make_browser(tmp_path: Path) -> Iterator[Callable[[], webdriver.Chrome]]:
    """Factory: a headless Chromium with its own empty profile; quit at the end of the test."""
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or driver is None:
        pytest.fail("Chromium and ChromeDriver are missing: run scripts/setup (apt-get install chromium chromium-driver)")
    browsers: list[webdriver.Chrome] = []

    def make() -> webdriver.Chrome:
        options = webdriver.ChromeOptions()
        options.binary_location = chromium
        for flag in (*FLAGS, f"--user-data-dir={tmp_path / f'chromium-{len(browsers)}'}"):
            options.add_argument(flag)
        browser = webdriver.Chrome(service=Service(driver), options=options)
        browsers.append(browser)
        return browser

    yield make
    for browser in browsers:
        browser.quit()
