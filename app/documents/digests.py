"""A page's content hash, made in the worker processes: what the results cache looks it up by.

The hash is of what the pipeline's answer is made from, so two pages with one hash get the
same answer under the same options (app/documents/cache.py adds those).
"""

from __future__ import annotations

import hashlib

from app.documents import raster, resize
from app.documents.raster import Keep, Pixels, RenderedPage, Source


def whole_page(source: Source, index: int) -> tuple[str, RenderedPage]:
    """(the content hash, the page) of a page read whole: the JPEG the model will read."""
    rendered = raster.render(source, index)
    return hashlib.sha256(rendered.url.encode()).hexdigest(), rendered


def laid_out_page(
    source: Source, index: int, with_image: bool, keep: Keep | None = None
) -> tuple[tuple[str, str | None], Pixels | None]:
    """((the content hash, the page's data URL when asked), its pixels kept) of a page read
    block by block: its pixels at full resolution, which the layout page and every crop are
    made from. Kept under `keep`, for a miss to be laid out and cut without rasterising the
    page again (a hit deletes them)."""
    page = raster.page_image(source, index)
    data = page.tobytes()
    digest = hashlib.sha256(f"{page.mode} {page.width}x{page.height}\n".encode())
    digest.update(data)
    url = resize.data_url(resize.encode(page, "JPEG")) if with_image else None
    return (digest.hexdigest(), url), Pixels.kept(page, keep, data)
