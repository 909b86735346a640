"""`/layout-parsing` and `/restructure-pages` in-process: what PaddleX's options become on the
gateway (the blocks' requests, the layout service's overrides), PaddleX's envelope on every
refusal with its status, the gateway's own limits (keys, rates, budgets, file and page caps,
the remote-file policy) on these routes, and the server serving on after each."""

from __future__ import annotations

import base64
import io
import tempfile
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from PIL import Image

from app.auth import KeyFile, KeyLimits
from app.documents import upload
from tests.conftest import CLIENT_KEY
from tests.paddlex.conftest import PAGE_BOXES, Answering, b64, gateway, page_png, services
from tests.support.documents import encrypted_pdf, full, leftovers, pdf, png_bomb
from tests.support.fake_backend import FakeVLLM
from tests.support.layout_standin import LayoutStandin, box
from tests.support.media import ImageHost
from tests.support.servers import serving

pytestmark = pytest.mark.anyio
PNG = page_png()
REFUSAL_IDS = (
    "type", "png", "pdf", "encrypted", "unknown", "base64", "empty", "junk", "file_url",
    "pages", "bomb", "label", "tokens", "missing",
)  # fmt: skip


def envelope_error(response: httpx.Response, status: int) -> str:
    """The error's message, once its status and PaddleX's envelope are checked."""
    assert response.status_code == status, response.text[:500]
    body = response.json()
    assert set(body) == {"logId", "errorCode", "errorMsg"}
    assert body["errorCode"] == status
    assert isinstance(body["errorMsg"], str)
    assert uuid.UUID(body["logId"])
    message: str = body["errorMsg"]
    return message


async def serves_on(client: httpx.AsyncClient) -> None:
    """The gateway still answers a good request after a refusal."""
    response = await client.post("/layout-parsing", json={"file": b64(PNG), "visualize": False})
    assert response.status_code == 200, response.text
    assert response.json()["errorCode"] == 0


async def test_an_image_is_read_block_by_block_and_answered_in_paddlexs_envelope() -> None:
    """One image: the envelope (`logId` the request id as a UUID, the same as X-Request-ID),
    the page's blocks read with their labels' prompts, its markdown and figure images, the
    layout drawn over the page and the page itself as base64 JPEGs, `dataInfo`."""
    with services() as (fake, layout):
        async with gateway(fake, layout) as client:
            response = await client.post("/layout-parsing", json={"file": b64(PNG)})
    assert response.status_code == 200, response.text
    body = response.json()
    assert list(body) == ["logId", "result", "errorCode", "errorMsg"]
    assert (body["errorCode"], body["errorMsg"]) == (0, "Success")
    assert uuid.UUID(body["logId"]).hex == response.headers["x-request-id"]
    [page] = body["result"]["layoutParsingResults"]
    assert body["result"]["dataInfo"] == {"width": 600, "height": 800, "type": "image"}
    blocks = page["prunedResult"]["parsing_res_list"]
    assert [b["block_label"] for b in blocks] == [b["label"] for b in PAGE_BOXES]
    assert [b["label"] for b in page["prunedResult"]["layout_det_res"]["boxes"]] == [
        b["label"] for b in PAGE_BOXES
    ]
    assert sorted(fake.prompts()) == sorted(
        ["OCR:"] * 5 + ["Table Recognition:", "Formula Recognition:"]
    )
    assert page["markdown"]["text"].startswith("# Some words\n\n## Some words\n\nSome words")
    assert set(page["markdown"]["images"]) == {
        "imgs/img_in_image_box_320_420_560_600.jpg", "imgs/img_in_chart_box_40_620_300_760.jpg",
    }  # fmt: skip
    for encoded in [*page["markdown"]["images"].values(), page["inputImage"]]:
        assert Image.open(io.BytesIO(base64.b64decode(encoded))).format == "JPEG"
    drawn = Image.open(io.BytesIO(base64.b64decode(page["outputImages"]["layout_det_res"])))
    assert drawn.size == (600, 800)


