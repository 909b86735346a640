"""The GPU lab (README.md). WORK: what a pass keeps on the host between its calls."""

import os
from pathlib import Path

WORK = Path(os.environ.get("GPU_BENCH_DIR", "/tmp/gpu-bench"))  # noqa: S108 (the host's /tmp)
