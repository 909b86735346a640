"""Settings from OCRVL_* variables: parsing, validation, and refusing to start without keys."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from app.settings import Settings


def test_reads_comma_separated_lists(monkeypatch: pytest.MonkeyPatch) -> None:
    """OCRVL_BACKENDS and OCRVL_API_KEYS are comma-separated; a trailing /v1 is tolerated."""
    monkeypatch.setenv("OCRVL_BACKENDS", "http://a:8118/v1, http://b:8118/")
    monkeypatch.setenv("OCRVL_API_KEYS", "k1,k2")
    settings = Settings()
    assert [b.url for b in settings.backends] == ["http://a:8118", "http://b:8118"]
    assert [k.get_secret_value() for k in settings.api_keys] == ["k1", "k2"]
    assert "k1" not in repr(settings)


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [name for name in os.environ if name.startswith("OCRVL_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("OCRVL_BACKENDS", "http://127.0.0.1:8118")


def test_defaults_match_the_documented_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    """Request timeout 600 s, body cap 20 MiB, keep-alive expiry below vLLM's 5 s."""
    monkeypatch.setenv("OCRVL_AUTH", "off")
    settings = Settings()
    assert settings.request_timeout == 600
    assert settings.max_body_bytes == 20 * 1024 * 1024
    assert settings.keepalive_expiry < 5
    assert settings.host == "127.0.0.1"


@pytest.mark.parametrize("env", [{}, {"OCRVL_AUTH": "on"}])
def test_no_key_configured_refuses_naming_both_settings(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str]
) -> None:
    """Without keys and without OCRVL_AUTH=off the gateway does not start."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValidationError) as caught:
        Settings()
    message = str(caught.value)
    assert "OCRVL_API_KEYS" in message
    assert "OCRVL_API_KEYS_FILE" in message
    assert "OCRVL_AUTH=off" in message


def test_backend_urls_must_be_http(monkeypatch: pytest.MonkeyPatch) -> None:
    """A backend without a scheme is named in the error."""
    monkeypatch.setenv("OCRVL_AUTH", "off")
    monkeypatch.setenv("OCRVL_BACKENDS", "vllm:8118")
    with pytest.raises(ValidationError, match="vllm:8118"):
        Settings()


def test_no_backend_configured_refuses(monkeypatch: pytest.MonkeyPatch) -> None:
    """An empty OCRVL_BACKENDS is a start-up error that says what to set."""
    monkeypatch.setenv("OCRVL_AUTH", "off")
    monkeypatch.setenv("OCRVL_BACKENDS", "")
    with pytest.raises(ValidationError, match="OCRVL_BACKENDS is empty"):
        Settings()


def test_redis_url_scheme_is_checked_without_echoing_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A wrong OCRVL_REDIS_URL is refused with the expected form; the message `ocrvl serve`
    prints does not repeat the URL, which may hold a password."""
    monkeypatch.setenv("OCRVL_AUTH", "off")
    monkeypatch.setenv("OCRVL_BACKENDS", "http://vllm:8118")
    monkeypatch.setenv("OCRVL_REDIS_URL", "http://:pa55word@redis:6379")
    with pytest.raises(ValidationError, match="redis://") as caught:
        Settings()
    assert "pa55word" not in caught.value.errors()[0]["msg"]
    monkeypatch.setenv("OCRVL_REDIS_URL", "redis://:pa55word@redis:6379/0")
    assert "pa55word" not in repr(Settings())


@pytest.mark.parametrize("content", [None, b"not a certificate\n"])
def test_an_upstream_ca_file_that_does_not_load_refuses_to_start(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, content: bytes | None
) -> None:
    """OCRVL_UPSTREAM_CA_FILE missing, or not PEM certificates: a start-up error naming the
    setting and the file, not a handshake failing at the first https:// backend."""
    ca_file = tmp_path / "ca.pem"
    if content is not None:
        ca_file.write_bytes(content)
    monkeypatch.setenv("OCRVL_AUTH", "off")
    monkeypatch.setenv("OCRVL_BACKENDS", "https://vllm:8118")
    monkeypatch.setenv("OCRVL_UPSTREAM_CA_FILE", str(ca_file))
    with pytest.raises(ValidationError, match=f"OCRVL_UPSTREAM_CA_FILE must be .*{ca_file}"):
        Settings()


def test_an_empty_upstream_ca_file_is_certifis_cas(monkeypatch: pytest.MonkeyPatch) -> None:
    """OCRVL_UPSTREAM_CA_FILE set but empty (an .env line with no value) is unset, not the
    current folder refused as a CA file."""
    monkeypatch.setenv("OCRVL_AUTH", "off")
    monkeypatch.setenv("OCRVL_BACKENDS", "https://vllm:8118")
    monkeypatch.setenv("OCRVL_UPSTREAM_CA_FILE", "")
    assert Settings().upstream_ca_file is None