async def test_paddlexs_options_become_the_blocks_and_the_layout_services() -> None:
    """Sampling fields, `maxNewTokens` and the pixel bounds (held to OCRVL_MAX_PIXELS) go with
    every block; the layout overrides go to the layout service (a per-class dictionary by
    class id); the client's `logId` comes back."""
    options = {
        "temperature": 0.2, "topP": 0.7, "repetitionPenalty": 1.05, "maxNewTokens": 99,
        "minPixels": 40_000, "maxPixels": 5_000_000, "layoutThreshold": {"22": 0.4, "x": 0.1},
        "layoutNms": False, "layoutUnclipRatio": 1.1, "layoutMergeBboxesMode": "small",
        "layoutShapeMode": "rect", "logId": "mine-1", "visualize": False,
    }  # fmt: skip
    with services() as (fake, layout):
        async with gateway(fake, layout, max_pixels=1_003_520) as client:
            response = await client.post("/layout-parsing", json={"file": b64(PNG), **options})
    assert response.status_code == 200, response.text
    assert response.json()["logId"] == "mine-1"
    for body in fake.bodies:
        assert (body["temperature"], body["top_p"], body["repetition_penalty"]) == (0.2, 0.7, 1.05)
        assert body["max_completion_tokens"] == 99
        assert body["mm_processor_kwargs"] == {"min_pixels": 40_000, "max_pixels": 1_003_520}
    assert layout.seen[0].overrides == {
        "threshold": {"22": 0.4}, "layout_nms": False, "layout_unclip_ratio": 1.1,
        "layout_merge_bboxes_mode": "small", "layout_shape_mode": "rect",
    }  # fmt: skip
    settings = response.json()["result"]["layoutParsingResults"][0]["prunedResult"]
    assert settings["model_settings"]["return_layout_polygon_points"] is False


async def test_vlm_extra_args_set_each_prompts_pixels_and_the_sampling_fields() -> None:
    """`vlmExtraArgs` as PaddleX's pipeline reads it: `ocr_*_pixels` and `table_*_pixels` for
    those prompts' blocks (held to OCRVL_MAX_PIXELS), the document's bounds for the others,
    `temperature` and `max_new_tokens` over the request's own fields."""
    extra = {
        "ocr_min_pixels": 50_000, "ocr_max_pixels": 600_000, "table_max_pixels": 5_000_000,
        "temperature": 0.4, "max_new_tokens": 77, "use_cache": True,
    }  # fmt: skip
    with services() as (fake, layout):
        async with gateway(fake, layout) as client:
            body = {"file": b64(PNG), "temperature": 0.1, "vlmExtraArgs": extra}
            response = await client.post("/layout-parsing", json=body)
    assert response.status_code == 200, response.text
    pixels = {
        "OCR:": {"min_pixels": 50_000, "max_pixels": 600_000},
        "Table Recognition:": {"min_pixels": 112_896, "max_pixels": 1_003_520},
        "Formula Recognition:": {"min_pixels": 112_896, "max_pixels": 1_003_520},
    }
    assert set(fake.prompts()) == set(pixels)
    for sent in fake.bodies:
        prompt = sent["messages"][0]["content"][1]["text"]
        assert sent["mm_processor_kwargs"] == pixels[prompt]
        assert (sent["temperature"], sent["max_completion_tokens"]) == (0.4, 77)


async def test_ocr_for_image_blocks_reads_them_and_shows_their_text() -> None:
    """`useOcrForImageBlock`: the image block is read with `OCR:` and its text follows the
    figure in the markdown; `model_settings` says so."""
    with services() as (fake, layout):
        async with gateway(fake, layout) as client:
            body = {"file": b64(PNG), "useOcrForImageBlock": True, "visualize": False}
            response = await client.post("/layout-parsing", json=body)
    assert response.status_code == 200, response.text
    [page] = response.json()["result"]["layoutParsingResults"]
    pruned = page["prunedResult"]
    assert pruned["model_settings"]["use_ocr_for_image_block"] is True
    [image] = [b for b in pruned["parsing_res_list"] if b["block_label"] == "image"]
    assert image["block_content"] == "Some words"
    text = page["markdown"]["text"]
    assert 'img_in_image_box_320_420_560_600.jpg" alt="Image" width="40%" />\n\nSome words' in text


