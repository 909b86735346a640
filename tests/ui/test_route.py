"""`GET /ui` in-process: the page and its assets, their CSP, OCRVL_UI=off; `page_images`."""

from __future__ import annotations

import base64
import io
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from PIL import Image

from app.main import create_app
from app.routes.ui import CSP
from tests.conftest import CLIENT_KEY, settings_for
from tests.support.documents import pdf
from tests.support.fake_backend import FakeVLLM
from tests.support.servers import lifespan_client

pytestmark = pytest.mark.anyio
UI = Path(__file__).resolve().parents[2] / "app" / "ui"
AUTH = {"authorization": f"Bearer {CLIENT_KEY}"}


@pytest.mark.parametrize(
    ("path", "media_type", "file"),
    [
        ("/ui", "text/html", "index.html"),
        ("/ui/app.js", "text/javascript", "app.js"),
        ("/ui/pages.js", "text/javascript", "pages.js"),
        ("/ui/layout.js", "text/javascript", "layout.js"),
        ("/ui/render.js", "text/javascript", "render.js"),
        ("/ui/style.css", "text/css", "style.css"),
    ],
)
async def test_the_page_and_its_assets_come_with_their_type_and_the_csp(
    fake: FakeVLLM, tmp_path: Path, path: str, media_type: str, file: str
) -> None:
    """Each file: 200 without a key, its own bytes, its content type, the strict CSP, nosniff."""
    async with lifespan_client(create_app(settings_for(fake.url, data_dir=tmp_path))) as client:
        response = await client.get(path)
    assert response.status_code == 200
    assert response.content == (UI / file).read_bytes()
    assert response.headers["content-type"] == f"{media_type}; charset=utf-8"
    assert response.headers["content-security-policy"] == CSP
    assert response.headers["x-content-type-options"] == "nosniff"


def test_the_csp_allows_no_inline_code_and_nothing_from_elsewhere() -> None:
    """Scripts, styles and requests only from the gateway; no plugins, framing, base or forms."""
    directives = dict(part.strip().split(" ", 1) for part in CSP.split(";"))
    assert directives["default-src"] == "'none'"
    for name in ("script-src", "style-src", "connect-src"):
        assert directives[name] == "'self'"
    assert directives["img-src"] == "'self' blob: data:"
    for name in ("object-src", "base-uri", "form-action", "frame-ancestors"):
        assert directives[name] == "'none'"
    assert "unsafe" not in CSP


def test_the_page_has_no_inline_script_style_or_remote_url() -> None:
    """index.html loads only /ui files: no <script> body, no style attribute, no http(s) URL."""
    page = (UI / "index.html").read_text()
    scripts = re.findall(r"<script([^>]*)>(.*?)</script>", page, re.DOTALL)
    assert scripts == [(' type="module" src="/ui/app.js"', "")]
    assert "style=" not in page
    assert re.search(r"\bon[a-z]+=", page) is None
    for file in UI.iterdir():
        text = file.read_text()
        assert (
            re.search(r"(src|href)=\"?https?:|@import|url\(|//[a-z0-9.-]+\.[a-z]{2,}/", text)
            is None
        )
        for sink in ("innerHTML", "outerHTML =", "insertAdjacentHTML", "document.write", "eval("):
            assert sink not in text, (file.name, sink)
        assert "DOMParser" not in text  # model HTML never meets a browser parser


async def test_an_unknown_asset_is_a_404(fake: FakeVLLM, tmp_path: Path) -> None:
    """Only the page's own files are served: another name (or a path out of app/ui) is a 404."""
    async with lifespan_client(create_app(settings_for(fake.url, data_dir=tmp_path))) as client:
        for path in ("/ui/index.html", "/ui/settings.py", "/ui/..%2Fsettings.py", "/ui/x/app.js"):
            response = await client.get(path)
            assert response.status_code == 404, path


async def test_ocrvl_ui_off_removes_the_page(fake: FakeVLLM, tmp_path: Path) -> None:
    """OCRVL_UI=off: /ui and its assets are 404; the API still answers."""
    async with lifespan_client(
        create_app(settings_for(fake.url, ui="off", data_dir=tmp_path))
    ) as client:
        statuses = [(await client.get(path)).status_code for path in ("/ui", "/ui/app.js")]
        health = await client.get("/health")
    assert statuses == [404, 404]
    assert health.status_code == 200


def jpeg_size(data_url: str) -> tuple[int, int]:
    """The pixel size of a data:image/jpeg;base64 URL."""
    head, _, data = data_url.partition(",")
    assert head == "data:image/jpeg;base64"
    return Image.open(io.BytesIO(base64.b64decode(data))).size  # type: ignore[no-any-return]


async def test_page_images_puts_the_image_the_model_read_on_each_page(
    fake: FakeVLLM, tmp_path: Path
) -> None:
    """page_images=true: each page carries `image`, the very data URL the backend was sent."""
    app = create_app(settings_for(fake.url, preprocess_workers=1, data_dir=tmp_path))
    async with lifespan_client(app, headers=AUTH, timeout=60) as client:
        response = await client.post(
            "/v1/ocr", files={"file": ("doc.pdf", pdf(2))}, data={"page_images": "true"}
        )
    assert response.status_code == 200, response.text
    pages = response.json()["pages"]
    sent = [body["messages"][0]["content"][0]["image_url"]["url"] for body in fake.bodies]
    assert sorted(page["image"] for page in pages) == sorted(sent)
    for page in pages:
        width, height = jpeg_size(page["image"])
        assert width % 28 == 0
        assert height % 28 == 0


async def test_without_page_images_no_page_carries_an_image(fake: FakeVLLM, tmp_path: Path) -> None:
    """The default answer has no `image` on any page (the stream stays small)."""
    app = create_app(settings_for(fake.url, preprocess_workers=1, data_dir=tmp_path))
    async with lifespan_client(app, headers=AUTH, timeout=60) as client:
        response = await client.post(
            "/v1/ocr",
            files={"file": ("doc.pdf", pdf(2))},
            headers={"accept": "application/x-ndjson"},
        )
    assert response.status_code == 200
    assert '"image"' not in response.text
    assert response.text.count('"object":"ocr.page"') == 2


async def test_page_images_must_be_a_boolean(fake: FakeVLLM, tmp_path: Path) -> None:
    """page_images=maybe: 400 naming the field."""
    app = create_app(settings_for(fake.url, preprocess_workers=1, data_dir=tmp_path))
    async with lifespan_client(app, headers=AUTH, timeout=60) as client:
        response = await client.post(
            "/v1/ocr", files={"file": ("doc.pdf", pdf(1))}, data={"page_images": "maybe"}
        )
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "page_images"


def test_the_wheel_ships_the_page(tmp_path: Path) -> None:
    """A wheel built from the project (a copy, so the tree stays clean) holds app/ui's files."""
    root = UI.parents[1]
    source = tmp_path / "source"
    shutil.copytree(root / "app", source / "app", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(root / name, source / name)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "--no-index", str(source), "-w", str(tmp_path / "wheel")],
        check=True, capture_output=True, timeout=240,
    )  # fmt: skip
    (wheel,) = (tmp_path / "wheel").glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        shipped = {name for name in archive.namelist() if name.startswith("app/ui/")}
    assert shipped == {f"app/ui/{file.name}" for file in UI.iterdir()}
    assert len(shipped) == 6
