"""Certificates for https:// test servers, made by the openssl command (.ci/run installs it)."""

from __future__ import annotations

import ssl
import subprocess
from pathlib import Path


def self_signed(folder: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key in `folder`: a server's certificate
    that is its own CA, as a private CA's would be (certifi's CAs do not verify it)."""
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


def server_context(certificate: tuple[Path, Path]) -> ssl.SSLContext:
    """The TLS context of a server presenting `certificate`."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(*certificate)
    return context