async def test_spotting_without_layout_gives_texts_and_polygons() -> None:
    """`promptLabel: spotting` without layout detection: the page is asked with its special
    tokens kept, enlarged as PaddleX enlarges it (600x800 -> 1200x1600, then the spotting
    bounds), and its regions come back as `spotting_res` in page pixels, texts as content."""
    with services() as (fake, layout):
        fake.answers["Spotting:"] = (
            "<|TEXT_START|>Hello<|TEXT_END|><|LOC_BEGIN|><|LOC_100|><|LOC_100|><|LOC_500|>"
            "<|LOC_100|><|LOC_500|><|LOC_200|><|LOC_100|><|LOC_200|><|LOC_END|>"
        )
        async with gateway(fake, layout) as client:
            body = {"file": b64(PNG), "useLayoutDetection": False, "promptLabel": "spotting"}
            response = await client.post("/layout-parsing", json=body)
    assert response.status_code == 200, response.text
    [sent] = fake.bodies
    assert sent["skip_special_tokens"] is False
    assert sent["mm_processor_kwargs"] == {"min_pixels": 112_896, "max_pixels": 1_003_520}
    url = sent["messages"][0]["content"][0]["image_url"]["url"]
    with Image.open(io.BytesIO(base64.b64decode(url.partition(",")[2]))) as image:
        assert image.size == (840, 1148)  # 1200x1600 within 1,003,520 pixels
    pruned = response.json()["result"]["layoutParsingResults"][0]["prunedResult"]
    assert pruned["spotting_res"] == {
        "rec_polys": [[[60.0, 80.0], [300.0, 80.0], [300.0, 160.0], [60.0, 160.0]]],
        "rec_texts": ["Hello"],
    }
    assert pruned["parsing_res_list"][0]["block_content"] == "Hello"


async def test_without_layout_detection_each_page_is_one_block_of_the_prompt_label() -> None:
    """`useLayoutDetection: false` reads each page whole with `promptLabel`'s prompt, no layout
    call: one block covering the page, a table's answer as HTML, no layout boxes or drawing."""
    with services() as (fake, layout):
        async with gateway(fake, layout) as client:
            body = {"file": b64(pdf(2)), "useLayoutDetection": False, "promptLabel": "table"}
            response = await client.post("/layout-parsing", json=body)
    assert response.status_code == 200, response.text
    assert fake.prompts() == ["Table Recognition:"] * 2
    assert layout.seen == []
    pages = response.json()["result"]["layoutParsingResults"]
    for page in pages:
        [block] = page["prunedResult"]["parsing_res_list"]
        assert block["block_label"] == "table"
        assert block["block_bbox"] == [0, 0, 1240, 1754]
        assert block["block_content"].startswith("<table><tr><td>a</td>")
        assert "layout_det_res" not in page["prunedResult"]
        assert page["outputImages"] == {}
        assert page["markdown"]["images"] == {}


async def test_a_pdf_counts_its_pages_under_the_keys_usage_and_restructures() -> None:
    """A 3-page PDF: 3 results, `dataInfo` of a PDF, the key's usage 3 pages (not blocks);
    `restructurePages` numbers blocks across the document (`global_block_id`)."""
    with services() as (fake, layout):
        async with gateway(fake, layout) as client:
            body = {"file": b64(pdf(3)), "restructurePages": True, "visualize": False}
            response = await client.post("/layout-parsing", json=body)
            usage = (await client.get("/v1/usage")).json()["total"]
    assert response.status_code == 200, response.text
    result = response.json()["result"]
    assert result["dataInfo"]["numPages"] == 3
    pages = [r["prunedResult"]["parsing_res_list"] for r in result["layoutParsingResults"]]
    assert [b["global_block_id"] for page in pages for b in page] == list(range(27))
    assert usage["pages"] == 3


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("useDocOrientationClassify", "sideways"),
        ("useDocUnwarping", [1]),
        ("outputFormats", ["docx"]),
        ("vlmExtraArgs", {"ocr_min_pixels": "many"}),
        ("vlmExtraArgs", {"top_k": 5}),
        ("vlmExtraArgs", {"top_p": 0}),
        ("useOcrForImageBlock", "maybe"),
        ("fileType", 3),
        ("topP", 2),
    ],
)
async def test_an_option_not_run_or_malformed_is_refused_naming_it(field: str, value: Any) -> None:
    """Each is a 422 in PaddleX's envelope whose message names the field; nothing is read."""
    with services() as (fake, layout):
        async with gateway(fake, layout) as client:
            body = {"file": b64(PNG), field: value}
            message = envelope_error(await client.post("/layout-parsing", json=body), 422)
            assert f"`{field}" in message
            assert fake.bodies == []
            await serves_on(client)


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"file": b64(PNG), "fileType": 0}, "fileType"),
        ({"file": b64(b"\x89PNG\r\n\x1a\n" + b"\x00" * 64)}, "corrupt_file"),
        ({"file": b64(b"%PDF-1.4 not really")}, "corrupt_file"),
        ({"file": b64(encrypted_pdf())}, "encrypted_pdf"),
        ({"file": b64(b"hello")}, "unsupported_file"),
        ({"file": "abc"}, "invalid_value"),
        ({"file": ""}, "empty_file"),
        ({"file": "!!!"}, "neither valid base64"),  # the lenient decoder skips it all
        ({"file": "file:///etc/passwd"}, "a file: URL, which the server does not fetch"),
        ({"file": b64(pdf(3))}, "too_many_pages"),
        ({"file": b64(png_bomb())}, "image_too_large"),
        ({"file": b64(PNG), "promptLabel": "spot"}, "promptLabel"),
        ({"file": b64(PNG), "maxNewTokens": 100_000}, "maxNewTokens"),
        ({"fileType": 1}, "file"),
    ],
    ids=REFUSAL_IDS,
)
async def test_a_file_or_request_the_server_cannot_take_is_a_422(
    body: dict[str, Any], code: str
) -> None:
    """Wrong `fileType`, a corrupt, encrypted, unknown or undecodable file, more pages than
    OCRVL_MAX_PAGES, a bomb, `maxNewTokens` over the model's length: 422, the reason named."""
    with services() as (fake, layout):
        async with gateway(fake, layout, max_pages=2) as client:
            message = envelope_error(await client.post("/layout-parsing", json=body), 422)
            assert code in message
            await serves_on(client)


