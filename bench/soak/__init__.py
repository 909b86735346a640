"""Soak and fault drill through the whole stack (`python -m bench.soak`, bench/soak/__main__.py)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SERVED = "paddleocr-vl-tiny"
CLIENT_KEY = "sk-soak-client"
BACKEND_KEY = "sk-soak-backend"
REDIS_PASSWORD = "soak-redis-pass"  # noqa: S105 (a loopback Redis of the benchmark's own)
MAX_PIXELS = 200_704  # the tiny checkpoint's processor maximum: quick CPU pages (as tests/real)
MIN_PIXELS = 112_896
