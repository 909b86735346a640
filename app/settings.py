"""The gateway's settings: one typed class read from `OCRVL_*` environment variables."""

from __future__ import annotations

import ipaddress
import os
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from app import KEYS_FILE

MiB = 1024 * 1024
DEFAULT_KEYS_FILE = Path(KEYS_FILE)  # where `ocrvl keys create` writes (app/__init__.py)


@dataclass(frozen=True, slots=True)
class BackendSpec:
    """One `OCRVL_BACKENDS` entry: `URL[;capacity=N]` or `dns+URL[;capacity=N]`."""

    url: str  # base URL, no trailing /v1; for a dns+ entry, the name whose records are backends
    capacity: int | None = None  # pages served at once; None: learnt from the engine's /metrics
    discover: bool = False  # dns+: every A/AAAA record of the URL's host is a backend

    @classmethod
    def parse(cls, entry: str) -> BackendSpec:
        """Read one entry; ValueError naming the entry and the expected syntax."""
        url, *options = (part.strip() for part in entry.split(";"))
        discover = url.startswith("dns+")
        url = url.removeprefix("dns+")
        if not url.startswith(("http://", "https://")):
            raise ValueError(
                "OCRVL_BACKENDS entries must be http:// or https:// base URLs (or "
                "dns+http://NAME:PORT for every address of NAME), optionally followed by "
                f";capacity=N; got {entry!r}"
            )
        capacity = None
        for option in options:
            name, _, value = option.partition("=")
            if name.strip() != "capacity" or not value.strip().isdigit() or int(value) < 1:
                raise ValueError(
                    f"OCRVL_BACKENDS entry {entry!r}: the only option is ;capacity=N with N >= 1 "
                    f"(pages the backend serves at once); got {option!r}"
                )
            capacity = int(value)
        return cls(url.rstrip("/").removesuffix("/v1"), capacity, discover)