async def test_a_file_over_the_cap_and_a_body_that_is_no_json_are_refused() -> None:
    """A file over OCRVL_MAX_FILE_BYTES: 413; a body that is not JSON or is multipart: 422."""
    with services() as (fake, layout):
        async with gateway(fake, layout, max_file_bytes=len(PNG) - 1) as client:
            big = await client.post("/layout-parsing", json={"file": b64(PNG)})
            assert "OCRVL_MAX_FILE_BYTES" in envelope_error(big, 413)
            raw = await client.post("/layout-parsing", content=b"{nope")
            assert "not valid JSON" in envelope_error(raw, 422)
            form = await client.post("/layout-parsing", files={"file": ("a.png", PNG)})
            assert "JSON" in envelope_error(form, 422)


async def test_keys_are_required_and_rates_limited_in_the_envelope(tmp_path: Path) -> None:
    """No key or a wrong one: 401; a key over its requests per minute: 429 with Retry-After
    and its x-ratelimit headers; another key's budget spent: 429 insufficient_quota (its
    Retry-After the budget's reset) while this key is still served."""
    keys = tmp_path / "keys.json"
    spent = KeyFile(keys).create("spent", KeyLimits(pages_per_day=1))
    slow = KeyFile(keys).create("slow", KeyLimits(rpm=1))
    with services() as (fake, layout):
        async with gateway(fake, layout, api_keys_file=keys) as client:
            assert "API key" in envelope_error(
                await client.post("/layout-parsing", json={}, headers={"authorization": ""}), 401
            )
            wrong = {"authorization": "Bearer sk-wrong"}
            envelope_error(await client.post("/restructure-pages", json={}, headers=wrong), 401)
            as_spent = {"authorization": f"Bearer {spent}", "x-request-id": "budget"}
            two = {"file": b64(pdf(2)), "visualize": False}
            refused = await client.post("/layout-parsing", json=two, headers=as_spent)
            assert "insufficient_quota" in envelope_error(refused, 429)
            assert int(refused.headers["retry-after"]) > 0
            as_slow = {"authorization": f"Bearer {slow}"}
            await client.post("/layout-parsing", json={"file": "!"}, headers=as_slow)
            limited = await client.post("/layout-parsing", json={"file": "!"}, headers=as_slow)
            assert "rate_limit_exceeded" in envelope_error(limited, 429)
            assert "retry-after" in limited.headers
            assert "x-ratelimit-limit-requests" in limited.headers
            await serves_on(client)


async def test_a_url_goes_through_the_remote_file_policy() -> None:
    """An http(s) `file` is refused while OCRVL_MEDIA_FETCH is off, and fetched under its
    rules when it is on."""
    with services() as (fake, layout), serving(ImageHost()) as host:
        async with gateway(fake, layout) as client:
            refused = await client.post("/layout-parsing", json={"file": f"{host.url}/page.png"})
            assert "remote_media_refused" in envelope_error(refused, 422)
        async with gateway(fake, layout, media_fetch="on", media_allow_loopback=True) as client:
            body = {"file": f"{host.url}/page.png", "visualize": False}
            fetched = await client.post("/layout-parsing", json=body)
    assert fetched.status_code == 200, fetched.text
    assert [r["path"] for r in host.requests] == ["/page.png"]


