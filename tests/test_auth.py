"""API keys: accepted headers, OpenAI-shaped 401s, the hashed keys file, secrecy in logs."""

from __future__ import annotations

import json
import logging
import stat
from pathlib import Path

import httpx
import pytest

from app.auth import KeyFile, KeyFileError, KeyLimits, Keyring
from app.main import create_app
from tests.conftest import CLIENT_KEY, settings_for
from tests.support.fake_backend import SERVED, FakeVLLM
from tests.support.servers import lifespan_client

BODY = {"model": SERVED, "messages": [{"role": "user", "content": "OCR:"}]}


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({"authorization": f"Bearer {CLIENT_KEY}"}, 200),
        ({"authorization": f"bearer {CLIENT_KEY}"}, 200),
        ({"x-api-key": CLIENT_KEY}, 200),
        ({}, 401),
        ({"authorization": "Bearer null"}, 401),  # PaddleOCR's client with no key configured
        ({"authorization": "Bearer sk-wrong"}, 401),
        ({"authorization": CLIENT_KEY}, 401),  # no scheme
        ({"x-api-key": "sk-wrong"}, 401),
    ],
)
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/models"])
async def test_key_headers(fake: FakeVLLM, headers: dict[str, str], status: int, path: str) -> None:
    """Bearer and x-api-key keys are accepted; anything else is a 401 `invalid_api_key`."""
    async with lifespan_client(create_app(settings_for(fake.url))) as client:
        if path.endswith("models"):
            response = await client.get(path, headers=headers)
        else:
            response = await client.post(path, json=BODY, headers=headers)
    assert response.status_code == status
    if status == 401:
        error = response.json()["error"]
        assert error["code"] == "invalid_api_key"
        assert set(error) == {"message", "type", "param", "code"}
        assert "sk-wrong" not in error["message"]
        assert ("vl_rec_api_key" in error["message"]) == ("null" in str(headers))
        assert fake.bodies == []


@pytest.mark.anyio
async def test_auth_off_serves_without_keys(fake: FakeVLLM) -> None:
    """OCRVL_AUTH=off (explicit) serves requests that carry no key."""
    app = create_app(settings_for(fake.url, api_keys=[], auth="off"))
    async with lifespan_client(app) as client:
        response = await client.post("/v1/chat/completions", json=BODY)
    assert response.status_code == 200


@pytest.mark.anyio
async def test_keys_never_reach_logs_or_metrics(
    fake: FakeVLLM, caplog: pytest.LogCaptureFixture
) -> None:
    """Neither the client's key, a wrong key, nor the backend key appears in logs or metrics."""
    logging.getLogger("ocrvl").propagate = True  # let caplog see the JSON lines' records
    app = create_app(settings_for(fake.url))
    logging.getLogger("ocrvl").propagate = True
    with caplog.at_level(logging.DEBUG, logger="ocrvl"):
        async with lifespan_client(app) as client:
            await client.post("/v1/chat/completions", json=BODY, headers={"x-api-key": CLIENT_KEY})
            await client.post(
                "/v1/chat/completions", json=BODY, headers={"x-api-key": "sk-wrong-secret"}
            )
            metrics = (await client.get("/metrics")).text
    text = caplog.text + str([r.__dict__ for r in caplog.records]) + metrics
    assert "request" in caplog.text  # the access lines were captured
    for secret in (CLIENT_KEY, "sk-wrong-secret", "sk-test-backend-key"):
        assert secret not in text
    assert any(getattr(r, "key", None) == "env#1" for r in caplog.records)


def test_key_file_stores_only_hashes(tmp_path: Path) -> None:
    """`create` returns the key once; the file holds its SHA-256, readable by the owner only."""
    path = tmp_path / "keys.json"
    key = KeyFile(path).create("ci-runner")
    content = path.read_text()
    assert key.startswith("sk-ocrvl-")
    assert key not in content
    assert json.loads(content)["keys"][0]["name"] == "ci-runner"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert Keyring([], path).name_of(key) == "ci-runner"
    assert Keyring([], path).name_of(key + "x") is None


