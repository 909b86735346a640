"""The loop guard through /v1/ocr, in-process: a fake that loops on chosen prompts (tests/support/
fake_backend.py streams its answer), a stand-in layout service. A stopped block keeps the text
before its loop and the unit once, says so, and is counted; `loops=retry` asks once more;
`loops=off` relays answers whole, as before."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from starlette.types import Receive, Scope, Send

from app.documents import loops
from tests.documents.test_layout_gateway import gateway, upload
from tests.support.fake_backend import FakeVLLM, completion, reply
from tests.support.layout_standin import LayoutStandin, box
from tests.support.servers import read_body, serving

pytestmark = pytest.mark.anyio
LOOPING = "Intro to the survey. " + "lorem ipsum " * 1500  # a word an event: 1,504 tokens
CLEAN = "Intro to the survey. Lorem ipsum, once."
TABLE = "<fcel>a<fcel>b<nl>"
BOXES = [box("text", 40, 100, 560, 160, order=1), box("table", 40, 200, 560, 400)]


class FakeLoopingVLLM(FakeVLLM):
    """A fake whose `OCR:` answer loops (LOOPING); with `repetition_penalty` in the request it
    answers CLEAN unless `stubborn`. Other prompts get a small table."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.stubborn = False

    async def _chat(self, scope: Scope, receive: Receive, send: Send) -> None:
        payload = orjson.loads(await read_body(receive))
        self.bodies.append(payload)
        prompt = payload["messages"][0]["content"][1]["text"]
        text = TABLE
        if prompt == "OCR:":
            penalised = "repetition_penalty" in payload and not self.stubborn
            text = CLEAN if penalised else LOOPING
        answer = completion(payload["model"])
        answer["choices"][0]["message"]["content"] = text
        spent = len(text.split())
        answer["usage"].update(completion_tokens=spent, total_tokens=10 + spent)
        await reply(send, payload, answer)


def cut_of(text: str, label: str) -> tuple[str, int]:
    """What the guard keeps of `text` once it has seen all of it, and the unit's size."""
    loop = loops.find(text, loops.limits(label))
    assert loop is not None
    return loop.cut(text), loop.size


