"""Synthetic pages with layout: titles, text columns, a table, a figure, header and footer.

Seeded and sized at will, so the layout service's tests can send pages of different shapes and
contents (the tiny random-weight model answers each differently; tests/support/tiny_layout.py).
"""

from __future__ import annotations

import io
import random

from PIL import Image, ImageDraw


def layout_page(seed: int = 0, width: int = 1240, height: int = 1754) -> Image.Image:
    """A page of `width` x `height` with a seeded arrangement of blocks (RGB)."""
    rng = random.Random(seed)
    page = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(page)
    margin, unit = width // 14, max(6, height // 120)
    draw.rectangle((margin, unit, width - margin, 2 * unit), fill=(90, 90, 90))  # header
    y = 4 * unit
    draw.rectangle((width // 4, y, 3 * width // 4, y + 3 * unit), fill="black")  # title
    y += 6 * unit
    columns = rng.choice((1, 2))
    column_width = (width - 2 * margin) // columns
    while y < height - 12 * unit:
        kind = rng.random()
        for column in range(columns):
            x0 = margin + column * column_width + unit
            x1 = x0 + column_width - 2 * unit
            if kind < 0.15:  # a figure
                shade = tuple(rng.randint(40, 220) for _ in range(3))
                draw.rectangle((x0, y, x1, y + 14 * unit), fill=shade)
            elif kind < 0.3:  # a ruled table
                for row in range(6):
                    draw.line((x0, y + row * 2 * unit, x1, y + row * 2 * unit), fill="black")
                for col in range(4):
                    x = x0 + col * (x1 - x0) // 3
                    draw.line((x, y, x, y + 10 * unit), fill="black")
            else:  # a paragraph
                for line in range(rng.randint(3, 8)):
                    end = x1 if line < 2 or rng.random() < 0.8 else x0 + (x1 - x0) // 2
                    top = y + line * 2 * unit
                    draw.rectangle((x0, top, end, top + unit), fill=(20, 20, 20))
        y += 17 * unit if kind < 0.3 else 18 * unit
    draw.rectangle(
        (width // 2 - 2 * unit, height - 3 * unit, width // 2 + 2 * unit, height - 2 * unit),
        fill=(60, 60, 60),
    )  # page number
    return page


def png(image: Image.Image) -> bytes:
    """`image` encoded as PNG."""
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()
