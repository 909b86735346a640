"""Drawing a synthetic page and noting the layout box of everything drawn on it.

A `Sketch` draws text, tables, formulas, pictures, charts and seals with Pillow and keeps the
box of each, shaped as PaddleX's layout model hands boxes to its pipeline (`restructured_boxes`
then `update_order_index` in `paddlex/inference/models/layout_analysis/processors.py`): `cls_id`
and `label` of PP-DocLayoutV3's 25 labels, `score`, int `coordinate` [x1, y1, x2, y2] clipped
to the page, `order` (1, 2, … in reading order, None for the labels that take no order) and,
for a region drawn as a polygon, `polygon_points`. Boxes are listed in reading order.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from PIL import Image, ImageDraw, ImageFont

# PP-DocLayoutV3's labels, by class id (alphabetical; PaddleX's PaddleOCR-VL-1.5.yaml lists
# its merge modes by these ids).
LABELS = (
    "abstract", "algorithm", "aside_text", "chart", "content", "display_formula", "doc_title",
    "figure_title", "footer", "footer_image", "footnote", "formula_number", "header",
    "header_image", "image", "inline_formula", "number", "paragraph_title", "reference",
    "reference_content", "seal", "table", "text", "vertical_text", "vision_footnote",
)  # fmt: skip
# Labels the layout model gives no reading order (its SKIP_ORDER_LABELS).
UNORDERED = {
    "figure_title", "vision_footnote", "image", "chart", "table", "header", "header_image",
    "footer", "footer_image", "footnote", "aside_text",
}  # fmt: skip
WORDS = (
    "the", "layout", "of", "a", "page", "is", "read", "in", "order", "each", "block", "cropped",
    "and", "sent", "with", "its", "own", "prompt", "tables", "become", "html", "formulas",
    "latex", "figures", "stay", "images",
)  # fmt: skip

Box = tuple[int, int, int, int]


@dataclass
class Page:
    """A synthetic page: its image and its layout boxes."""

    name: str
    image: Image.Image
    boxes: list[dict[str, Any]]

    @property
    def size(self) -> str:
        """The page's size, "WxH": how both layout stand-ins find its boxes."""
        return f"{self.image.width}x{self.image.height}"


