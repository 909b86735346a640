"""Text spotting: the model's `Spotting:` answer read into lines of text with their polygons.

    enlarged(image)             the page as PaddleX sends it to be spotted (twice its size,
                                Lanczos, when both sides are under 1,500 px)
    read(answer, width, height) (the text, one line per spotted region, blank lines between,
                                and each region's text and 4-point polygon in page pixels)

Mirrors `uilts.pre_process_for_spotting` and `uilts.post_process_for_spotting` (PaddleX 3.7,
`paddlex/inference/pipelines/paddleocr_vl/uilts.py`). The model writes each region as
`<|TEXT_START|>text<|TEXT_END|><|LOC_BEGIN|><|LOC_x1|><|LOC_y1|>…<|LOC_y4|><|LOC_END|>`, its
coordinates in thousandths of the page's width and height; those are special tokens, so the
request asks for them (`skip_special_tokens: false`). An answer without that framing is read
as PaddleX reads it: every run of eight `<|LOC_n|>` tokens closes the text before it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from PIL import Image

TEXT = re.compile(r"<\|TEXT_START\|>(.*?)<\|TEXT_END\|>", re.S)
LOCATIONS = re.compile(r"<\|LOC_BEGIN\|>(.*?)<\|LOC_END\|>", re.S)
LOCATION = re.compile(r"<\|LOC_(\d+)\|>")
SMALL = 1500  # pre_process_for_spotting enlarges a page with both sides under this
PIXELS = (112_896, 1_605_632)  # a spotted block's pixel bounds, fixed in PaddleX's pipeline
Point = tuple[float, float]


@dataclass(frozen=True, slots=True)
class Spotted:
    """One spotted region: its text and its four corners, in page pixels."""

    text: str
    polygon: list[Point]


def enlarged(image: Image.Image) -> Image.Image:
    """pre_process_for_spotting: a page with both sides under 1,500 px at twice its size."""
    if image.width < SMALL and image.height < SMALL:
        return image.resize((image.width * 2, image.height * 2), Image.Resampling.LANCZOS)
    return image


def read(answer: str, width: int, height: int) -> tuple[str, list[Spotted]]:
    """post_process_for_spotting: the regions of `answer` on a page of `width` x `height`, and
    their texts joined by blank lines."""
    texts, blocks = TEXT.findall(answer), LOCATIONS.findall(answer)
    found: list[Spotted] = []
    for text, block in zip(texts, blocks, strict=False):
        numbers = LOCATION.findall(block)
        if len(numbers) >= 8:
            found.append(Spotted(text.strip(), _corners(numbers[:8], width, height)))
    if not found:
        found = _runs(answer, width, height)
    return "\n\n".join(spot.text for spot in found), found


def _runs(answer: str, width: int, height: int) -> list[Spotted]:
    """The fallback: each run of eight location tokens, with the text since the last run."""
    matches = list(LOCATION.finditer(answer))
    found, last = [], 0
    for start in range(0, len(matches) - 7, 8):
        run = matches[start : start + 8]
        text = answer[last : run[0].start()].strip()
        found.append(Spotted(text, _corners([m.group(1) for m in run], width, height)))
        last = run[-1].end()
    return found


def _corners(numbers: list[str], width: int, height: int) -> list[Point]:
    values = [int(n) for n in numbers]
    return [(values[i] / 1000.0 * width, values[i + 1] / 1000.0 * height) for i in range(0, 8, 2)]
