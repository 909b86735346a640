"""The loop guard through the whole pipeline: a stand-in VLM whose chosen `OCR:` blocks loop to
their token limit (its `fake_loop_every` fault), behind a real `ocrvl serve` and behind PaddleX's
own pipeline. Every page answers 200; each looping block is stopped within a few hundred tokens,
cut to the text before its loop and the unit once, and flagged; every other block is PaddleX's."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from app.documents import answers, loops
from tests.fidelity.conftest import Gateway, Layouts, Side, running_gateway
from tests.fidelity.pages import Document
from tests.fidelity.test_paddlex_fidelity import gateway_blocks, paddlex_blocks
from tests.support import paddlex_pipeline
from tests.support.layout_standin import LayoutStandin
from tests.support.pages import chat_body, document_page
from tests.support.servers import serving
from tests.support.standin_vlm import (
    Received,
    StandinVLM,
    loop_parts,
    looping,
    loops_here,
    request_limit,
)

DOCUMENTS = ("article", "book-pdf", "merged_paragraphs")
EVERY = 3  # one OCR block in 3 loops (by its pixels): each document has some
FEW_HUNDRED = 400  # tokens a looping block may run before the guard stops it
TOKEN_SECONDS = 0.002  # the stand-in's pace, as the (a real engine's is slower)


@dataclass(frozen=True)
class Looped:
    """Both sides' answers over DOCUMENTS, and the gateway's stand-in's streams."""

    paddlex: Side
    gateway: Side
    streamed: list[tuple[Received, int, int]]


@pytest.fixture(scope="module")
def looped(
    paddlex_python: Path,
    documents: list[Document],
    layouts: Layouts,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Looped]:
    """DOCUMENTS read by PaddleX and by the gateway, each at a looping stand-in of its own."""
    chosen = [doc for doc in documents if doc.name in DOCUMENTS]
    workdir = tmp_path_factory.mktemp("loops")
    with serving(StandinVLM(fake_loop_every=EVERY)) as vlm:
        done = paddlex_pipeline.run(f"{vlm.url}/v1", [d.path for d in chosen], layouts, workdir)
    by_path = {str(doc.path): doc.name for doc in chosen}
    pages = {(by_path[p["input_path"]], p["page_index"] or 0): p for p in done.pages}
    expected = Side(pages, list(vlm.received))
    standin = StandinVLM(fake_loop_every=EVERY, token_seconds=TOKEN_SECONDS)
    layout = LayoutStandin(boxes=lambda width, height, _: layouts[f"{width}x{height}"])
    with (
        serving(standin) as vlm,
        serving(layout) as service,
        running_gateway(vlm.url, service.url, workdir) as url,
    ):
        side = Gateway(url, vlm, service, {doc.name: doc for doc in chosen}).read(chosen)
        yield Looped(expected, side, vlm.streams_ended())


def looping_requests(side: Side) -> list[Received]:
    return [r for r in side.received if loops_here(r, EVERY)]


def test_looping_blocks_are_stopped_within_a_few_hundred_tokens(looped: Looped) -> None:
    """Each looping block's stream ended within FEW_HUNDRED tokens of the 4,096 it would have
    run; PaddleX, which cannot stop it, got all of them."""
    streams = [(r, sent, total) for r, sent, total in looped.streamed if loops_here(r, EVERY)]
    assert streams, "no block looped: the fault picked none"
    for request, sent, total in streams:
        assert total == request_limit(request) > FEW_HUNDRED
        assert sent <= FEW_HUNDRED, f"a looping block ran {sent} tokens"
    assert len(looping_requests(looped.paddlex)) == len(streams)


def test_looping_blocks_are_cut_and_flagged_and_the_others_are_paddlexs(looped: Looped) -> None:
    """Block by block: a looping one is the text before its loop and the unit once, with
    `stopped`, its unit's size and the tokens spent; any other is PaddleX's, field for field;
    no page's markdown repeats a unit."""
    units = {loop_parts(r)[0]: r for r in looping_requests(looped.gateway)}
    assert looped.gateway.pages.keys() == looped.paddlex.pages.keys()
    flagged = 0
    for key, page in looped.gateway.pages.items():
        expected = paddlex_blocks(looped.paddlex.pages[key])
        got = gateway_blocks(page)
        assert len(got) == len(expected), key
        for block, mine, theirs in zip(page["blocks"], got, expected, strict=True):
            if "stopped" not in block:
                assert mine == theirs, key
                continue
            flagged += 1
            before = next(b for b in units if block["text"].startswith(b[:-1]))
            request = units[before]
            full = "".join(looping(request, request_limit(request)))
            loop = loops.find(full, loops.limits(block["label"]))
            assert loop is not None
            assert block["text"] == answers.content(block["label"], loop.cut(full))
            assert block["stopped"] == "repetition"
            assert block["finish_reason"] == "repetition"
            assert block["loop"]["unit"] == loop.size
            assert 0 < block["loop"]["tokens"] <= FEW_HUNDRED
            assert {k: v for k, v in mine.items() if k != "text"} == {
                k: v for k, v in theirs.items() if k != "text"
            }
            unit = loop_parts(request)[1]
            assert (unit * 2).strip() not in page["markdown"], key
    assert flagged == len(units)


def test_a_stream_the_client_left_is_recorded_before_the_stand_in_is_read() -> None:
    """The client leaves a looping stream after two tokens; `streams_ended` gives that stream
    with the tokens sent, although the stand-in, asleep between tokens, notices later."""
    standin = StandinVLM(fake_loop_every=1, token_seconds=0.5)
    body = chat_body(document_page(width=320, height=200), max_completion_tokens=50, stream=True)
    with serving(standin) as vlm, httpx.Client(timeout=10) as client:
        with client.stream("POST", f"{vlm.url}/v1/chat/completions", json=body) as response:
            events = (line for line in response.iter_lines() if line.startswith("data: "))
            next(events), next(events)  # two tokens, then the client goes
        [(request, sent, total)] = vlm.streams_ended(timeout=10)
    assert request.prompt == "OCR:"
    assert total == 50
    assert 2 <= sent < total
