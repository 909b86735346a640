"""The Batch API in-process, in front of FakeVLLM (to hang lines on demand and see them aborted):
every refusal's status and error, a batch's lifecycle, and that ids are the key's own."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from app.main import create_app
from tests.conftest import CLIENT_KEY, settings_for
from tests.support.fake_backend import FakeVLLM
from tests.support.prometheus import metric
from tests.support.servers import lifespan_client

pytestmark = pytest.mark.anyio
OTHER_KEY = "sk-test-other-key"
OTHER = {"authorization": f"Bearer {OTHER_KEY}"}
CHAT = "/v1/chat/completions"
ENDED = ("completed", "failed", "expired", "cancelled")


@contextlib.asynccontextmanager
async def gateway(fake: FakeVLLM, data: Path, **overrides: Any) -> AsyncIterator[httpx.AsyncClient]:
    """The gateway in-process in front of `fake`, its stores in `data`; two keys."""
    settings = settings_for(fake.url, api_keys=[CLIENT_KEY, OTHER_KEY], data_dir=data, **overrides)
    headers = {"authorization": f"Bearer {CLIENT_KEY}"}
    async with lifespan_client(create_app(settings), headers=headers, timeout=60) as client:
        yield client


def request_line(custom_id: str, **body: Any) -> dict[str, Any]:
    """One batch line: a chat request for the alias PaddleOCR-VL."""
    messages = [{"role": "user", "content": "OCR:"}]
    return {
        "custom_id": custom_id, "method": "POST", "url": CHAT,
        "body": {"model": "PaddleOCR-VL", "messages": messages, "max_tokens": 4, **body},
    }  # fmt: skip


def jsonl(*lines: Any) -> bytes:
    """Lines as a JSONL file (a str line is written as it is)."""
    return b"".join(
        (line.encode() if isinstance(line, str) else orjson.dumps(line)) + b"\n" for line in lines
    )


async def upload(client: httpx.AsyncClient, data: bytes, purpose: str = "batch") -> httpx.Response:
    """POST /v1/files."""
    return await client.post(
        "/v1/files", files={"file": ("in.jsonl", data)}, data={"purpose": purpose}
    )


async def create(client: httpx.AsyncClient, file_id: str, **fields: Any) -> httpx.Response:
    """POST /v1/batches for `file_id`."""
    body = {"input_file_id": file_id, "endpoint": CHAT, "completion_window": "24h", **fields}
    return await client.post("/v1/batches", json=body)


async def batch_of(client: httpx.AsyncClient, data: bytes) -> dict[str, Any]:
    """Upload `data` and create its batch."""
    file = await upload(client, data)
    assert file.status_code == 200, file.text
    response = await create(client, file.json()["id"])
    assert response.status_code == 200, response.text
    batch: dict[str, Any] = response.json()
    return batch


async def until(client: httpx.AsyncClient, batch_id: str, statuses: tuple[str, ...]) -> Any:
    """Poll the batch until its status is one of `statuses`."""
    for _ in range(400):
        batch = (await client.get(f"/v1/batches/{batch_id}")).json()
        if batch["status"] in statuses:
            return batch
        await asyncio.sleep(0.05)
    raise AssertionError(f"batch {batch_id} never got to {statuses}: {batch}")


async def lines_of(client: httpx.AsyncClient, file_id: str | None) -> list[dict[str, Any]]:
    """The lines of a file's content."""
    if file_id is None:
        return []
    response = await client.get(f"/v1/files/{file_id}/content")
    assert response.status_code == 200, response.text
    return [orjson.loads(line) for line in response.content.splitlines()]


async def test_a_batch_answers_each_line_once(fake: FakeVLLM, tmp_path: Path) -> None:
    """Good lines are answered through the alias, bad ones (wrong method, not JSON, a field the
    policy refuses, no custom_id) are error lines, and the batch completes with both files."""
    wrong_method = {**request_line("get"), "method": "GET"}
    data = jsonl(
        request_line("a"), wrong_method, request_line("b"), "{not json",
        request_line("salted", cache_salt="x"), {"method": "POST"}, request_line("c"),
    )  # fmt: skip
    async with gateway(fake, tmp_path / "data") as client:
        batch = await batch_of(client, data)
        assert batch["id"].startswith("batch_")
        assert len(batch["id"]) > 20
        assert (batch["object"], batch["status"]) == ("batch", "validating")
        assert batch["expires_at"] - batch["created_at"] == 86_400
        done = await until(client, batch["id"], ENDED)
        assert done["status"] == "completed", done
        assert done["request_counts"] == {"total": 7, "completed": 3, "failed": 4}
        for stamp in ("in_progress_at", "finalizing_at", "completed_at"):
            assert done[stamp] >= done["created_at"]
        output = await lines_of(client, done["output_file_id"])
        errors = await lines_of(client, done["error_file_id"])
    assert sorted(line["custom_id"] for line in output) == ["a", "b", "c"]
    for line in output:
        assert line["id"].startswith("batch_req_")
        assert line["error"] is None
        assert line["response"]["status_code"] == 200
        assert line["response"]["body"]["choices"][0]["message"]["content"] == "Hello page"
    assert {body["model"] for body in fake.bodies} == {fake.served}
    assert sorted(str(line["custom_id"]) for line in errors) == ["None", "None", "get", "salted"]
    by_id = {line["custom_id"]: line for line in errors}
    assert by_id["get"]["response"] is None
    assert "method" in by_id["get"]["error"]["message"]
    refused = by_id["salted"]["response"]
    assert refused["status_code"] == 400
    assert refused["body"]["error"]["code"] == "operator_only_parameter"