@pytest.mark.parametrize("name", ["", "has space", "semi;colon"])
def test_key_names_are_plain(tmp_path: Path, name: str) -> None:
    """Key names end up in logs, so they are restricted to plain characters."""
    with pytest.raises(KeyFileError, match="key names"):
        KeyFile(tmp_path / "keys.json").create(name)


def test_duplicate_key_name_is_refused(tmp_path: Path) -> None:
    """Two keys of one name would make the logs ambiguous."""
    keys = KeyFile(tmp_path / "keys.json")
    keys.create("alice")
    with pytest.raises(KeyFileError, match="exists already"):
        keys.create("alice")


def test_new_keys_are_picked_up_without_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A key created while the gateway runs is accepted after the reload interval."""
    path = tmp_path / "keys.json"
    keyring = Keyring(["plain"], path)
    key = KeyFile(path).create("late")
    monkeypatch.setattr("app.auth.RELOAD_EVERY", 0.0)
    assert keyring.name_of(key) == "late"
    assert keyring.name_of("plain") == "env#1"


def test_corrupt_key_file_is_a_clear_error(tmp_path: Path) -> None:
    """A keys file that is not ours says so instead of accepting nothing silently."""
    path = tmp_path / "keys.json"
    path.write_text("not json")
    with pytest.raises(KeyFileError, match="not a keys file"):
        Keyring([], path)


@pytest.mark.anyio
async def test_gateway_accepts_keys_from_the_file(fake: FakeVLLM, tmp_path: Path) -> None:
    """OCRVL_API_KEYS_FILE alone configures auth; its keys are accepted, others not."""
    path = tmp_path / "keys.json"
    key = KeyFile(path).create("team-a")
    app = create_app(settings_for(fake.url, api_keys=[], api_keys_file=path))
    async with lifespan_client(app) as client:
        good = await client.get("/v1/models", headers={"authorization": f"Bearer {key}"})
        bad = await client.get("/v1/models", headers={"authorization": f"Bearer {CLIENT_KEY}"})
    assert (good.status_code, bad.status_code) == (200, 401)


def test_unused_httpx_import_guard() -> None:
    """httpx is the client the tests use; its presence is part of the dev environment."""
    assert httpx.__version__


def test_key_limits_are_stored_edited_and_reset(tmp_path: Path) -> None:
    """`rpm`/`concurrency` live in the key's entry; edits keep other fields and other keys."""
    path = tmp_path / "keys.json"
    keys = KeyFile(path)
    key = keys.create("team", KeyLimits(rpm=600, concurrency=32))
    keys.create("other")
    keys.set_limits("team", KeyLimits(rpm=100))
    entries = {e.name: e.limits for e in keys.read()}
    assert entries == {"team": KeyLimits(100, 32), "other": KeyLimits()}
    keys.set_limits("team", KeyLimits(), clear=["concurrency"])
    stored = json.loads(path.read_text())["keys"]
    assert stored[0].keys() == {"name", "sha256", "created", "rpm"}  # `created` survives edits
    assert "created" in stored[1]
    assert Keyring([], path).name_of(key) == "team"
    assert Keyring([], path).limits_of("team") == KeyLimits(rpm=100)
    assert Keyring([], path).limits_of("env#1") == KeyLimits()


@pytest.mark.parametrize("value", [-1, "10", 1.5, True])
def test_invalid_limits_in_the_file_are_a_clear_error(tmp_path: Path, value: object) -> None:
    """A limit that is not a whole number >= 0 names the key and the field."""
    path = tmp_path / "keys.json"
    KeyFile(path).create("team")
    raw = json.loads(path.read_text())
    raw["keys"][0]["rpm"] = value
    path.write_text(json.dumps(raw))
    with pytest.raises(KeyFileError, match="'team': rpm must be an integer >= 0"):
        KeyFile(path).read()


def test_editing_an_unknown_key_is_refused(tmp_path: Path) -> None:
    """`keys set` on a name that is not in the file says so."""
    with pytest.raises(KeyFileError, match="no key named 'ghost'"):
        KeyFile(tmp_path / "keys.json").set_limits("ghost", KeyLimits(rpm=1))
