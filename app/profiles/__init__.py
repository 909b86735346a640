"""vLLM profiles per GPU class: the memory model, detection and checks (`ocrvl profile ...`).

shapes      model dimensions from a config.json
gpus        the GPU catalogue (one card class per profile)
memory      the memory model: budget, KV cache, concurrent pages; derives profile numbers
layout      the layout service's share of the GPU it shares with vLLM
engines     N engines on one GPU under MPS: each one's share, fixed KV cache, what is left
images      which vLLM image and version runs each profile (compose/gpu-profiles.yml)
flagsets    `vllm serve` flag sets: extracted from vLLM's parser, stored, checked offline
parsers     the installed vLLM's own `vllm serve` parser, `--config` handling included
checks      `ocrvl profile check`: flags, dtype, attention backends, memory
detection   `ocrvl profile detect`: nvidia-smi to profile path
reports     text and YAML renderings of a memory plan
headers     the header a profile opens with: its GPU, vLLM, how to run it, its numbers' source
commands    the `ocrvl profile` command group
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
"""The project checkout: vllm_configs/ and compose/ live here."""
PROFILES_DIR = Path("vllm_configs")
COMPOSE_FILE = Path("compose") / "gpu-profiles.yml"
