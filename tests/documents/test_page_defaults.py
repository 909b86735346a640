"""What a document's page asks of the engine when the client says nothing, and how an answer cut
by `max_tokens` shows in markdown: /v1/ocr, jobs (the /ui page sends /v1/ocr's requests) and
`ocrvl ocr`.

FakeVLLM stands in for the engine: it records each page's request and can say it was cut.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from app import client as client_module
from app.documents.output import NDJSON
from app.main import create_app
from app.progress import Progress
from tests.conftest import CLIENT_KEY, settings_for
from tests.jobs.test_api import until_ended
from tests.support.documents import pdf
from tests.support.fake_backend import FakeVLLM
from tests.support.servers import lifespan_client

pytestmark = pytest.mark.anyio
AUTH = {"authorization": f"Bearer {CLIENT_KEY}"}


@pytest.mark.parametrize(("model_len", "expected"), [(32_768, 4096), (2048, 2048)])
async def test_a_page_asks_for_4096_tokens_at_most_by_default(
    fake: FakeVLLM, tmp_path: Path, model_len: int, expected: int
) -> None:
    """No `max_tokens`: each page of /v1/ocr and of a job asks for PaddleOCR's 4,096, held to
    the engine's max_model_len; a client's own value goes as it is."""
    fake.max_model_len = model_len
    settings = settings_for(fake.url, preprocess_workers=1, data_dir=tmp_path)
    async with lifespan_client(create_app(settings), headers=AUTH, timeout=60) as client:
        direct = await client.post("/v1/ocr", files={"file": ("doc.pdf", pdf(1))})
        assert direct.status_code == 200, direct.text
        job = (await client.post("/v1/ocr/jobs", files={"file": ("doc.pdf", pdf(1))})).json()
        assert (await until_ended(client, job["id"]))["status"] == "succeeded"
        own = await client.post(
            "/v1/ocr", files={"file": ("doc.pdf", pdf(1))}, data={"max_tokens": "9"}
        )
        assert own.status_code == 200, own.text
    assert [body["max_tokens"] for body in fake.bodies] == [expected, expected, 9]


async def test_markdown_marks_a_page_cut_by_max_tokens(fake: FakeVLLM, tmp_path: Path) -> None:
    """A page whose answer stopped at max_tokens: JSON says finish_reason `length`, markdown
    (of /v1/ocr and of a job's result) adds a comment after the page's text saying so."""
    fake.finish_reason = "length"
    settings = settings_for(fake.url, preprocess_workers=1, data_dir=tmp_path)
    cut = "Hello page\n\n<!-- page {} was cut at max_tokens: its text is incomplete -->"
    expected = "\n\n".join(cut.format(n) for n in (1, 2)) + "\n"
    markdown = {"accept": "text/markdown"}
    async with lifespan_client(create_app(settings), headers=AUTH, timeout=60) as client:
        answer = await client.post("/v1/ocr", files={"file": ("d.pdf", pdf(2))}, headers=markdown)
        assert answer.text == expected
        job = (await client.post("/v1/ocr/jobs", files={"file": ("d.pdf", pdf(2))})).json()
        await until_ended(client, job["id"])
        result = await client.get(f"/v1/ocr/jobs/{job['id']}/result", headers=markdown)
        assert result.text == expected
        pages = (await client.get(f"/v1/ocr/jobs/{job['id']}/result")).json()["pages"]
        assert [page["finish_reason"] for page in pages] == ["length", "length"]


async def test_ocrvl_ocr_writes_the_servers_markdown(
    fake: FakeVLLM, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`ocrvl ocr`'s Writer, fed the NDJSON stream it reads from /v1/ocr, writes the markdown
    the server answers for the same document, "cut at max_tokens" marks included, on stdout
    and into an `--out` file."""
    fake.finish_reason = "length"
    settings = settings_for(fake.url, preprocess_workers=1, data_dir=tmp_path)
    async with lifespan_client(create_app(settings), headers=AUTH, timeout=60) as client:
        files = {"file": ("d.pdf", pdf(3))}
        server = await client.post("/v1/ocr", files=files, headers={"accept": "text/markdown"})
        stream = await client.post("/v1/ocr", files=files, headers={"accept": NDJSON})
    assert "was cut at max_tokens" in server.text
    events = [json.loads(line) for line in stream.text.splitlines() if line.strip()]
    for target in (None, tmp_path / "out.md"):
        with client_module.Writer(target, "md", "d.pdf") as out:
            progress = Progress("d.pdf", io.StringIO())
            for event in events:
                client_module._handle(json.loads(json.dumps(event)), out, progress)
        written = capsys.readouterr().out if target is None else target.read_text()
        assert written == server.text


async def test_a_page_the_engine_aborted_is_an_error_and_is_not_kept(
    fake: FakeVLLM, tmp_path: Path
) -> None:
    """An answer vLLM ended with finish_reason `abort` (vLLM's shutdown without a drain, an
    aborted request; the real engine's answer then is a part of the text, 200): the page is a
    502 `backend_unavailable` error, not that part, and the results cache does not keep it, so
    the same file sent again once the engine answers whole is read again, whole."""
    fake.finish_reason = "abort"
    settings = settings_for(fake.url, preprocess_workers=1, data_dir=tmp_path)
    async with lifespan_client(create_app(settings), headers=AUTH, timeout=60) as client:
        aborted = await client.post("/v1/ocr", files={"file": ("d.pdf", pdf(1))})
        fake.finish_reason = "stop"
        again = await client.post("/v1/ocr", files={"file": ("d.pdf", pdf(1))})
    assert aborted.status_code == 502, aborted.text
    assert aborted.json()["error"]["code"] == "backend_unavailable"
    assert "aborted" in aborted.json()["error"]["message"]
    assert again.status_code == 200, again.text
    [page] = again.json()["pages"]
    assert (page["text"], page["finish_reason"]) == ("Hello page", "stop")
    assert len(fake.bodies) == 2  # read twice: the aborted answer was not kept
