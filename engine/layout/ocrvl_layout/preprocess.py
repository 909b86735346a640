"""A page's document preprocessing, as PaddleX's `DocPreprocessor` runs it: the orientation
classified and the page turned upright, then the page flattened; each step only when asked.

The models are the layout service's (orientation.py, unwarping.py), loaded from their own
checkpoint folders beside the layout model, on its device; a request's pages go through each
step in one forward pass, in the thread that runs the layout model's batches (Batcher.exclusive).
"""

from __future__ import annotations

import base64
import io
import logging
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import torch
from PIL import Image

from ocrvl_layout.errors import NotLoaded
from ocrvl_layout.model import CheckpointError
from ocrvl_layout.orientation import OrientationModel, turned
from ocrvl_layout.unwarping import UnwarpingModel

log = logging.getLogger("ocrvl_layout")
M = TypeVar("M", OrientationModel, UnwarpingModel)


@dataclass(frozen=True)
class Corrected:
    """One page after preprocessing: its pixels, its angle (None: not classified), and whether
    it differs from the page sent."""

    pixels: np.ndarray
    angle: int | None
    changed: bool

    def shown(self) -> dict[str, object]:
        """What the page's result adds: `angle` when classified, `image` when changed."""
        extra: dict[str, object] = {}
        if self.angle is not None:
            extra["angle"] = self.angle
        if self.changed:
            extra["image"] = png_url(self.pixels)
        return extra


class Preprocessor:
    """The preprocessing models this service was started with (either may be absent). A
    checkpoint that does not load leaves its step out, said in the log and in the refusal of a
    request that asks for it: the layout model serves on (the steps are optional)."""

    def __init__(
        self, orientation: str | None, unwarping: str | None, device: torch.device,
        dtype: torch.dtype,
    ) -> None:  # fmt: skip
        self.problems: dict[str, str] = {}
        self.orientation = self._load(OrientationModel, orientation, "orientation", device, dtype)
        self.unwarping = self._load(UnwarpingModel, unwarping, "unwarp", device, dtype)

    def _load(
        self, kind: type[M], checkpoint: str | None, name: str, device: torch.device,
        dtype: torch.dtype,
    ) -> M | None:  # fmt: skip
        if not checkpoint:
            return None
        try:
            return kind(checkpoint, device, dtype)
        except CheckpointError as error:
            log.warning("`%s` is left out: %s", name, error)
            self.problems[name] = str(error)
            return None

    def describe(self) -> str:
        """What it runs, for the ready line ("" when nothing)."""
        parts = []
        if self.orientation is not None:
            parts.append(f"PP-LCNet orientation ({self.orientation.parameters / 1e6:.1f} M)")
        if self.unwarping is not None:
            parts.append(f"UVDoc unwarping ({self.unwarping.parameters / 1e6:.1f} M)")
        return ", ".join(parts)

    def require(self, orientation: bool, unwarp: bool) -> None:
        """NotLoaded (400, naming the field) for a step this service has no model for."""
        for asked, model, name, flag in (
            (orientation, self.orientation, "orientation", "--orientation-model"),
            (unwarp, self.unwarping, "unwarp", "--unwarping-model"),
        ):
            if asked and model is None:
                why = self.problems.get(name, f"it was started without a model for it ({flag})")
                raise NotLoaded(
                    f"`{name}` is not available on this layout service: {why}; send the "
                    "request without it",
                    param=name,
                )

    def correct(self, pages: list[np.ndarray], orientation: bool, unwarp: bool) -> list[Corrected]:
        """Each page turned upright (when `orientation`) and flattened (when `unwarp`)."""
        angles: list[int | None] = [None] * len(pages)
        if orientation and self.orientation is not None:
            angles = list(self.orientation.angles_of(pages))
            pages = [turned(page, angle or 0) for page, angle in zip(pages, angles, strict=True)]
        if unwarp and self.unwarping is not None:
            pages = self.unwarping.unwarp(pages)
        return [
            Corrected(page, angle, unwarp or bool(angle))
            for page, angle in zip(pages, angles, strict=True)
        ]

    def warm_up(self) -> None:
        """One blank page through each model."""
        blank = np.full((64, 48, 3), 255, dtype=np.uint8)
        self.correct([blank], self.orientation is not None, self.unwarping is not None)


def png_url(pixels: np.ndarray) -> str:
    """The page as a PNG data URL: lossless, so the crops the gateway cuts from it are the
    pixels the layout model saw."""
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG", compress_level=1)
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode("ascii")
