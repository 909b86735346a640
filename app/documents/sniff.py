"""What an uploaded file is, from its first bytes: no decoding, cheap enough for the event loop."""

from __future__ import annotations

from dataclasses import dataclass

from app.documents.errors import DocumentError

SUPPORTED = "PNG, JPEG, WebP, TIFF (multi-page too), BMP or PDF"


@dataclass(frozen=True, slots=True)
class FileKind:
    """A supported file type: `pdf` or an image format Pillow is allowed to open."""

    name: str  # Pillow's format name, or "PDF"
    mime: str

    @property
    def is_pdf(self) -> bool:
        """Rasterised with pypdfium2 rather than decoded with Pillow."""
        return self.name == "PDF"


PDF = FileKind("PDF", "application/pdf")
PNG = FileKind("PNG", "image/png")
JPEG = FileKind("JPEG", "image/jpeg")
WEBP = FileKind("WEBP", "image/webp")
TIFF = FileKind("TIFF", "image/tiff")
BMP = FileKind("BMP", "image/bmp")


def sniff(head: bytes) -> FileKind:
    """The kind of file that starts with `head`; DocumentError for anything else."""
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return PNG
    if head.startswith(b"\xff\xd8\xff"):
        return JPEG
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return WEBP
    if head[:4] in (b"II*\x00", b"MM\x00*"):
        return TIFF
    if head.startswith(b"BM"):
        return BMP
    # PDF readers accept the header anywhere in the first KiB
    if b"%PDF-" in head[:1024]:
        return PDF
    if not head:
        raise DocumentError("`file` is empty: send an image or a PDF", "empty_file")
    raise DocumentError(
        f"`file` is not a supported document: send {SUPPORTED} (the first bytes were {head[:8]!r})",
        "unsupported_file",
    )
