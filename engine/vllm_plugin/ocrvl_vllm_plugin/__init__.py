"""A vLLM general plugin: PaddleOCR-VL with a packed vision encoder (README.md).

vLLM calls `register` in every process it starts (API server, engine core, workers) through the
`vllm.general_plugins` entry point `ocrvl_packed_encoder`; `VLLM_PLUGINS=` (set and empty: an
allow-list that names no plugin) turns it off. The model class is registered by name, so this
module imports no torch and no model code until vLLM builds the model.
"""

from __future__ import annotations

ARCHITECTURE = "PaddleOCRVLForConditionalGeneration"  # the name in the checkpoint's config.json
MODULE, CLASS = "ocrvl_vllm_plugin.model", "PackedPaddleOCRVLForConditionalGeneration"
BUILT_FOR = "0.32."  # the vLLM release whose paddleocr_vl.py the class subclasses

__all__ = ["ARCHITECTURE", "CLASS", "MODULE", "register"]


def register() -> None:
    """Register the packed class over vLLM's own for ARCHITECTURE (a second call does nothing)."""
    import vllm  # noqa: PLC0415
    from vllm import ModelRegistry  # noqa: PLC0415
    from vllm.logger import init_logger  # noqa: PLC0415

    log = init_logger("vllm.ocrvl_vllm_plugin")
    if not vllm.__version__.startswith(BUILT_FOR):
        # an older image (the V100 profile's vLLM 0.19.1): vLLM's own class, said once
        log.info(
            "ocrvl_packed_encoder: built for vLLM %sx, this is %s: vLLM's own class stays",
            BUILT_FOR,
            vllm.__version__,
        )
        return

    current = ModelRegistry.models.get(ARCHITECTURE)
    if (getattr(current, "module_name", None), getattr(current, "class_name", None)) == (
        MODULE,
        CLASS,
    ):
        return
    ModelRegistry.register_model(ARCHITECTURE, f"{MODULE}:{CLASS}")
    log.info(
        "ocrvl_packed_encoder: %s now builds %s:%s (packed vision encoder; VLLM_PLUGINS= turns "
        "it off)",
        ARCHITECTURE,
        MODULE,
        CLASS,
    )