async def test_layout_service_missing_down_or_a_failing_block_fail_the_document() -> None:
    """No layout service configured: 422 saying so (`useLayoutDetection: false` still works);
    one that is not ready: 503 with Retry-After; a page whose one block the backend fails: the
    backend's error; one block of several failed: 502 naming it (PaddleX answers a document
    whole or not at all)."""
    with services() as (fake, layout):
        async with gateway(fake, None) as client:
            missing = await client.post("/layout-parsing", json={"file": b64(PNG)})
            assert "layout_not_configured" in envelope_error(missing, 422)
            whole = {"file": b64(PNG), "useLayoutDetection": False, "visualize": False}
            assert (await client.post("/layout-parsing", json=whole)).status_code == 200
        layout.ready = False
        async with gateway(fake, layout) as client:
            down = await client.post("/layout-parsing", json={"file": b64(PNG)})
            assert "layout_unavailable" in envelope_error(down, 503)
            assert "retry-after" in down.headers
    boxes = LayoutStandin(boxes=lambda width, height, n: [box("text", 10, 10, 300, 100)])
    with serving(FakeVLLM(mode="status")) as failing, serving(boxes) as layout:
        async with gateway(failing, layout) as client:
            failed = await client.post("/layout-parsing", json={"file": b64(PNG)})
            assert "boom" in envelope_error(failed, 500)
    with services() as (fake, layout):
        fake.failing.add("Table Recognition:")
        async with gateway(fake, layout) as client:
            failed = await client.post("/layout-parsing", json={"file": b64(PNG)})
            assert "page 1, block 4 (table) failed: boom" in envelope_error(failed, 502)


async def test_restructure_pages_refuses_what_it_cannot_restructure() -> None:
    """A page without its settings, `outputFormats`, more pages than OCRVL_MAX_PAGES: 422
    naming the field; the route still answers after each."""
    with serving(Answering()) as fake:
        async with gateway(fake, None, max_pages=2) as client:
            bare = {"pages": [{"prunedResult": {"width": 10}}]}
            message = envelope_error(await client.post("/restructure-pages", json=bare), 422)
            assert "`pages[0].prunedResult.page_count`" in message
            exports = {"pages": [], "outputFormats": ["docx"]}
            envelope_error(await client.post("/restructure-pages", json=exports), 422)
            many = {"pages": [{"prunedResult": {}}] * 3}
            assert "too_many_pages" in envelope_error(
                await client.post("/restructure-pages", json=many), 422
            )
            fine = await client.post("/restructure-pages", json={"pages": []})
    assert fine.json()["result"] == {"layoutParsingResults": []}


async def test_client_key_header_is_the_gateways_own() -> None:
    """The routes take the gateway's keys as every route does (Bearer or x-api-key)."""
    with services() as (fake, layout):
        async with gateway(fake, layout) as client:
            headers = {"authorization": "", "x-api-key": CLIENT_KEY}
            body = {"file": b64(PNG), "visualize": False}
            response = await client.post("/layout-parsing", json=body, headers=headers)
    assert response.status_code == 200, response.text


async def test_the_clients_log_id_comes_back_on_errors_too() -> None:
    """A body with `logId` that is refused still answers that `logId` (PaddleX's
    `_try_get_log_id`)."""
    with serving(Answering()) as fake:
        async with gateway(fake, None) as client:
            body = {"file": b64(PNG), "fileType": 3, "logId": "trace-7"}
            response = await client.post("/layout-parsing", json=body)
    assert response.status_code == 422
    assert response.json()["logId"] == "trace-7"