async def test_usage_counts_answered_lines(fake: FakeVLLM, tmp_path: Path) -> None:
    """The batch shows its tokens; the key's /v1/usage counts one page per answered line."""
    async with gateway(fake, tmp_path / "data") as client:
        batch = await batch_of(client, jsonl(request_line("a"), request_line("b")))
        done = await until(client, batch["id"], ENDED)
        assert done["usage"]["input_tokens"] == 20
        assert done["usage"]["output_tokens"] == 4
        usage: dict[str, Any] = {}
        for _ in range(100):  # the meter flushes in the background
            usage = (await client.get("/v1/usage")).json()
            if usage["data"] and usage["data"][0]["pages"] >= 2:
                break
            await asyncio.sleep(0.1)
        assert sum(day["pages"] for day in usage["data"]) == 2, usage


@pytest.mark.parametrize(
    ("data", "code", "line"),
    [
        (b"not json at all\n\x00\x01\n", "invalid_file_format", None),
        (b"\n\n", "empty_file", None),
        (jsonl(request_line("a"), {**request_line("b"), "url": "/v1/embeddings"}),
         "mismatched_endpoint", 2),
        (jsonl(request_line("a"), request_line("b"), request_line("a")),
         "duplicate_custom_id", 3),
    ],
)  # fmt: skip
async def test_a_file_refused_at_validation_fails_the_batch(
    fake: FakeVLLM, tmp_path: Path, data: bytes, code: str, line: int | None
) -> None:
    """Not JSONL, empty, mixed endpoints, a repeated custom_id: `failed` with `errors.data`
    naming the line, and nothing sent to the backend."""
    async with gateway(fake, tmp_path / "data") as client:
        batch = await batch_of(client, data)
        failed = await until(client, batch["id"], ENDED)
    assert failed["status"] == "failed"
    assert failed["failed_at"] is not None
    assert failed["errors"]["object"] == "list"
    assert [(e["code"], e["line"]) for e in failed["errors"]["data"]] == [(code, line)]
    assert failed["output_file_id"] is None
    assert fake.bodies == []


async def test_a_line_over_the_body_cap_fails_the_batch(fake: FakeVLLM, tmp_path: Path) -> None:
    """A line over OCRVL_MAX_BODY_BYTES (chat's own cap): `failed` at validation with
    line_too_large naming the line, and no line sent to the backend."""
    big = request_line("big", messages=[{"role": "user", "content": "x" * 5000}])
    data = jsonl(request_line("a"), big, request_line("c"))
    async with gateway(fake, tmp_path / "data", max_body_bytes=4096) as client:
        batch = await batch_of(client, data)
        failed = await until(client, batch["id"], ENDED)
    assert failed["status"] == "failed"
    assert [(e["code"], e["line"]) for e in failed["errors"]["data"]] == [("line_too_large", 2)]
    assert "OCRVL_MAX_BODY_BYTES" in failed["errors"]["data"][0]["message"]
    assert fake.bodies == []


async def test_too_many_lines_fail_the_batch(fake: FakeVLLM, tmp_path: Path) -> None:
    """More lines than OCRVL_BATCH_MAX_REQUESTS: `failed`, too_many_tasks."""
    async with gateway(fake, tmp_path / "data", batch_max_requests=2) as client:
        batch = await batch_of(client, jsonl(*(request_line(str(i)) for i in range(3))))
        failed = await until(client, batch["id"], ENDED)
    assert [e["code"] for e in failed["errors"]["data"]] == ["too_many_tasks"]


