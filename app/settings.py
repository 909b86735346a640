"""The gateway's settings: one typed class read from `OCRVL_*` environment variables."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

MiB = 1024 * 1024


def _split_csv(value: object) -> object:
    if isinstance(value, str):
        return [item.strip() for item in value.split(",") if item.strip()]
    return value


class Settings(BaseSettings):
    """Everything the gateway reads from its environment (prefix `OCRVL_`)."""

    model_config = SettingsConfigDict(env_prefix="OCRVL_", extra="ignore")

    backends: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Comma-separated base URLs of vLLM OpenAI servers.",
    )
    api_keys: Annotated[list[SecretStr], NoDecode] = Field(
        default_factory=list, description="Comma-separated accepted client keys."
    )
    api_keys_file: Path | None = Field(
        default=None, description="File of named keys (SHA-256 hashes), see `ocrvl keys create`."
    )
    auth: Literal["on", "off"] = "on"
    backend_api_key: SecretStr | None = Field(
        default=None, description="Key the gateway presents to vLLM (`vllm serve --api-key`)."
    )
    request_timeout: float = Field(default=600.0, gt=0, description="Seconds for a whole request.")
    connect_timeout: float = Field(default=5.0, gt=0, description="Seconds to connect to vLLM.")
    max_body_bytes: int = Field(default=20 * MiB, gt=0)
    max_pixels: int = Field(
        default=1_003_520,
        gt=0,
        description="Cap on a request's mm_processor_kwargs.max_pixels: PaddleOCR-VL's own "
        "maximum (1,280 visual tokens), which the vLLM profiles size the encoder budget for.",
    )
    health_interval: float = Field(
        default=5.0, gt=0, description="Seconds between backend health probes."
    )
    max_connections: int = Field(
        default=1024, gt=0, description="Upstream connection pool size (all backends)."
    )
    keepalive_expiry: float = Field(
        default=4.0,
        gt=0,
        description="Idle upstream connections are dropped after this; below vLLM's 5 s.",
    )
    host: str = "127.0.0.1"
    port: int = 8000
    log_level: Literal["debug", "info", "warning", "error"] = "info"

    @field_validator("backends", "api_keys", mode="before")
    @classmethod
    def _comma_separated(cls, value: object) -> object:
        return _split_csv(value)

    @field_validator("backends")
    @classmethod
    def _backend_urls(cls, value: list[str]) -> list[str]:
        for url in value:
            if not url.startswith(("http://", "https://")):
                raise ValueError(
                    f"OCRVL_BACKENDS entries must be http:// or https:// base URLs; got {url!r}"
                )
        return [url.rstrip("/").removesuffix("/v1") for url in value]

    @model_validator(mode="after")
    def _backends_and_keys(self) -> Settings:
        if not self.backends:
            raise ValueError(
                "OCRVL_BACKENDS is empty: set it to the vLLM base URL(s), comma-separated, "
                "e.g. http://127.0.0.1:8118"
            )
        if self.auth == "on" and not self.api_keys and self.api_keys_file is None:
            raise ValueError(
                "no API key is configured: set OCRVL_API_KEYS (comma-separated keys) or "
                "OCRVL_API_KEYS_FILE (a file written by `ocrvl keys create NAME`), "
                "or set OCRVL_AUTH=off to serve without keys"
            )
        return self
