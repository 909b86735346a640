"""PaddleOCR-VL serving gateway: an OpenAI-compatible relay in front of vLLM."""

from __future__ import annotations

__all__ = ["__version__"]

__version__ = "0.1.0"
