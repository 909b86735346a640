"""The first hour with keys, as README's "Keys and budgets" gives it: `ocrvl keys create` writes
where a gateway started in the same folder reads, and each command says what to do next.

A real `ocrvl serve` runs in front of FakeVLLM (a stand-in engine on a loopback port).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import BACKEND_KEY, VENV_BIN, wait_until_up
from tests.support.documents import pdf
from tests.support.fake_backend import FakeVLLM
from tests.support.servers import free_port

OCRVL = str(VENV_BIN / "ocrvl")


def ocrvl(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """`ocrvl ARGS` in `cwd`, with no OCRVL_* variable but `env`."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("OCRVL_")}
    return subprocess.run(
        [OCRVL, *args], capture_output=True, text=True, cwd=cwd, env={**base, **env}, timeout=60
    )


@pytest.fixture
def serve(fake: FakeVLLM, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """`ocrvl serve` started in `tmp_path` with no key setting at all, once a key exists."""
    created = ocrvl("keys", "create", "team-a", cwd=tmp_path)
    assert created.returncode == 0, created.stderr
    (tmp_path / "key").write_text(created.stdout.strip())
    port = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("OCRVL_")},
        "OCRVL_BACKENDS": fake.url, "OCRVL_BACKEND_API_KEY": BACKEND_KEY,
        "OCRVL_PREPROCESS_WORKERS": "1",
    }  # fmt: skip
    log = tmp_path / "gateway.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [OCRVL, "serve", "--port", str(port)], cwd=tmp_path, env=env, stdout=out,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until_up(f"{url}/ready", process, log, 30)
        yield url, tmp_path
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_a_created_key_is_accepted_by_a_gateway_started_beside_it(
    serve: tuple[str, Path],
) -> None:
    """`ocrvl keys create team-a` (no --file, no OCRVL_API_KEYS_FILE) writes
    secrets/api-keys.json and says the gateway reads it; `ocrvl serve` started there with no key
    setting accepts the key (before: a bare 401, the file was never read)."""
    url, folder = serve
    key = (folder / "key").read_text()
    assert (folder / "secrets" / "api-keys.json").is_file()
    listed = ocrvl("keys", "list", cwd=folder)
    assert listed.returncode == 0, listed.stderr
    assert "team-a" in listed.stdout
    answer = httpx.get(f"{url}/v1/models", headers={"authorization": f"Bearer {key}"})
    assert answer.status_code == 200, answer.text
    usage = httpx.get(f"{url}/v1/usage", headers={"authorization": f"Bearer {key}"})
    assert usage.json()["key"] == "team-a"


def test_keys_create_says_where_it_wrote_and_how_it_is_read(tmp_path: Path) -> None:
    """stderr names the file and that a gateway started in that folder reads it (a gateway
    already running there only once restarted, when this key made the file: it reads the
    default file only if it is there at start); the key alone is on stdout."""
    created = ocrvl("keys", "create", "team-b", cwd=tmp_path)
    assert created.returncode == 0, created.stderr
    assert created.stdout.strip().startswith("sk-ocrvl-")
    assert "in secrets/api-keys.json" in created.stderr
    assert "reads it without OCRVL_API_KEYS_FILE" in created.stderr
    # the first key makes the file, which a gateway already running here never looked at
    assert "reads it only once restarted" in created.stderr
    assert "; a running gateway takes a change within 1 s" not in created.stderr
    second = ocrvl("keys", "create", "team-d", cwd=tmp_path)
    assert "; a running gateway takes a change within 1 s" in second.stderr
    other = ocrvl("keys", "create", "team-c", "--file", "elsewhere.json", cwd=tmp_path)
    assert "OCRVL_API_KEYS_FILE=elsewhere.json" in other.stderr


def test_the_keys_file_in_the_repository_is_never_tracked() -> None:
    """Created in the repository's root (where `make serve` runs), secrets/api-keys.json is
    ignored by git (secrets/.gitignore), as are other files there; the folder itself stays."""
    root = Path(__file__).resolve().parent.parent
    ignored = subprocess.run(
        ["git", "check-ignore", "--no-index", "secrets/api-keys.json", "secrets/other.json"],
        cwd=root, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert ignored.stdout.split() == ["secrets/api-keys.json", "secrets/other.json"]
    kept = subprocess.run(
        ["git", "check-ignore", "--no-index", "secrets/.gitignore"],
        cwd=root, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert kept.returncode == 1  # not ignored: the rule travels with the repository


def test_keys_list_without_a_file_says_so(tmp_path: Path) -> None:
    """No keys file: exit 1 and a line naming the file and `ocrvl keys create` (before: an
    empty table, as if the file held no key)."""
    listed = ocrvl("keys", "list", cwd=tmp_path)
    assert listed.returncode == 1
    assert "no keys file at secrets/api-keys.json" in listed.stderr
    assert "ocrvl keys create NAME" in listed.stderr


def test_serve_without_any_key_names_keys_create(tmp_path: Path) -> None:
    """`ocrvl serve` with no key anywhere exits 2 and names `ocrvl keys create` and the file."""
    result = ocrvl("serve", "--port", "1", cwd=tmp_path, OCRVL_BACKENDS="http://127.0.0.1:9")
    assert result.returncode == 2
    assert "ocrvl keys create NAME" in result.stderr
    assert "secrets/api-keys.json" in result.stderr


def test_ocr_without_a_key_names_the_flag_and_the_variable(serve: tuple[str, Path]) -> None:
    """`ocrvl ocr` with no key: exit 2 and a message naming --key and OCRVL_API_KEY; a wrong key
    is named as the one sent."""
    url, folder = serve
    (folder / "doc.pdf").write_bytes(pdf(1))
    bare = ocrvl("ocr", "doc.pdf", "--url", url, cwd=folder)
    assert bare.returncode == 2
    assert "--key" in bare.stderr
    assert "OCRVL_API_KEY" in bare.stderr
    wrong = ocrvl("ocr", "doc.pdf", "--url", url, cwd=folder, OCRVL_API_KEY="sk-wrong")
    assert wrong.returncode == 2
    assert "is not one this gateway knows" in wrong.stderr