async def test_uploads_are_refused_with_the_right_status(fake: FakeVLLM, tmp_path: Path) -> None:
    """Wrong purpose 400, over OCRVL_BATCH_MAX_FILE_BYTES 413, no file or not multipart 400."""
    async with gateway(fake, tmp_path / "data", batch_max_file_bytes=1000) as client:
        wrong = await upload(client, jsonl(request_line("a")), purpose="fine-tune")
        assert (wrong.status_code, wrong.json()["error"]["param"]) == (400, "purpose")
        big = await upload(client, b"x" * 1001)
        assert (big.status_code, big.json()["error"]["param"]) == (413, "file")
        bare = await client.post("/v1/files", data={"purpose": "batch"}, files={"x": ("a", b"")})
        assert (bare.status_code, bare.json()["error"]["param"]) == (400, "file")
        as_json = await client.post("/v1/files", json={"purpose": "batch"})
        assert as_json.status_code == 400
        assert (await client.get("/v1/files")).json()["data"] == []
        ok = await upload(client, b"y" * 1000)
        assert ok.status_code == 200, ok.text
        file = ok.json()
        assert (file["object"], file["bytes"], file["purpose"]) == ("file", 1000, "batch")
        assert (file["filename"], file["status"]) == ("in.jsonl", "processed")


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"endpoint": "/v1/ocr"}, "endpoint"),
        ({"endpoint": "/v1/embeddings"}, "endpoint"),
        ({"completion_window": "1h"}, "completion_window"),
        ({"input_file_id": 7}, "input_file_id"),
        ({"metadata": {"k": 1}}, "metadata"),
        # wrong JSON types: each a 400, never a 500 (a list or object is no dict key)
        ({"completion_window": []}, "completion_window"),
        ({"completion_window": {}}, "completion_window"),
        ({"completion_window": None}, "completion_window"),
        ({"endpoint": []}, "endpoint"),
        ({"endpoint": {"a": 1}}, "endpoint"),
        ({"input_file_id": []}, "input_file_id"),
        ({"input_file_id": {}}, "input_file_id"),
        ({"metadata": []}, "metadata"),
        ({"metadata": "x"}, "metadata"),
    ],
)
async def test_create_refuses_what_openai_refuses(
    fake: FakeVLLM, tmp_path: Path, fields: dict[str, Any], param: str
) -> None:
    """An unknown endpoint (/v1/ocr named as not taken), a window other than 24h, no file id,
    bad metadata: 400 naming the field."""
    async with gateway(fake, tmp_path / "data") as client:
        file = (await upload(client, jsonl(request_line("a")))).json()
        response = await create(client, file["id"], **fields)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == param
    assert error["code"]
    if fields.get("endpoint") == "/v1/ocr":
        assert "/v1/ocr lines are not taken" in error["message"]


async def test_files_and_batches_are_only_their_keys(fake: FakeVLLM, tmp_path: Path) -> None:
    """Another key's file or batch, an unknown id and a guessed one: the same 404, for every
    route; lists hold only the caller's."""
    async with gateway(fake, tmp_path / "data") as client:
        batch = await batch_of(client, jsonl(request_line("a")))
        file_id = batch["input_file_id"]
        for method, path in [
            ("GET", f"/v1/files/{file_id}"), ("GET", f"/v1/files/{file_id}/content"),
            ("DELETE", f"/v1/files/{file_id}"), ("GET", f"/v1/batches/{batch['id']}"),
            ("POST", f"/v1/batches/{batch['id']}/cancel"),
        ]:  # fmt: skip
            refused = await client.request(method, path, headers=OTHER)
            assert refused.status_code == 404, (method, path)
        stolen = await client.post(
            "/v1/batches", headers=OTHER,
            json={"input_file_id": file_id, "endpoint": CHAT, "completion_window": "24h"},
        )  # fmt: skip
        assert stolen.status_code == 404
        for guess in ("file-0123456789abcdef0123456789abcdef", "batch_AAAA", "../x", "x" * 200):
            assert (await client.get(f"/v1/files/{guess}")).status_code == 404
            assert (await client.get(f"/v1/batches/{guess}")).status_code == 404
        assert (await client.get("/v1/files", headers=OTHER)).json()["data"] == []
        assert (await client.get("/v1/batches", headers=OTHER)).json()["data"] == []
        done = await until(client, batch["id"], ENDED)
        output = await client.get(f"/v1/files/{done['output_file_id']}/content", headers=OTHER)
        assert output.status_code == 404


