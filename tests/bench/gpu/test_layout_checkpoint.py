"""bench.gpu.layout_checkpoint: the full-size random PP-DocLayoutV3 loads back through
transformers' own classes and runs one page."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import ENGINE_ONLY

pytestmark = pytest.mark.engine
pytest.importorskip("transformers", reason=ENGINE_ONLY)

from bench.gpu import layout_checkpoint  # noqa: E402


def test_the_full_size_checkpoint_is_the_released_architecture(tmp_path: Path) -> None:
    """33,175,165 parameters with the 25 labels; the saved checkpoint loads back through
    transformers' own class and one (small) page gives the 300 queries' logits over the 25
    labels; the image processor's config names transformers' PP-DocLayoutV3 processor."""
    import torch  # noqa: PLC0415
    from transformers import PPDocLayoutV3ForObjectDetection  # noqa: PLC0415

    assert layout_checkpoint.main([str(tmp_path)]) == 0
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "pp_doclayout_v3"
    assert len(config["id2label"]) == 25
    processor = json.loads((tmp_path / "preprocessor_config.json").read_text())
    assert processor["image_processor_type"] == "PPDocLayoutV3ImageProcessor"
    model = PPDocLayoutV3ForObjectDetection.from_pretrained(tmp_path).eval()
    assert sum(p.numel() for p in model.parameters()) == layout_checkpoint.PARAMETERS
    with torch.inference_mode():
        logits = model(pixel_values=torch.rand(1, 3, 256, 256)).logits
    assert tuple(logits.shape) == (1, 300, 25)
