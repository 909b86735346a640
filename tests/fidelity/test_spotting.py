"""Text spotting's reading of an answer is PaddleX's, answer for answer.

The gateway's side is `fanout.page_result` for task `spotting` (loops cut, math delimiters,
then app/documents/spotting.py); PaddleX's is what `_paddleocr_vl_assemble_parsing_results`
does to a spotting block's answer with its own `truncate_repetitive_content` and
`post_process_for_spotting` (tests/paddlex/paddlex_serving.py's `spotting` mode, in
`.venv-paddleocr`). The answers are generated as the model writes them and as it goes wrong:
framed regions, too few locations, unframed runs of locations, text between them, loops, math.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import orjson
import pytest

from app.documents.fanout import page_result
from app.documents.streams import Reply, read_block
from tests.paddlex.conftest import run_paddlex
from tests.support.fake_backend import completion
from tests.support.standin_vlm import WORDS

SIZES = ((600, 800), (1240, 1754), (1000, 333))


def _locations(rng: random.Random, count: int = 8) -> str:
    return "".join(f"<|LOC_{rng.randint(0, 1000)}|>" for _ in range(count))


def _region(rng: random.Random) -> str:
    text = " ".join(rng.choices(WORDS, k=rng.randint(1, 4)))
    if rng.random() < 0.15:
        text = f"  {text}\n"  # stripped
    count = 8 if rng.random() < 0.8 else rng.choice((4, 7, 9, 12))
    return f"<|TEXT_START|>{text}<|TEXT_END|><|LOC_BEGIN|>{_locations(rng, count)}<|LOC_END|>"


def spotting_answer(rng: random.Random) -> str:
    """One answer of the model to `Spotting:`, well formed or not."""
    kind = rng.random()
    if kind < 0.5:
        return "".join(_region(rng) for _ in range(rng.randint(0, 6)))
    if kind < 0.7:  # unframed: text, then eight locations, again and again (and a tail)
        parts = [f"{rng.choice(WORDS)} {_locations(rng, rng.choice((8, 8, 8, 5)))}"]
        parts *= rng.randint(1, 4)
        return "".join(parts) + rng.choice(("", " tail", _locations(rng, 3)))
    if kind < 0.8:  # a loop the pipeline cuts
        return _region(rng) * rng.randint(60, 80)
    if kind < 0.9:  # math in the text
        return _region(rng).replace("<|TEXT_END|>", " \\(x^2\\) $y$<|TEXT_END|>")
    return rng.choice(("", "no regions at all", "<|TEXT_START|>open<|LOC_BEGIN|><|LOC_END|>"))


def answers() -> list[tuple[str, int, int]]:
    rng = random.Random(49)
    return [(spotting_answer(rng), *rng.choice(SIZES)) for _ in range(120)]


def gateway_read(answer: str, width: int, height: int) -> list[Any]:
    body = completion("m")
    body["choices"][0]["message"]["content"] = answer
    reply = Reply(*read_block(orjson.dumps(body)))
    page = page_result(1, reply, "spotting", (width, height))
    assert page.spotting is not None
    found = {
        "rec_polys": [spot["polygon"] for spot in page.spotting],
        "rec_texts": [spot["text"] for spot in page.spotting],
    }
    return [page.text, found]


def test_spotted_regions_equal_paddlexs(paddlex_python: Path, tmp_path: Path) -> None:
    """120 generated answers on three page sizes: the text and every region's text and
    polygon equal PaddleX's, float for float."""
    made = answers()
    assert sum(bool(gateway_read(*item)[1]["rec_texts"]) for item in made) > 60
    expected = run_paddlex({"mode": "spotting", "answers": made}, tmp_path)["read"]
    got = orjson.loads(orjson.dumps([gateway_read(*item) for item in made]))
    for item, mine, theirs in zip(made, got, expected, strict=True):
        assert mine == theirs, item[0][:300]


@pytest.mark.parametrize(
    ("answer", "text", "first"),
    [
        (
            "<|TEXT_START|> Hi <|TEXT_END|><|LOC_BEGIN|><|LOC_0|><|LOC_0|><|LOC_500|><|LOC_0|>"
            "<|LOC_500|><|LOC_1000|><|LOC_0|><|LOC_1000|><|LOC_END|>",
            "Hi",
            [[0.0, 0.0], [300.0, 0.0], [300.0, 800.0], [0.0, 800.0]],
        ),
        ("a <|LOC_1|><|LOC_2|><|LOC_3|><|LOC_4|><|LOC_5|><|LOC_6|><|LOC_7|><|LOC_8|>", "a", None),
        ("plain text", "", None),
    ],
    ids=["framed", "unframed", "none"],
)
def test_a_spotting_answer_reads_into_regions(answer: str, text: str, first: Any) -> None:
    """Framed regions in thousandths of the page, an unframed run of eight locations, and an
    answer with no locations (no regions, no text), on a 600x800 page."""
    read, found = gateway_read(answer, 600, 800)
    assert read == text
    if first is not None:
        assert [list(p) for p in found["rec_polys"][0]] == first
    assert len(found["rec_texts"]) == (0 if text == "" else 1)