async def test_lists_page_newest_first(fake: FakeVLLM, tmp_path: Path) -> None:
    """`limit` and `after` page the lists, OpenAI's list shape; bad ones are 400s."""
    async with gateway(fake, tmp_path / "data") as client:
        ids = [(await batch_of(client, jsonl(request_line("a"))))["id"] for _ in range(3)]
        first = (await client.get("/v1/batches", params={"limit": "2"})).json()
        assert [b["id"] for b in first["data"]] == [ids[2], ids[1]]
        assert (first["object"], first["first_id"], first["last_id"]) == ("list", ids[2], ids[1])
        assert first["has_more"] is True
        rest = await client.get("/v1/batches", params={"after": first["last_id"]})
        assert ([b["id"] for b in rest.json()["data"]], rest.json()["has_more"]) == (
            [ids[0]],
            False,
        )
        files = (await client.get("/v1/files", params={"limit": "1"})).json()
        assert len(files["data"]) == 1
        assert files["has_more"] is True
        for path in ("/v1/batches", "/v1/files"):
            for limit in ("0", "x", "100001"):
                bad = await client.get(path, params={"limit": limit})
                assert (bad.status_code, bad.json()["error"]["param"]) == (400, "limit")
            unknown = await client.get(path, params={"after": "batch_unknown"})
            assert (unknown.status_code, unknown.json()["error"]["param"]) == (400, "after")
        assert (await client.get("/v1/batches", params={"limit": "101"})).status_code == 400


async def test_cancel_stops_lines_in_flight(fake: FakeVLLM, tmp_path: Path) -> None:
    """A batch whose line hangs upstream: cancel answers `cancelling`, the upstream request is
    closed, the batch ends `cancelled`; cancelling it again is a 400."""
    fake.mode = "hang"
    async with gateway(fake, tmp_path / "data", job_page_concurrency=1) as client:
        batch = await batch_of(client, jsonl(*(request_line(str(i)) for i in range(3))))
        await until(client, batch["id"], ("in_progress",))
        assert await asyncio.to_thread(fake.chat_started.wait, 30), "no line reached the backend"
        response = await client.post(f"/v1/batches/{batch['id']}/cancel")
        assert response.status_code == 200
        assert response.json()["status"] in ("cancelling", "cancelled")
        assert response.json()["cancelling_at"] is not None
        done = await until(client, batch["id"], ENDED)
        assert done["status"] == "cancelled"
        assert await asyncio.to_thread(fake.disconnected.wait, 10)
        assert len(fake.bodies) == 1  # the other lines never ran
        assert done["request_counts"]["completed"] == 0
        again = await client.post(f"/v1/batches/{batch['id']}/cancel")
        assert (again.status_code, again.json()["error"]["code"]) == (400, "batch_not_cancellable")


async def test_a_deleted_file_is_gone(fake: FakeVLLM, tmp_path: Path) -> None:
    """DELETE answers OpenAI's deletion object; the file is then a 404, its content too."""
    async with gateway(fake, tmp_path / "data") as client:
        file = (await upload(client, jsonl(request_line("a")))).json()
        content = await client.get(f"/v1/files/{file['id']}/content")
        assert content.content == jsonl(request_line("a"))
        deleted = await client.delete(f"/v1/files/{file['id']}")
        assert deleted.json() == {"id": file["id"], "object": "file", "deleted": True}
        assert (await client.get(f"/v1/files/{file['id']}")).status_code == 404
        assert (await client.get(f"/v1/files/{file['id']}/content")).status_code == 404
        assert (await create(client, file["id"])).status_code == 404


async def test_lines_take_the_background_lane(fake: FakeVLLM, tmp_path: Path) -> None:
    """With 4 lines wanting a 4-slot backend, only the background lane's half reach it; the
    others wait in that lane (ocrvl_job_pages_waiting), leaving slots to interactive pages."""
    fake.mode = "hang"
    settings = settings_for(
        f"{fake.url};capacity=4", data_dir=tmp_path / "data", job_page_concurrency=4
    )
    headers = {"authorization": f"Bearer {CLIENT_KEY}"}
    async with lifespan_client(create_app(settings), headers=headers, timeout=60) as client:
        batch = await batch_of(client, jsonl(*(request_line(str(i)) for i in range(4))))
        waiting = 0.0
        for _ in range(200):
            metrics = (await client.get("/metrics")).text
            waiting = metric(metrics, "ocrvl_job_pages_waiting")
            if waiting == 2 and len(fake.bodies) == 2:
                break
            await asyncio.sleep(0.05)
        assert (waiting, len(fake.bodies)) == (2, 2)
        await asyncio.sleep(0.3)  # and no third line reaches it meanwhile (a negative check)
        waiting = metric((await client.get("/metrics")).text, "ocrvl_job_pages_waiting")
        assert (waiting, len(fake.bodies)) == (2, 2)
        await client.post(f"/v1/batches/{batch['id']}/cancel")
        assert (await until(client, batch["id"], ENDED))["status"] == "cancelled"
