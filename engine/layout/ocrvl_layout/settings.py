"""The layout service's settings: `--flags` on the command line, else `OCRVL_LAYOUT_*` variables."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_PORT = 8300


class Settings(BaseSettings):
    """Every setting of `python -m ocrvl_layout` (docs/layout.md lists them)."""

    model_config = SettingsConfigDict(env_prefix="OCRVL_LAYOUT_", extra="ignore")

    model: str = Field(
        description="a PP-DocLayoutV3 checkpoint (transformers' files): a folder, or a Hugging Face"
        " repo id found in (or, online, fetched into) the Hugging Face cache"
    )
    orientation_model: str | None = Field(
        None,
        description="a PP-LCNet_x1_0_doc_ori checkpoint (folder or repo id): requests may ask "
        "for `orientation`; unset, such a request is refused",
    )
    unwarping_model: str | None = Field(
        None,
        description="a UVDoc checkpoint (folder or repo id): requests may ask for `unwarp`",
    )

    @field_validator("orientation_model", "unwarping_model")
    @classmethod
    def _unset(cls, value: str | None) -> str | None:
        return value or None  # an empty variable (compose's `ORIENTATION_MODEL=`) is none

    host: str = "127.0.0.1"
    port: int = Field(DEFAULT_PORT, ge=0, le=65535, description="0: any free port")
    device: Literal["auto", "cpu", "cuda"] = "auto"
    max_batch: int = Field(8, ge=1, description="pages per forward pass, at most")
    max_wait_ms: float = Field(10.0, ge=0, description="how long a batch waits for more pages")
    compile: bool = Field(
        False, description="torch.compile the model (the warm-up compiles every batch size)"
    )
    cuda_graphs: bool = Field(
        True,
        description="replay the forward pass from CUDA graphs, one per batch size (on a GPU, "
        "without --compile; a capture that fails or differs from the eager pass leaves it eager)",
    )
    max_queue: int = Field(
        512,
        ge=1,
        description="pages held at once (the admitted requests' pages, from before decoding to "
        "the end of their pass); more: 503",
    )
    max_images: int = Field(32, ge=1, description="images in one request")
    max_pixels: int = Field(
        60_000_000,
        ge=1,
        description="pixels of one image (width x height): the gateway's OCRVL_MAX_PAGE_PIXELS",
    )
    max_request_bytes: int = Field(256 * 1024 * 1024, ge=1, description="a request body's size")
    workers: int = Field(
        4,
        ge=1,
        description="threads that parse bodies (and, with "
        "--worker-processes 0, decode images and post-process)",
    )
    worker_processes: int | None = Field(
        None,
        ge=0,
        description="processes that decode, resize and post-process pages (unset: the cores "
        "this process may use, at most 8); 0: the --workers threads",
    )
    log_level: Literal["debug", "info", "warning", "error"] = "info"
