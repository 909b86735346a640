"""API keys: named keys stored as SHA-256 hashes, checked in constant time."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, Request

from app.errors import AuthenticationFailed

KEY_PREFIX = "sk-ocrvl-"
RELOAD_EVERY = 1.0  # seconds between checks of the keys file for changes


class KeyFileError(Exception):
    """The keys file cannot be read or written as asked."""


def digest(key: str) -> bytes:
    """SHA-256 of a key: the only form in which keys are kept."""
    return hashlib.sha256(key.encode()).digest()


@dataclass(frozen=True, slots=True)
class KeyLimits:
    """A key's own limits from the keys file; None: the settings' default, 0: unlimited
    (the page budgets have no default: None and 0 are both none, docs/limits.md)."""

    rpm: int | None = None
    concurrency: int | None = None
    pages_per_day: int | None = None
    pages_per_month: int | None = None


@dataclass(frozen=True, slots=True)
class NamedDigest:
    """A key's name and hash, and its own limits."""

    name: str
    sha256: bytes
    limits: KeyLimits = KeyLimits()


LIMIT_FIELDS = ("rpm", "concurrency", "pages_per_day", "pages_per_month")


def _limits(entry: dict[str, Any]) -> KeyLimits:
    limits = KeyLimits(*(entry.get(field) for field in LIMIT_FIELDS))
    for field in LIMIT_FIELDS:
        value = getattr(limits, field)
        if value is not None and (type(value) is not int or value < 0):  # bool is no count
            raise ValueError(f"key {entry.get('name')!r}: {field} must be an integer >= 0")
    return limits


class KeyFile:
    """The JSON file of named key hashes that `ocrvl keys create` writes."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)

    def read(self) -> list[NamedDigest]:
        """The named hashes in the file, with their limits; an absent file holds none."""
        try:
            return [
                NamedDigest(k["name"], bytes.fromhex(k["sha256"]), _limits(k))
                for k in self._entries()
            ]
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise KeyFileError(
                f"{self.path} is not a keys file written by `ocrvl keys create` ({exc})"
            ) from exc

    def _entries(self) -> list[dict[str, Any]]:
        """The file's entries as stored (every field kept, so a rewrite loses none)."""
        try:
            entries: list[dict[str, Any]] = json.loads(self.path.read_text())["keys"]
        except FileNotFoundError:
            return []
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise KeyFileError(
                f"{self.path} is not a keys file written by `ocrvl keys create` ({exc})"
            ) from exc
        return entries

    def create(self, name: str, limits: KeyLimits = KeyLimits()) -> str:
        """Add a new random key named `name`; return the key, which is stored only hashed."""
        if not name or not name.replace("-", "").replace("_", "").replace(".", "").isalnum():
            raise KeyFileError(f"key names are letters, digits, '-', '_' and '.'; got {name!r}")
        entries = self._entries()
        if any(entry.get("name") == name for entry in entries):
            raise KeyFileError(f"a key named {name!r} exists already in {self.path}")
        key = KEY_PREFIX + secrets.token_urlsafe(32)
        entry: dict[str, object] = {"name": name, "sha256": digest(key).hex(), "created": _now()}
        self._write([*entries, _with_limits(entry, limits)])
        return key

    def set_limits(self, name: str, limits: KeyLimits, *, clear: Sequence[str] = ()) -> None:
        """Change key `name`'s limits: given fields replace, `clear`ed ones revert to defaults."""
        entries = self._entries()
        for entry in entries:
            if entry.get("name") == name:
                for field in clear:
                    entry.pop(field, None)
                _with_limits(entry, limits)
                self._write(entries)
                return
        raise KeyFileError(f"no key named {name!r} in {self.path}")

    def _write(self, stored: list[dict[str, object]]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump({"keys": stored}, out, indent=2)
        tmp.replace(self.path)  # atomic: a gateway reading the file never sees half of it


def _with_limits(entry: dict[str, object], limits: KeyLimits) -> dict[str, object]:
    for field in LIMIT_FIELDS:
        value = getattr(limits, field)
        if value is not None:
            if value < 0:
                raise KeyFileError(f"{field} must be >= 0 (0: unlimited); got {value}")
            entry[field] = value
    return entry


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


class Keyring:
    """The keys the gateway accepts: plain keys from the environment and a keys file."""

    def __init__(self, plain_keys: list[str], key_file: Path | None) -> None:
        self._plain = [NamedDigest(f"env#{i}", digest(k)) for i, k in enumerate(plain_keys, 1)]
        self._file = KeyFile(key_file) if key_file is not None else None
        self._file_keys: list[NamedDigest] = []
        self._limits: dict[str, KeyLimits] = {}
        self._file_mtime: float | None = None
        self._checked_at = 0.0
        self._reload()

    def _reload(self) -> None:
        if self._file is None:
            return
        try:
            mtime = self._file.path.stat().st_mtime
        except FileNotFoundError:
            mtime = None
        if mtime != self._file_mtime:
            self._file_keys = self._file.read()
            self._limits = {entry.name: entry.limits for entry in self._file_keys}
            self._file_mtime = mtime

    def limits_of(self, name: str) -> KeyLimits:
        """The limits the keys file sets for key `name` (as of the last reload)."""
        return self._limits.get(name, KeyLimits())

    def name_of(self, key: str) -> str | None:
        """The name of `key` if it is accepted, compared against every hash in constant time."""
        now = time.monotonic()
        if now - self._checked_at > RELOAD_EVERY:  # picks up `ocrvl keys create` without restart
            self._checked_at = now
            self._reload()
        presented = digest(key)
        found = None
        for entry in (*self._plain, *self._file_keys):
            if hmac.compare_digest(presented, entry.sha256) and found is None:
                found = entry.name
        return found


def presented_key(request: Request) -> str | None:
    """The key from `Authorization: Bearer KEY` (the OpenAI SDK) or `x-api-key: KEY`."""
    header = request.headers.get("authorization")
    if header:
        scheme, _, value = header.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
    return request.headers.get("x-api-key") or None


async def authenticate(request: Request) -> str:
    """Dependency: the caller's key name, or 401 in OpenAI's shape.

    Async on purpose: see app/state.py.
    """
    keyring: Keyring | None = request.state.gateway.keyring
    if keyring is None:  # OCRVL_AUTH=off
        request.state.context.key_name = "anonymous"
        return "anonymous"
    key = presented_key(request)
    if key is None:
        raise AuthenticationFailed(
            "missing API key: send `Authorization: Bearer KEY` or `x-api-key: KEY`"
        )
    name = keyring.name_of(key)
    if name is None:
        if key == "null":  # PaddleOCR's client with no vl_rec_api_key configured
            raise AuthenticationFailed(
                "invalid API key: the client sent 'null', which PaddleOCR's pipeline sends when "
                "vl_rec_api_key is not set; set it to a key of this server"
            )
        raise AuthenticationFailed("invalid API key")
    request.state.context.key_name = name
    return name


KeyName = Annotated[str, Depends(authenticate)]