@pytest.mark.parametrize("where", ["write", "create"])
async def test_a_full_temp_folder_is_a_503_in_the_envelope_and_leaves_no_file(
    where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The spooled copy for the page workers cannot be written (ENOSPC on its write) or not
    even created (ENOSPC on mkstemp: no inode left): 503 with Retry-After in PaddleX's envelope,
    no file left in the temp folder, nothing sent to the backend, and the next file is read.
    A real disk cannot fill up on demand here: the call that would fail raises (an injected
    fault), as in tests/documents/test_spool.py."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with services() as (fake, layout):
        async with gateway(fake, layout) as client:
            with monkeypatch.context() as patch:
                if where == "write":
                    patch.setattr(upload.os, "fdopen", full)
                else:
                    patch.setattr(upload.tempfile, "mkstemp", full)
                refused = await client.post("/layout-parsing", json={"file": b64(PNG)})
            assert "temp folder is full" in envelope_error(refused, 503)
            assert refused.headers["retry-after"] == "5"
            assert not leftovers(tmp_path)
            assert fake.bodies == []
            await serves_on(client)


def turned_png(angle: int) -> bytes:
    """PNG's page as a scanner turned it: clockwise by `angle` (the service turns it back)."""
    with Image.open(io.BytesIO(PNG)) as page:
        turned = page.rotate(-angle, expand=True) if angle else page.copy()
    out = io.BytesIO()
    turned.save(out, format="PNG")
    return out.getvalue()


@pytest.mark.parametrize("angle", [90, 180, 270])
async def test_a_turned_page_reads_as_the_upright_one(angle: int) -> None:
    """`useDocOrientationClassify` on a page turned by `angle`: the layout service (a stand-in
    keeping the contract) finds `angle` and sends the upright page back; the blocks and the
    markdown equal the upright page's, the page measures the upright size, and the answer
    carries PaddleX's `doc_preprocessor_res` and its `preprocessed_img`."""
    with services(angle=angle) as (fake, layout):
        async with gateway(fake, layout) as client:
            plain = {"file": b64(PNG), "visualize": False}
            upright = (await client.post("/layout-parsing", json=plain)).json()["result"]
            body = {"file": b64(turned_png(angle)), "useDocOrientationClassify": True}
            response = await client.post("/layout-parsing", json=body)
    assert response.status_code == 200, response.text
    assert layout.seen[-1].overrides["orientation"] is True
    assert layout.seen[-1].overrides["unwarp"] is True  # PaddleX's default beside orientation
    [page] = response.json()["result"]["layoutParsingResults"]
    [want] = upright["layoutParsingResults"]
    pruned = page["prunedResult"]
    assert pruned["doc_preprocessor_res"] == {
        "model_settings": {"use_doc_orientation_classify": True, "use_doc_unwarping": True},
        "angle": angle,
    }
    assert pruned["model_settings"]["use_doc_preprocessor"] is True
    assert (pruned["width"], pruned["height"]) == (600, 800)
    assert pruned["parsing_res_list"] == want["prunedResult"]["parsing_res_list"]
    assert page["markdown"]["text"] == want["markdown"]["text"]
    assert set(page["outputImages"]) == {"layout_det_res", "preprocessed_img"}


async def test_unwarping_alone_has_no_angle_and_a_layout_less_read_refuses_it() -> None:
    """`useDocUnwarping` with `useDocOrientationClassify: false`: `angle` -1 as PaddleX reports
    an unclassified page (sent alone, PaddleX's preprocessor classifies too, as here); with
    `useLayoutDetection: false` it cannot apply here: 422 naming it."""
    with services() as (fake, layout):
        async with gateway(fake, layout) as client:
            alone = {"file": b64(PNG), "useDocUnwarping": True, "visualize": False}
            both = (await client.post("/layout-parsing", json=alone)).json()["result"]
            body = {**alone, "useDocOrientationClassify": False}
            response = await client.post("/layout-parsing", json=body)
            refused = await client.post(
                "/layout-parsing", json={**body, "useLayoutDetection": False}
            )
    assert response.status_code == 200, response.text
    pruned = response.json()["result"]["layoutParsingResults"][0]["prunedResult"]
    assert pruned["doc_preprocessor_res"] == {
        "model_settings": {"use_doc_orientation_classify": False, "use_doc_unwarping": True},
        "angle": -1,
    }
    steps = both["layoutParsingResults"][0]["prunedResult"]["doc_preprocessor_res"]
    assert steps["model_settings"]["use_doc_orientation_classify"] is True
    assert "`useDocUnwarping`" in envelope_error(refused, 422)


async def test_a_layout_service_without_the_model_is_not_available_here() -> None:
    """The layout service answers 400 `model_not_loaded`: the request is a 422 saying the
    option is not available on this deployment, never a 5xx."""
    with services(mode="status", status=400) as (fake, layout):
        layout.error_code = "model_not_loaded"
        async with gateway(fake, layout) as client:
            body = {"file": b64(PNG), "useDocOrientationClassify": True}
            message = envelope_error(await client.post("/layout-parsing", json=body), 422)
    assert "not available on this deployment" in message