@dataclass
class Sketch:
    """A page being drawn."""

    name: str
    width: int
    height: int
    seed: int = 0
    boxes: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.image = Image.new("RGB", (self.width, self.height), "white")
        self.draw = ImageDraw.Draw(self.image)
        self.rng = random.Random(self.seed)

    def font(self, size: int) -> ImageFont.FreeTypeFont:
        """Pillow's bundled font (Aileron) at `size` pixels (FreeType is built into Pillow's
        wheels; without it the pages could not be drawn alike anyway)."""
        font = ImageFont.load_default(size=size)
        assert isinstance(font, ImageFont.FreeTypeFont), "Pillow without FreeType"
        return font

    def box(
        self, label: str, box: Box, polygon: list[list[int]] | None = None, score: float = 0.9
    ) -> None:
        """Note a layout box, nothing drawn; its polygon is its rectangle unless given (the
        real model gives every box one)."""
        x1, y1 = max(0, box[0]), max(0, box[1])
        x2, y2 = min(self.width, box[2]), min(self.height, box[3])
        self.boxes.append(
            {
                "cls_id": LABELS.index(label),
                "label": label,
                "score": score,
                "coordinate": [x1, y1, x2, y2],
                "polygon_points": polygon or [[x1, y1], [x2, y1], [x2, y2], [x1, y2]],
            }
        )

    def words(self, count: int) -> str:
        """`count` seeded words."""
        return " ".join(self.rng.choices(WORDS, k=count))

    def text(self, label: str, box: Box, lines: int = 0, size: int = 18, **extra: Any) -> None:
        """Lines of words filling `box` (as many as fit when `lines` is 0)."""
        x1, y1, x2, y2 = box
        font = self.font(size)
        count = lines or max(1, (y2 - y1 - 6) // int(size * 1.4))
        for i in range(count):
            y = y1 + 4 + i * int(size * 1.4)
            line = self.words(self.rng.randint(3, 12))
            while line and font.getlength(line) > x2 - x1 - 8:
                line = line.rsplit(" ", 1)[0] if " " in line else ""
            self.draw.text((x1 + 4, y), line, fill="black", font=font)
        self.box(label, box, **extra)

    def formula(self, label: str, box: Box, size: int = 24) -> None:
        """A formula drawn in the middle of `box`, with white margins around it."""
        x1, y1, x2, y2 = box
        a, b = self.rng.sample("abcxyz", 2)
        text = f"{a}² + {b}² = ∫ f({a}) d{b}" if label == "display_formula" else f"{a}+{b}"
        font = self.font(size)
        width = font.getlength(text)
        self.draw.text(((x1 + x2 - width) / 2, (y1 + y2 - size) / 2), text, fill="black", font=font)
        self.box(label, box)

    def table(self, box: Box, rows: int = 4, columns: int = 3) -> None:
        """A ruled table with a number in each cell."""
        x1, y1, x2, y2 = box
        font = self.font(16)
        for r in range(rows + 1):
            y = y1 + (y2 - y1) * r // rows
            self.draw.line((x1, y, x2, y), fill="black", width=2)
        for c in range(columns + 1):
            x = x1 + (x2 - x1) * c // columns
            self.draw.line((x, y1, x, y2), fill="black", width=2)
        for r in range(rows):
            for c in range(columns):
                cx = x1 + (x2 - x1) * c // columns + 8
                cy = y1 + (y2 - y1) * r // rows + 6
                self.draw.text((cx, cy), str(self.rng.randint(0, 999)), fill="black", font=font)
        self.box("table", box)

    def picture(self, label: str, box: Box) -> None:
        """Coloured shapes: a photo or drawing."""
        x1, y1, x2, y2 = box
        self.draw.rectangle(box, fill=(200, 220, 240))
        for _ in range(6):
            cx, cy = self.rng.randint(x1, x2), self.rng.randint(y1, y2)
            r = self.rng.randint(5, max(6, (x2 - x1) // 4))
            colour = tuple(self.rng.randint(0, 255) for _ in range(3))
            self.draw.ellipse((cx - r, cy - r, cx + r, cy + r), fill=colour)
        self.draw.rectangle((x1, y1, x2 - 1, y2 - 1), outline=(255, 255, 255), width=2)
        self.box(label, box)

    def chart(self, box: Box) -> None:
        """A bar chart: axes and bars."""
        x1, y1, x2, y2 = box
        self.draw.line((x1 + 20, y2 - 20, x2 - 10, y2 - 20), fill="black", width=2)
        self.draw.line((x1 + 20, y1 + 10, x1 + 20, y2 - 20), fill="black", width=2)
        bars = self.rng.randint(3, 6)
        step = (x2 - x1 - 40) // bars
        for i in range(bars):
            top = self.rng.randint(y1 + 15, y2 - 30)
            left = x1 + 30 + i * step
            self.draw.rectangle((left, top, left + step // 2, y2 - 21), fill=(60, 120, 200))
        self.box("chart", box)

    def seal(self, box: Box) -> None:
        """A round red stamp with text in it."""
        x1, y1, x2, y2 = box
        self.draw.ellipse((x1 + 2, y1 + 2, x2 - 2, y2 - 2), outline=(210, 30, 30), width=5)
        font = self.font(max(10, (x2 - x1) // 8))
        place = (x1 + (x2 - x1) // 5, (y1 + y2) // 2 - 8)
        self.draw.text(place, "SEAL", fill=(210, 30, 30), font=font)
        self.box("seal", box)

    def page(self) -> Page:
        """The page, its boxes given reading order as the layout model does."""
        order = 1
        for entry in self.boxes:
            if entry["label"] in UNORDERED:
                entry["order"] = None
            else:
                entry["order"] = order
                order += 1
        return Page(self.name, self.image, self.boxes)