async def test_a_looping_block_is_stopped_cut_flagged_and_counted(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The text block loops: it keeps the text before the loop and one `lorem ipsum`, says
    `stopped: repetition` with the unit and the tokens spent, finish_reason "repetition";
    the markdown has the unit once; the table block is untouched; /metrics counts the stop
    and the tokens it avoided; one log line says so, without the text."""
    with (
        serving(FakeLoopingVLLM()) as fake,
        serving(LayoutStandin(boxes=lambda w, h, n: BOXES)) as layout,
    ):
        async with gateway(fake, layout) as client:
            response = await client.post("/v1/ocr", files=upload())
            metrics = (await client.get("/metrics")).text
    assert response.status_code == 200, response.text
    page = response.json()["pages"][0]
    text, table = page["blocks"]
    assert text["stopped"] == "repetition"
    assert text["finish_reason"] == "repetition"
    assert text["loop"]["unit"] == len("lorem ipsum ")
    spent = text["loop"]["tokens"]
    # stopped somewhere in the loop: the fake writes faster than the gateway reads (events
    # come in batches, how many a loaded machine reads before the stop is not bounded here);
    # tests/real/test_loop_guard.py bounds the window on a real engine
    assert 0 < spent <= len(LOOPING.split())
    assert text["usage"]["completion_tokens"] == spent
    assert text["text"].startswith("Intro to the survey.")
    assert text["text"].count("lorem ipsum") == 1
    assert page["markdown"].count("lorem ipsum") == 1
    assert "stopped" not in table
    assert table["finish_reason"] == "stop"
    assert page["finish_reason"] == "repetition"
    assert fake.bodies[0]["stream"] is True
    assert fake.bodies[0]["stream_options"]["continuous_usage_stats"] is True
    stops = 'ocrvl_loops_stopped_total{label="text",route="/v1/ocr"} 1.0'
    assert stops in metrics
    limit = fake.bodies[0]["max_completion_tokens"]
    avoided = f'ocrvl_loop_tokens_avoided_total{{route="/v1/ocr"}} {float(limit - spent)}'
    assert avoided in metrics
    logged = [orjson.loads(x) for x in capsys.readouterr().err.splitlines() if x.startswith("{")]
    (line,) = [x for x in logged if x["msg"] == "loop stopped"]  # the gateway's JSON log
    assert (line["label"], line["unit_chars"], line["tokens"]) == ("text", 12, spent)
    assert line["request_id"].endswith("-p1-b0")
    assert "lorem" not in str(line)


@pytest.mark.parametrize("interval", [8, 1])
async def test_a_blocks_stream_asks_the_engine_for_an_event_every_n_tokens(interval: int) -> None:
    """The gateway reads a block's stream itself, so it asks vLLM for an event every
    OCRVL_ENGINE_STREAM_INTERVAL tokens (`stream_interval`); 1, the default, leaves it out."""
    with (
        serving(FakeLoopingVLLM()) as fake,
        serving(LayoutStandin(boxes=lambda w, h, n: BOXES[1:])) as layout,
    ):
        async with gateway(fake, layout, engine_stream_interval=interval) as client:
            response = await client.post("/v1/ocr", files=upload())
    assert response.status_code == 200, response.text
    (body,) = fake.bodies
    assert body["stream"] is True
    assert body.get("stream_interval") == (interval if interval > 1 else None)


@pytest.mark.parametrize("stubborn", [False, True], ids=["retry-kept", "retry-loops-too"])
async def test_loops_retry_asks_once_more_with_a_penalty(stubborn: bool) -> None:
    """loops=retry: the stopped block is asked again with repetition_penalty and a smaller
    max_completion_tokens; its answer is kept when it does not loop (`retry: answer`), else the
    first cut (`retry: cut`); usage counts both requests."""
    with (
        serving(FakeLoopingVLLM()) as fake,
        serving(LayoutStandin(boxes=lambda w, h, n: BOXES[:1])) as layout,
    ):
        fake.stubborn = stubborn
        async with gateway(fake, layout) as client:
            response = await client.post("/v1/ocr", files=upload(), data={"loops": "retry"})
    assert response.status_code == 200, response.text
    (block,) = response.json()["pages"][0]["blocks"]
    first, again = fake.bodies
    assert "repetition_penalty" not in first
    assert again["repetition_penalty"] == 1.1
    assert again["max_completion_tokens"] < first["max_completion_tokens"]
    assert block["stopped"] == "repetition"
    assert block["loop"]["retry"] == ("cut" if stubborn else "answer")
    if stubborn:
        assert block["text"].count("lorem ipsum") == 1
        assert block["finish_reason"] == "repetition"
    else:
        assert block["text"] == CLEAN
        assert block["finish_reason"] == "stop"
    assert block["usage"]["completion_tokens"] > block["loop"]["tokens"]


async def test_loops_off_relays_the_answer_whole_as_before() -> None:
    """loops=off (and OCRVL_LOOPS=off for a request that does not say): the block is asked
    without a stream, read whole, and only PaddleX's own clean-up applies; nothing is stopped."""
    with (
        serving(FakeLoopingVLLM()) as fake,
        serving(LayoutStandin(boxes=lambda w, h, n: BOXES[:1])) as layout,
    ):
        async with gateway(fake, layout) as client:
            asked = await client.post("/v1/ocr", files=upload(), data={"loops": "off"})
        async with gateway(fake, layout, loops="off") as client:
            default = await client.post("/v1/ocr", files=upload())
    for response in (asked, default):
        (block,) = response.json()["pages"][0]["blocks"]
        assert "stopped" not in block
        assert block["finish_reason"] == "stop"
        assert block["usage"]["completion_tokens"] == len(LOOPING.split())
    assert all("stream" not in body for body in fake.bodies)


async def test_a_whole_page_that_loops_is_cut_and_flagged() -> None:
    """layout=off: the page's own answer is stopped and cut; the page says so."""
    with serving(FakeLoopingVLLM()) as fake:
        async with gateway(fake, None) as client:
            response = await client.post("/v1/ocr", files=upload(), data={"layout": "off"})
    page = response.json()["pages"][0]
    assert page["stopped"] == "repetition"
    assert page["finish_reason"] == "repetition"
    assert page["loop"]["unit"] == len("lorem ipsum ")
    assert page["text"].count("lorem ipsum") == 1
    assert len(page["text"]) < len(CLEAN) + len("lorem ipsum ")


async def test_an_unknown_loops_mode_is_refused() -> None:
    """`loops` other than cut, retry, off: 400 naming the field."""
    with serving(FakeLoopingVLLM()) as fake:
        async with gateway(fake, None) as client:
            response = await client.post("/v1/ocr", files=upload(), data={"loops": "maybe"})
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["param"], error["code"]) == ("loops", "invalid_value")
    assert "cut, retry, off" in error["message"]


async def test_a_job_keeps_its_loops_mode_and_counts_its_stops_under_jobs(tmp_path: Path) -> None:
    """A job submitted with loops=retry asks its looping block again (the mode is kept in the
    job's spec, read by the runner); its stop counts under route "jobs"."""
    with (
        serving(FakeLoopingVLLM()) as fake,
        serving(LayoutStandin(boxes=lambda w, h, n: BOXES[:1])) as layout,
    ):
        async with gateway(fake, layout, data_dir=tmp_path) as client:
            submitted = await client.post(
                "/v1/ocr/jobs", files=upload(), data={"layout": "on", "loops": "retry"}
            )
            assert submitted.status_code == 202, submitted.text
            location = f"/v1/ocr/jobs/{submitted.json()['id']}"
            for _ in range(60):  # each long poll returns when the status changes
                job = (await client.get(location, params={"wait": "5"})).json()
                if job["status"] not in ("queued", "running"):
                    break
            result = (await client.get(f"{location}/result")).json()
            metrics = (await client.get("/metrics")).text
    assert job["status"] == "succeeded"
    (block,) = result["pages"][0]["blocks"]
    assert (block["stopped"], block["loop"]["retry"], block["text"]) == (
        "repetition",
        "answer",
        CLEAN,
    )
    assert len(fake.bodies) == 2
    assert 'ocrvl_loops_stopped_total{label="text",route="jobs"} 1.0' in metrics
