"""The /ui tier: the page's route in-process, and the page itself in headless Chromium."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.ui.browser import Browser, browser_at


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Browser]:
    """Headless Chromium; its downloads and screenshots go under the test's tmp_path."""
    yield from browser_at(tmp_path)
