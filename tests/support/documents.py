"""Documents made in the test: multi-page PDFs and TIFFs, encrypted PDFs, decompression bombs;
and the full temp folder they are spooled into (an injected ENOSPC, the files left there)."""

from __future__ import annotations

import errno
import io
import struct
import zlib
from pathlib import Path
from typing import Any

from PIL import Image

from tests.support.pages import document_page


def pages(count: int, width: int = 620, height: int = 877) -> list[Image.Image]:
    """`count` distinct text pages (seeded), as Pillow images."""
    return [
        Image.open(io.BytesIO(document_page(i, width, height))).convert("RGB") for i in range(count)
    ]


def pdf(count: int, width: int = 620, height: int = 877, resolution: float = 72.0) -> bytes:
    """A `count`-page PDF (Pillow's writer); each page `width` x `height` points at 72 dpi."""
    images = pages(count, width, height)
    out = io.BytesIO()
    images[0].save(
        out, format="PDF", save_all=True, append_images=images[1:], resolution=resolution
    )
    return out.getvalue()


def tiff(count: int, width: int = 620, height: int = 877) -> bytes:
    """A `count`-frame TIFF, one page per frame."""
    images = pages(count, width, height)
    out = io.BytesIO()
    images[0].save(
        out, format="TIFF", save_all=True, append_images=images[1:], compression="tiff_lzw"
    )
    return out.getvalue()


def encrypted_pdf(password: str = "secret") -> bytes:  # noqa: S107 (a test document)
    """A one-page PDF that opens only with `password` (pypdf, RC4-128)."""
    from pypdf import PdfReader, PdfWriter  # noqa: PLC0415 (tests of encryption only)

    writer = PdfWriter()
    for page in PdfReader(io.BytesIO(pdf(1))).pages:
        writer.add_page(page)
    writer.encrypt(user_password=password, owner_password=password, algorithm="RC4-128")
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_bomb(width: int = 100_000, height: int = 100_000) -> bytes:
    """A PNG whose header claims `width` x `height` (40 GB decoded) in a few hundred bytes: a few
    rows of data that inflate without end (the file is small, decoding it is not)."""
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB
    rows = zlib.compress(b"\x00" * (width * 3 + 1) * 4, 9)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _chunk(b"IHDR", header)
        + _chunk(b"IDAT", rows)
        + _chunk(b"IEND", b"")
    )


def pdf_page_of(width_points: float, height_points: float) -> bytes:
    """A one-page PDF whose page box is `width_points` x `height_points` (a rendering bomb when
    large: pdfium would allocate width x height x 4 bytes at the requested dpi)."""
    image = Image.new("RGB", (10, 10), "white")
    out = io.BytesIO()
    # resolution scales the page box: 10 px at `r` dpi = 10 * 72 / r points
    image.save(out, format="PDF", resolution=10 * 72 / width_points)
    data = out.getvalue()
    box = f"/MediaBox [0 0 {width_points:g} {height_points:g}]".encode()
    start = data.index(b"/MediaBox")
    end = data.index(b"]", start) + 1
    return data[:start] + box + data[end:]


def rotated_jpeg(width: int = 300, height: int = 200, orientation: int = 6) -> bytes:
    """A landscape JPEG tagged with EXIF `orientation` (6: shown rotated 90° clockwise)."""
    image = Image.new("RGB", (width, height), "white")
    image.paste((0, 0, 0), (0, 0, 30, 30))  # a black corner to follow the rotation
    exif = Image.Exif()
    exif[0x0112] = orientation
    out = io.BytesIO()
    image.save(out, format="JPEG", exif=exif, quality=95)
    return out.getvalue()


def transparent_png(width: int = 100, height: int = 100) -> bytes:
    """A fully transparent RGBA PNG (shown on white, not black)."""
    out = io.BytesIO()
    Image.new("RGBA", (width, height), (0, 0, 0, 0)).save(out, format="PNG")
    return out.getvalue()


def blank_pdf(count: int) -> bytes:
    """A `count`-page PDF of tiny blank pages: many pages, few bytes."""
    images = [Image.new("L", (8, 8), 255) for _ in range(count)]
    out = io.BytesIO()
    images[0].save(out, format="PDF", save_all=True, append_images=images[1:])
    return out.getvalue()


def full(*_: Any, **__: Any) -> None:
    """A write into a full filesystem (an injected fault: a real disk cannot fill on demand)."""
    raise OSError(errno.ENOSPC, "No space left on device")


def leftovers(folder: Path) -> list[Path]:
    """Spooled document files still in the temp folder."""
    return list(folder.glob("ocrvl-upload-*"))
