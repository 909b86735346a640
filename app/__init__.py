"""PaddleOCR-VL serving gateway: an OpenAI-compatible relay in front of vLLM."""

from __future__ import annotations

__all__ = ["KEYS_FILE", "__version__"]

__version__ = "0.1.0"
# The keys file `ocrvl keys create` writes by default, and the gateway reads when
# OCRVL_API_KEYS_FILE is unset (relative to where it runs: the repository for `make serve`;
# compose mounts the same folder, ./secrets, which git ignores). Here, not in app.settings, so
# that `ocrvl --help` does not load pydantic.
KEYS_FILE = "secrets/api-keys.json"
