"""`GET /ui`: a page to try documents on (docs/ui.md), static files from app/ui/, no key needed.

The page's own code calls `/v1/ocr` with the key the user types; the gateway only hands out
three fixed files. Every one goes with a Content-Security-Policy that lets the page load
nothing but these files and talk to nothing but this origin, so even a mistake in the page's
rendering of model text could not load or run anything else.
"""

from __future__ import annotations

import functools
from importlib import resources

from fastapi import APIRouter
from starlette.responses import Response

from app.errors import NotFound
from app.settings import Settings

# data: and blob: images: the page images /v1/ocr returns and the file the user picked
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self' blob: data:; object-src 'none'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'"
)
HEADERS = {
    "content-security-policy": CSP,
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-cache",  # a new gateway version brings its own page at once
}
ASSETS = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",  # ES modules: the page, its pages, its renderer
    "pages.js": "text/javascript; charset=utf-8",
    "layout.js": "text/javascript; charset=utf-8",  # a page's blocks over its image
    "render.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
}


@functools.cache
def _read(name: str) -> bytes:
    """One of the page's files, from the package (app/ui/ is package data); read once."""
    return (resources.files("app") / "ui" / name).read_bytes()


def _asset(name: str) -> Response:
    return Response(_read(name), media_type=ASSETS[name], headers=HEADERS)


router = APIRouter(include_in_schema=False)


@router.get("/ui")
async def page() -> Response:
    """The page itself."""
    return _asset("index.html")


@router.get("/ui/{name}")
async def asset(name: str) -> Response:
    """One of the page's scripts or its styles; any other name is a 404."""
    if name not in ASSETS or name == "index.html":
        raise NotFound(f"no file {name[:64]!r} in /ui", param="name", code="not_found")
    return _asset(name)


def routers(settings: Settings) -> tuple[APIRouter, ...]:
    """The page's router, or none with OCRVL_UI=off (then /ui is a plain 404)."""
    return (router,) if settings.ui == "on" else ()
