"""Debian's headless Chromium driven by Selenium through Debian's chromedriver (no download)."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import Select, WebDriverWait

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
WAIT = 240.0  # seconds: three pages of the real CPU engine on two shared cores
T = TypeVar("T")


def in_ci() -> bool:
    """`CI` set (as .ci/run does): a missing browser fails the tier instead of skipping it."""
    return os.environ.get("CI", "").lower() not in ("", "0", "false", "no")


def require_chromium() -> None:
    """Skip without Debian's chromium and chromium-driver; fail instead under CI."""
    missing = [path for path in (CHROMIUM, CHROMEDRIVER) if shutil.which(path) is None]
    if not missing:
        return
    reason = f"{', '.join(missing)} missing (Debian: apt-get install chromium chromium-driver)"
    if in_ci():
        pytest.fail(f"CI is set and the browser tier cannot run: {reason}")
    pytest.skip(reason)


class Browser:
    """One headless Chromium window; downloads land in `downloads`, screenshots in `shots`."""

    def __init__(self, downloads: Path, shots: Path) -> None:
        self.downloads = downloads
        self.shots = shots
        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM  # with the driver's path: Selenium Manager never runs
        for argument in (
            "--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
            "--window-size=1280,1000", "--no-first-run", "--disable-extensions",
            "--disable-background-networking", "--disable-sync", "--disable-default-apps",
        ):  # fmt: skip
            options.add_argument(argument)
        options.add_experimental_option(
            "prefs",
            {
                "download.default_directory": str(downloads),
                "download.prompt_for_download": False,
                "safebrowsing.enabled": False,
            },
        )
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        self.driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
        self.driver.execute_cdp_cmd(
            "Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(downloads)}
        )

    def close(self) -> None:
        """End the browser and its driver."""
        self.driver.quit()

    def open(self, url: str) -> None:
        """Load `url` and wait for the page's script to be in place."""
        self.driver.get(url)
        self.wait(lambda: self.script("return document.readyState") == "complete")

    def script(self, source: str, *args: Any) -> Any:
        """Run `source` in the page; its return value."""
        return self.driver.execute_script(source, *args)

    def find(self, css: str) -> WebElement:
        """The first element matching `css`."""
        return self.driver.find_element(By.CSS_SELECTOR, css)

    def find_all(self, css: str) -> list[WebElement]:
        """Every element matching `css`."""
        return list(self.driver.find_elements(By.CSS_SELECTOR, css))

    def wait(self, condition: Callable[[], T], timeout: float = WAIT) -> T:
        """`condition()` once it is truthy; fails the test with the page's state after `timeout`."""
        try:
            return WebDriverWait(self.driver, timeout, poll_frequency=0.2).until(
                lambda _: condition()
            )
        except Exception:
            self.shot("timeout")
            state = self.text("#status") if self.find_all("#status") else "(no #status)"
            pytest.fail(f"the page did not get there in {timeout:.0f} s; status: {state!r}")

    def state(self) -> str | None:
        """The page's run state: running, done (the summary is in), failed or stopped."""
        value = self.script("return document.body.dataset.state")
        return None if value is None else str(value)

    def text(self, css: str) -> str:
        """The visible text of the first element matching `css`."""
        return str(self.find(css).text)

    def shot(self, name: str) -> Path:
        """A PNG of the window, `name`.png in the screenshot folder."""
        path = self.shots / f"{name}.png"
        self.driver.save_screenshot(str(path))
        return path

    def read(self, path: Path, key: str | None, task: str = "ocr", **fields: str) -> None:
        """Type `key`, pick `path`, choose `task` and the optional fields, press Read."""
        key_box = self.find("#key")
        key_box.clear()
        if key is not None:
            key_box.send_keys(key)
        self.find("#file").send_keys(str(path))
        Select(self.find("#task")).select_by_value(task)
        for name, value in fields.items():
            box = self.find(f"#{name}")
            box.clear()
            box.send_keys(value)
        self.find("#run").click()

    def downloaded(self, name: str, timeout: float = 30) -> str:
        """The text of the downloaded file `name`, once Chromium has finished writing it."""
        path = self.downloads / name
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            partial = list(self.downloads.glob("*.crdownload"))
            if path.exists() and not partial:
                return path.read_text(encoding="utf-8")
            time.sleep(0.1)
        pytest.fail(f"{name} was not downloaded in {timeout:.0f} s: {os.listdir(self.downloads)}")

    def errors(self) -> list[str]:
        """The page's console errors so far (CSP violations show here)."""
        entries = self.driver.get_log("browser")
        return [e["message"] for e in entries if e["level"] == "SEVERE"]


def browser_at(tmp_path: Path) -> Iterator[Browser]:
    """A Browser whose downloads and screenshots go under `tmp_path` (the test's output)."""
    require_chromium()
    downloads = tmp_path / "downloads"
    shots = tmp_path / "screenshots"
    downloads.mkdir()
    shots.mkdir()
    browser = Browser(downloads, shots)
    try:
        yield browser
    finally:
        browser.close()
