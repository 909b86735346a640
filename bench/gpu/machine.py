"""The machine a pass ran on, for its report where no floor or attention stage says it:
`python3 -m bench.gpu.machine OUT.json` (the `alone` stage's, in the engine's Python)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import transformers

from bench.gpu.floor import machine


def main(argv: list[str] | None = None) -> int:
    out = Path((argv or sys.argv[1:])[0])
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    facts = machine(device) | {"transformers": transformers.__version__}
    out.write_text(json.dumps(facts, indent=1) + "\n")
    print(f"machine: {facts}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
