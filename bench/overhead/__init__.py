"""What latency and CPU does the gateway add over calling the engine directly? (bench.overhead)"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CLIENT_KEY = "sk-bench-client"
BACKEND_KEY = "sk-bench-backend"
MODEL = "PaddleOCR-VL-1.5-0.9B"  # what PaddleOCR's client sends; docker-compose serves this name
REWRITTEN = "paddleocr-vl-served"  # --rewrite: a served name the gateway must rewrite the body to
ROUTE = "/v1/chat/completions"
TARGETS = ("direct", "gateway")
PROCESSES = ("backend", "gateway", "load_generator", "others")
TARGET_P50, TARGET_P99 = 0.001, 0.003  # the budget for added latency