def split_host_port(value: str, default_port: int) -> tuple[str, int]:
    """`HOST`, `HOST:PORT`, `[V6]:PORT` or a bare IPv6 address; ValueError saying which form."""
    host, port = value.strip(), str(default_port)
    if host.startswith("["):
        host, bracket, rest = host[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            host = ""  # "[::1" or "[::1]x"
        elif rest:
            port = rest[1:]
    elif host.count(":") == 1:
        host, port = host.split(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"expected HOST, HOST:PORT or [IPV6]:PORT; got {value!r}")
    return host, int(port)


def _split_csv(value: object) -> object:
    if isinstance(value, str):
        return [item.strip() for item in value.split(",") if item.strip()]
    return value


class Settings(BaseSettings):
    """Everything the gateway reads from its environment (prefix `OCRVL_`)."""

    model_config = SettingsConfigDict(env_prefix="OCRVL_", extra="ignore")

    backends: Annotated[list[BackendSpec], NoDecode] = Field(
        default_factory=list,
        description="Comma-separated vLLM base URLs, each optionally `;capacity=N`; "
        "`dns+http://NAME:PORT` makes every address of NAME a backend.",
    )
    api_keys: Annotated[list[SecretStr], NoDecode] = Field(
        default_factory=list, description="Comma-separated accepted client keys."
    )
    api_keys_file: Path | None = Field(
        default=None,
        description="File of named keys (SHA-256 hashes), see `ocrvl keys create`; unset: "
        "secrets/api-keys.json when that file exists (where `ocrvl keys create` writes).",
    )
    auth: Literal["on", "off"] = "on"
    backend_api_key: SecretStr | None = Field(
        default=None, description="Key the gateway presents to vLLM (`vllm serve --api-key`)."
    )
    request_timeout: float = Field(default=600.0, gt=0, description="Seconds for a whole request.")
    connect_timeout: float = Field(default=5.0, gt=0, description="Seconds to connect to vLLM.")
    close_timeout: float = Field(
        default=5.0,
        gt=0,
        description="Seconds each step of the shutdown (a store, a client, a task closed) may "
        "take before it is abandoned with a warning and the next step closes.",
    )
    max_body_bytes: int = Field(default=20 * MiB, gt=0)
    max_pixels: int = Field(
        default=1_003_520,
        gt=0,
        description="Cap on a request's mm_processor_kwargs.max_pixels: PaddleOCR-VL's own "
        "maximum (1,280 visual tokens), which the vLLM profiles size the encoder budget for.",
    )
    dns_server: str | None = Field(
        default=None,
        description="`IP[:PORT]` of the DNS server that resolves `dns+` backends; "
        "unset: the system's (/etc/resolv.conf, with its search domains).",
    )
    health_interval: float = Field(
        default=5.0, gt=0, description="Seconds between backend health probes."
    )
    admission: Literal["on", "off"] = Field(
        default="on",
        description="on: a request waits in the fair queue when every backend is at capacity; "
        "off: every request goes straight to the least loaded backend (vLLM queues it).",
    )
    queue_size: int = Field(
        default=1024,
        ge=0,
        description="Requests that may wait for a backend slot; one more is shed with 503.",
    )
    queue_timeout: float = Field(
        default=300.0,
        gt=0,
        description="Seconds a request may wait for a slot before a 503; a request whose "
        "expected wait (queue ahead / the backends' drain rate) is longer is shed at once.",
    )
    engine_stream_interval: int = Field(
        default=1,
        ge=1,
        description="Tokens in each event of the streams the gateway reads itself (a document's "
        "pages and blocks, a guarded chat answered whole): vLLM's `stream_interval`, so its API "
        "servers and the gateway handle an event per that many tokens instead of one per token "
        "(8 eased a CPU host; on one H100 engine it read fewer pages, on three more by blocks: "
        "docs/benchmarks.md). A client's own stream always comes token by token.",
    )
    metrics_interval: float = Field(
        default=1.0,
        gt=0,
        description="Seconds between reads of each engine's /metrics (load-aware routing) "
        "and re-probes of unhealthy backends.",
    )
    max_connections: int = Field(
        default=1024, gt=0, description="Upstream connection pool size (all backends)."
    )
    upstream_ca_file: Path | None = Field(
        default=None,
        description="PEM file of the CA certificates an https:// backend's or layout service's "
        "certificate must verify against, in place of certifi's (a private CA).",
    )
    keepalive_expiry: float = Field(
        default=4.0,
        gt=0,
        description="Idle upstream connections (engines, layout services) are dropped after "
        "this; below vLLM's 5 s keep-alive.",
    )
    # -- documents (/v1/ocr) and remote images (docs/ocr.md) --
    preprocess_workers: int = Field(
        default_factory=lambda: max(len(os.sched_getaffinity(0)) - 1, 1),
        gt=0,
        description="Processes that rasterise, resize and encode pages (default cores - 1).",
    )
    preprocess_held_bytes: int = Field(
        default=128 * MiB,
        ge=0,
        description="Bytes of laid-out pages' pixels kept in the temp folder from a page's "
        "rasterising until its blocks are cut (all documents); a page past it is rendered twice.",
    )
    ocr_page_concurrency: int = Field(
        default=8, gt=0, description="Pages of one /v1/ocr request in flight at once."
    )
    max_pages: int = Field(default=200, gt=0, description="Pages one /v1/ocr request may ask for.")
    max_file_bytes: int = Field(default=50 * MiB, gt=0, description="Size cap of a /v1/ocr file.")
    max_page_pixels: int = Field(
        default=60_000_000,
        gt=0,
        description="Pixels a page may have before resizing (decompression bombs are refused "
        "from the header, before decoding); a PDF page counts at the requested dpi.",
    )
    ocr_block_concurrency: int = Field(
        default=32,
        gt=0,
        description="Blocks of one /v1/ocr request or job (all its pages) in flight at once, "
        "with the layout pipeline.",
    )
    loops: Literal["cut", "retry", "off"] = Field(
        default="cut",
        description="The loop guard of the document pipeline when a request does not say "
        "(`loops`): cut stops a block or page whose answer loops and keeps the text before the "
        "loop; retry also asks once more with a repetition penalty; off relays answers whole "
        "(docs/loops.md).",
    )
    chat_loop_guard: Literal["on", "off"] = Field(
        default="off",
        description="on: /v1/chat/completions answers (n 1) are watched by the loop guard too "
        "(a request's X-OCRVL-Loop-Guard header says otherwise), and a batch's lines unless "
        "the batch says; off: relayed as they come.",
    )
    layout_url: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Comma-separated base URLs of the layout service (python -m ocrvl_layout); "
        "set: /v1/ocr's `layout=auto` runs the layout pipeline (docs/ocr-layout.md).",
    )
    layout_timeout: float = Field(
        default=30.0,
        gt=0,
        description="Seconds a page may wait for the layout service's answer before a 503.",
    )
    ready_requires_layout: bool = Field(
        default=False,
        description="true: /ready is 503 while no layout service (OCRVL_LAYOUT_URL) answered "
        "its last probe; false: /ready reports the layout service's state and stays 200 "
        "(chat, layout=off and layout=auto still serve; docs/operations.md).",
    )
    ocr_min_pixels: int = Field(
        default=112_896, gt=0, description="PaddleOCR-VL's min_pixels (144 visual tokens)."
    )
    media_fetch: Literal["on", "off"] = Field(
        default="off",
        description="on: the gateway fetches http(s) image URLs itself (SSRF-checked) and inlines "
        "them; off: such URLs are refused with 400.",
    )
    allowed_media_domains: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="With media_fetch=on, the only hosts fetched (comma-separated; *.example.com "
        "for subdomains); empty: any public host.",
    )
    resize_images: Literal["on", "off"] = Field(
        default="off",
        description="on: a chat image whose request carries min/max pixels in "
        "mm_processor_kwargs (PaddleOCR's client always sends them) is resized in the page "
        "workers to the size vLLM's processor would pick, so vLLM's API server does half the "
        "work per page (bench/results/renderer-2026-12-01.md); off: images go as the client "
        "sent them.",
    )
    media_max_bytes: int = Field(default=20 * MiB, gt=0)
    media_fetch_timeout: float = Field(default=10.0, gt=0, description="Seconds for one fetch.")
    media_allow_loopback: bool = Field(
        default=False, description="Tests only: lets media fetches reach 127.0.0.1."
    )
    # -- per-key limits (docs/limits.md) --
    key_rpm: int = Field(
        default=0,
        ge=0,
        description="Requests per minute per key, for keys whose entry sets none; 0: unlimited.",
    )
    key_concurrency: int = Field(
        default=0,
        ge=0,
        description="Requests in flight per key, for keys whose entry sets none; 0: unlimited "
        "(PaddleOCR's client sends up to 200 pages at once).",
    )
    redis_url: SecretStr | None = Field(
        default=None,
        description="redis://[:PASSWORD@]HOST:PORT[/DB] (or rediss://): replicas share their "
        "per-key limits there; unset or unreachable: each replica counts alone, in memory.",
    )
    # -- usage per key (docs/operations.md, Usage; budgets in docs/limits.md) --
    usage: Literal["on", "off"] = Field(
        default="on",
        description="on: requests, pages and tokens are counted per key (Prometheus, the store, "
        "GET /v1/usage) and page budgets apply; off: none of it (no budget is enforced).",
    )
    usage_flush_interval: float = Field(
        default=1.0,
        gt=0,
        le=60,
        description="Seconds between writes of the usage counts to the store: a gateway that "
        "dies loses at most this long of counts (reserved budget pages excepted).",
    )
    ui: Literal["on", "off"] = Field(
        default="on",
        description="on: `GET /ui` serves the page to try documents on (docs/ui.md); "
        "off: no such route (404).",
    )
    # -- document jobs (docs/jobs.md) --
    data_dir: Path = Field(
        default=Path("data"),
        description="Folder of the job store (SQLite file and documents) when OCRVL_REDIS_URL "
        "is unset: a compose volume or a Kubernetes PVC.",
    )
    job_ttl: float = Field(
        default=86_400.0, gt=0, description="Seconds a job's results are kept after it ends."
    )
    job_max_pages: int = Field(default=5000, gt=0, description="Pages one job may ask for.")
    job_max_file_bytes: int = Field(
        default=200 * MiB, gt=0, description="Size cap of a job's file."
    )
    job_max_active: int = Field(
        default=8, gt=0, description="Jobs queued or running per key; one more is a 429."
    )
    job_max_stored_bytes: int = Field(
        default=10 * 1024 * MiB,
        gt=0,
        description="Documents' bytes the store may hold (all keys); past it a new job is a 503.",
    )
    job_concurrency: int = Field(default=2, gt=0, description="Jobs one gateway runs at once.")
    job_page_concurrency: int = Field(
        default=8, gt=0, description="Pages of one job in flight at once (background lane)."
    )
    job_lease: float = Field(
        default=15.0,
        gt=0,
        description="Seconds a gateway's claim on a job lasts unrenewed: after a crash, another "
        "replica takes the job over this long after the last renewal.",
    )
    # -- the results cache and Idempotency-Key (docs/cache.md) --
    cache: Literal["on", "off"] = Field(
        default="on",
        description="on: a page read once is answered again from the results cache (per key, "
        "by content and options) by /v1/ocr, jobs, /layout-parsing and /ui; off: never.",
    )
    cache_ttl: float = Field(
        default=7 * 86_400.0, gt=0, description="Seconds a cached page is kept after it was read."
    )
    cache_max_bytes: int = Field(
        default=1024 * MiB,
        gt=0,
        description="Bytes the results cache may hold (all keys); past it, the oldest go first.",
    )
    cache_sweep_interval: float = Field(
        default=10.0,
        gt=0,
        le=3600,
        description="Seconds between sweeps of the results cache (expired, then over the cap).",
    )
    idempotency_ttl: float = Field(
        default=86_400.0,
        gt=0,
        description="Seconds an Idempotency-Key's first answer is kept (per key name).",
    )
    # -- batches (docs/clients.md, Batches) --
    batch_max_file_bytes: int = Field(
        default=200 * MiB, gt=0, description="Size cap of one `/v1/files` upload (a batch's JSONL)."
    )
    batch_max_requests: int = Field(
        default=50_000, gt=0, description="Request lines one batch's input file may hold."
    )
    webhook_secret: SecretStr | None = Field(
        default=None,
        description="Standard Webhooks secret (`whsec_` + base64) that signs job callbacks; "
        "unset: `callback_url` is refused.",
    )
    webhook_allowed_hosts: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Callback hosts exempt from the address rules (e.g. an in-cluster "
        "receiver), comma-separated; every other host must resolve to public addresses.",
    )
    # -- request policy: what a client may make vLLM do (app/policy.py, docs/clients.md) --
    max_n: int = Field(
        default=1,
        ge=1,
        description="Most `n` (sequences per request, also the beam width); a request with n > 1 "
        "counts as n pages in admission and in every per-key limit.",
    )
    max_logprobs: int = Field(
        default=20, ge=0, description="Most top_logprobs, prompt_logprobs, logprob_token_ids."
    )
    max_stop_strings: int = Field(
        default=4, ge=0, description="Most `stop` strings (and `bad_words`) per request."
    )
    max_stop_length: int = Field(
        default=64, ge=1, description="Most characters per `stop` string (and `bad_words` entry)."
    )
    structured_outputs: Literal["on", "off"] = Field(
        default="off",
        description="on: grammars (structured_outputs, response_format json_schema/json_object/"
        "structural_tag, tools, legacy guided_*) reach vLLM within the two caps below; off: 400 "
        "structured_outputs_disabled (adversarial grammars have crashed and hung vLLM).",
    )
    structured_max_bytes: int = Field(
        default=16384, gt=0, description="Most bytes of one schema, regex, grammar or choice list."
    )
    structured_max_depth: int = Field(
        default=16, gt=0, description="Most nesting of a schema (objects/arrays) or of a regex."
    )
    pass_fields: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Comma-separated request fields passed unchanged that the policy would refuse "
        "(a newer vLLM's field, or an operator-only one for trusted clients).",
    )
    host: str = "127.0.0.1"
    port: int = 8000
    log_level: Literal["debug", "info", "warning", "error"] = "info"

    @field_validator(
        "api_keys", "allowed_media_domains", "webhook_allowed_hosts", "pass_fields", mode="before"
    )
    @classmethod
    def _comma_separated(cls, value: object) -> object:
        return _split_csv(value)

    @field_validator("layout_url", mode="before")
    @classmethod
    def _layout_urls(cls, value: object) -> object:
        value = _split_csv(value)
        for url in value if isinstance(value, list) else []:
            if not isinstance(url, str) or not url.startswith(("http://", "https://")):
                raise ValueError(
                    "OCRVL_LAYOUT_URL entries must be http:// or https:// base URLs of the "
                    f"layout service, comma-separated; got {url!r}"
                )
        return [url.rstrip("/") for url in value] if isinstance(value, list) else value

    @field_validator("backends", mode="before")
    @classmethod
    def _backend_specs(cls, value: object) -> object:
        value = _split_csv(value)
        if isinstance(value, list):
            return [BackendSpec.parse(v) if isinstance(v, str) else v for v in value]
        return value

    @field_validator("upstream_ca_file", mode="before")
    @classmethod
    def _upstream_ca_file(cls, value: object) -> object:
        if value is None or value == "":
            return None  # empty, as compose passes an unset one on: certifi's CAs
        try:  # loaded as app.upstream.trust loads it, so a bad file stops the start here
            ssl.create_default_context(cafile=str(value))
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(
                f"OCRVL_UPSTREAM_CA_FILE must be a PEM file of CA certificates; {value}: {exc}"
            ) from None
        return value

    @field_validator("dns_server")
    @classmethod
    def _dns_server(cls, value: str | None) -> str | None:
        if value is not None:
            host, _ = split_host_port(value, default_port=53)
            try:
                ipaddress.ip_address(host)
            except ValueError:
                raise ValueError(f"OCRVL_DNS_SERVER must be an IP address; got {value!r}") from None
        return value

    @field_validator("redis_url")
    @classmethod
    def _redis_url(cls, value: SecretStr | None) -> SecretStr | None:
        schemes = ("redis://", "rediss://", "unix://")
        if value is not None and not value.get_secret_value().startswith(schemes):
            raise ValueError(  # the URL itself is not repeated: it may hold a password
                "OCRVL_REDIS_URL must start with redis://, rediss:// or unix:// "
                "(e.g. redis://:PASSWORD@127.0.0.1:6379/0)"
            )
        return value

    @model_validator(mode="after")
    def _backends_and_keys(self) -> Settings:
        if not self.backends:
            raise ValueError(
                "OCRVL_BACKENDS is empty: set it to the vLLM base URL(s), comma-separated, "
                "e.g. http://127.0.0.1:8118"
            )
        if self.api_keys_file is None and DEFAULT_KEYS_FILE.is_file():
            self.api_keys_file = DEFAULT_KEYS_FILE  # what `ocrvl keys create` wrote here
        if self.auth == "on" and not self.api_keys and self.api_keys_file is None:
            raise ValueError(
                "no API key is configured: run `ocrvl keys create NAME` (it writes "
                f"{DEFAULT_KEYS_FILE}, which the gateway reads), or set OCRVL_API_KEYS "
                "(comma-separated keys) or OCRVL_API_KEYS_FILE, or OCRVL_AUTH=off to serve "
                "without keys"
            )
        return self
