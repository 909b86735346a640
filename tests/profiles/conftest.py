"""Fixtures of the profile tests: the installed vLLM's `vllm serve` parser, built once."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path

import pytest

from app.profiles import PROFILES_DIR, ROOT
from app.profiles.checks import Checker
from app.profiles.images import load_targets
from app.profiles.parsers import ServeParser
from app.profiles.shapes import load_shape

PROFILE_FILES = sorted((ROOT / PROFILES_DIR).glob("*.yaml"))


@pytest.fixture(scope="session")
def serve_parser() -> ServeParser:
    """vLLM's own parser (about 8 s to import and build)."""
    # Importing vLLM imports torch, whose own modules raise DeprecationWarnings (torch.jit);
    # they are not this project's to fix and pytest turns warnings into errors.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return ServeParser()


@pytest.fixture(scope="session")
def checker(serve_parser: ServeParser) -> Checker:
    """A Checker for PaddleOCR-VL 1.5 that reuses the session's parser."""
    return Checker(load_shape(), load_targets(), parser_factory=lambda: serve_parser)


@pytest.fixture
def profile_file(tmp_path: Path) -> Callable[[str, str], Path]:
    """Write a profile named like a catalogue card (so its card and vLLM apply) into tmp_path."""

    def write(name: str, text: str) -> Path:
        path = tmp_path / f"{name}.yaml"
        path.write_text(text)
        return path

    return write
