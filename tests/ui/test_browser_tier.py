"""The browser tier's own rule: without Chromium it skips, except under CI, where it fails."""

from __future__ import annotations

import pytest

from tests.ui import browser


def test_a_missing_chromium_fails_the_tier_under_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    """CI=true and no chromium binary: a failure naming the Debian packages, not a skip."""
    monkeypatch.setattr(browser, "CHROMIUM", "/nonexistent/chromium")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="apt-get install chromium chromium-driver"):
        browser.require_chromium()


def test_a_missing_driver_skips_outside_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    """No CI and no chromedriver: the tier is skipped, saying what is missing."""
    monkeypatch.setattr(browser, "CHROMEDRIVER", "/nonexistent/chromedriver")
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="/nonexistent/chromedriver missing"):
        browser.require_chromium()


def test_debian_chromium_and_its_driver_are_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """With both Debian binaries present (as CI installs them) the tier runs, even under CI."""
    monkeypatch.setenv("CI", "true")
    browser.require_chromium()  # fails this test if either is missing here
    assert (browser.CHROMIUM, browser.CHROMEDRIVER) == (
        "/usr/bin/chromium",
        "/usr/bin/chromedriver",
    )
