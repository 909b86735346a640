"""One validation path for images: what the model cannot take (over 200:1, too many pixels, no
image at all) is refused by the gateway, from the image's header, with the same code and the same
words on chat, /v1/ocr, jobs (at submission) and batches, and never reaches the engine.

FakeVLLM stands in for the engine: it records every request that reached it.
"""

from __future__ import annotations

import base64
import io
import tracemalloc
from typing import Any

import httpx
import pytest
from PIL import Image

from app.images import ChatImages
from app.main import create_app
from tests.batches.test_api import ENDED, batch_of, jsonl, lines_of, until
from tests.conftest import CLIENT_KEY, settings_for
from tests.support.documents import png_bomb
from tests.support.fake_backend import FakeVLLM
from tests.support.pages import chat_body, data_url
from tests.support.servers import lifespan_client

pytestmark = pytest.mark.anyio
AUTH = {"authorization": f"Bearer {CLIENT_KEY}"}


def png(width: int, height: int, info: bytes = b"") -> bytes:
    """A white PNG of that size (with a text chunk of `info` before its pixels)."""
    out = io.BytesIO()
    image = Image.new("RGB", (width, height), "white")
    if info:
        from PIL import PngImagePlugin  # noqa: PLC0415

        meta = PngImagePlugin.PngInfo()
        meta.add_text("comment", info.decode())
        image.save(out, format="PNG", pnginfo=meta)
    else:
        image.save(out, format="PNG")
    return out.getvalue()


def jpeg_with_exif(width: int, height: int, exif_bytes: int) -> bytes:
    """A JPEG whose size (its SOF marker) comes after `exif_bytes` of EXIF: a header further in."""
    image = Image.new("RGB", (width, height), "white")
    exif = Image.Exif()
    exif[0x010E] = "x" * exif_bytes  # ImageDescription
    out = io.BytesIO()
    image.save(out, format="JPEG", exif=exif.tobytes())
    return out.getvalue()


WIDE = png(10_000, 28)
CASES = {  # what the client sends → the code every route answers
    "aspect_ratio": WIDE,
    "image_too_large": png_bomb(9000, 9000),  # the header claims 81 MP, over the 60 MP cap
}


def words(message: str) -> str:
    """A refusal's words after the name of what was refused (`page 1`, or the chat field)."""
    return message.split(" is ", 1)[1]


@pytest.fixture
async def client(fake: FakeVLLM) -> Any:
    """The gateway in front of `fake`."""
    settings = settings_for(fake.url, preprocess_workers=1)
    async with lifespan_client(create_app(settings), headers=AUTH, timeout=60) as client:
        yield client


@pytest.mark.parametrize("code", list(CASES))
async def test_every_route_refuses_the_same_image_the_same_way(
    client: httpx.AsyncClient, fake: FakeVLLM, code: str
) -> None:
    """Chat, /v1/ocr, a job (at submission: never a 202) and a batch line: 400 with one code
    and the same words; nothing reaches the engine."""
    image = CASES[code]
    chat = await client.post("/v1/chat/completions", json=chat_body(image, model=fake.served))
    ocr = await client.post("/v1/ocr", files={"file": ("page.png", image)})
    job = await client.post("/v1/ocr/jobs", files={"file": ("page.png", image)})
    errors = [answer.json()["error"] for answer in (chat, ocr, job)]
    assert [answer.status_code for answer in (chat, ocr, job)] == [400, 400, 400], errors
    assert [error["code"] for error in errors] == [code] * 3
    assert errors[0]["param"] == "messages[0].content[0].image_url"
    assert errors[0]["message"].startswith("messages[0].content[0].image_url is ")
    assert errors[1]["message"].startswith("page 1 is ")
    assert words(errors[0]["message"]) == words(errors[1]["message"]) == words(errors[2]["message"])
    line = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
            "body": chat_body(image, model="PaddleOCR-VL", max_tokens=4)}  # fmt: skip
    batch = await until(client, (await batch_of(client, jsonl(line)))["id"], ENDED)
    [entry] = await lines_of(client, batch["error_file_id"])
    assert entry["response"]["status_code"] == 400
    assert entry["response"]["body"]["error"] == errors[0]
    assert fake.bodies == []


@pytest.mark.parametrize(
    ("url", "code"),
    [
        ("data:image/png;base64," + base64.b64encode(b"not an image at all" * 10).decode(),
         "invalid_image"),
        ("data:image/png," + "%89PNG", "invalid_image"),
        (data_url(b"\x89PNG\r\n\x1a\n" + b"\x00" * 40, "image/png"), "invalid_image"),
        (data_url(png(1, 300), "image/png"), "aspect_ratio"),  # 28 x 8400 once lifted: 300:1
    ],
)  # fmt: skip
async def test_chat_refuses_what_no_model_could_read(
    client: httpx.AsyncClient, fake: FakeVLLM, url: str, code: str
) -> None:
    """An inline image that is no image, not base64, or too narrow once its short side is
    lifted to 28 pixels (vLLM's rule): 400 from the gateway, nothing sent."""
    body = chat_body(b"", model=fake.served)
    body["messages"][0]["content"][0]["image_url"]["url"] = url
    answer = await client.post("/v1/chat/completions", json=body)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["code"] == code
    assert "<" not in answer.json()["error"]["message"]  # no object reprs
    assert fake.bodies == []


@pytest.mark.parametrize(
    "image",
    [png(1, 1), png(28, 5600), png(200, 100, info=b"x" * 20_000), jpeg_with_exif(64, 32, 60_000)],
)
async def test_images_the_model_takes_pass(
    client: httpx.AsyncClient, fake: FakeVLLM, image: bytes
) -> None:
    """A 1x1 image (lifted to 28x28), exactly 200:1, a PNG with a 20 KB chunk before its
    pixels and a JPEG whose size comes after 60 KB of EXIF: all reach the engine."""
    mime = "image/jpeg" if image.startswith(b"\xff\xd8") else "image/png"
    body = chat_body(b"", model=fake.served)
    body["messages"][0]["content"][0]["image_url"]["url"] = data_url(image, mime)
    answer = await client.post("/v1/chat/completions", json=body)
    assert answer.status_code == 200, answer.text
    assert len(fake.bodies) == 1


def test_the_check_reads_the_header_not_the_image() -> None:
    """A 4 MB inline image is checked from the start of its base64: the check allocates a few
    KiB at its peak (tracemalloc), never a copy or a decoding of the image, which is what keeps
    it cheap on chat's path (its cost: bench/overhead)."""
    from app.chat import parse  # noqa: PLC0415

    image = png(300, 200) + bytes(3_000_000)  # trailing bytes past IEND: a 4 MB data URL
    chat = parse(httpx.Request("POST", "/", json=chat_body(image)).read())
    images = ChatImages(settings_for("http://127.0.0.1:9"), workers=None)  # type: ignore[arg-type]
    images.check(chat)  # Pillow's plugins load on first use: not counted below
    tracemalloc.start()
    try:
        images.check(chat)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 256 * 1024, f"the check allocated {peak} bytes at its peak"
