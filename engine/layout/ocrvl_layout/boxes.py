"""One page's candidate boxes and each box's outline from its mask: numpy and OpenCV only, so the
worker processes that post-process pages (workers.py) never import torch.

`polygons` is transformers' `_extract_polygon_points_by_masks` (transformers 5.19,
models/pp_doclayout_v3/image_processing_pp_doclayout_v3.py), step for step; detections.py makes
the candidates from the model's outputs.
"""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np


@dataclass(frozen=True)
class Candidates:
    """One page's boxes at or above its threshold, in the model's reading order."""

    scores: np.ndarray  # (N,) float32
    labels: np.ndarray  # (N,) int64
    boxes: np.ndarray  # (N, 4) float32, x1 y1 x2 y2 in the page's pixels
    order: np.ndarray  # (N,) int64, the reading-order rank of each box's query
    masks: np.ndarray  # (N, h, ceil(w / 8)) the binary masks (sigmoid > threshold), np.packbits'
    mask_width: int  # w: the masks' width before packing
    width: int
    height: int
    input_size: tuple[int, int]  # the model's (width, height): masks are a quarter of it


def polygons(found: Candidates) -> list[np.ndarray | None]:
    """Each box's outline from its mask (transformers' `_extract_polygon_points_by_masks`); the
    box's rectangle where the mask says nothing, None where its contour vanishes."""
    scale_width = _mask_scale(found.input_size[0], found.width)
    scale_height = _mask_scale(found.input_size[1], found.height)
    mask_height, mask_width = found.masks.shape[1], found.mask_width
    out: list[np.ndarray | None] = []
    for box, packed in zip(found.boxes, found.masks, strict=True):
        mask = np.unpackbits(packed, axis=-1, count=mask_width)
        x_min, y_min, x_max, y_max = box.astype(np.int32)
        box_w, box_h = x_max - x_min, y_max - y_min
        rect = np.array(
            [[x_min, y_min], [x_max, y_min], [x_max, y_max], [x_min, y_max]], dtype=np.float32
        )
        if box_w <= 0 or box_h <= 0:
            out.append(rect)
            continue
        x_start, x_end = np.clip([_scaled(x_min, scale_width), _scaled(x_max, scale_width)],
                                 0, mask_width)  # fmt: skip
        y_start, y_end = np.clip([_scaled(y_min, scale_height), _scaled(y_max, scale_height)],
                                 0, mask_height)  # fmt: skip
        cropped = mask[y_start:y_end, x_start:x_end]
        if cropped.size == 0 or np.sum(cropped) == 0:
            out.append(rect)
            continue
        resized = cv2.resize(cropped, (box_w, box_h), interpolation=cv2.INTER_NEAREST)
        polygon = _mask_to_polygon(resized)
        if polygon is not None and len(polygon) < 4:
            out.append(rect)
            continue
        out.append(polygon + np.array([x_min, y_min]) if polygon is not None else None)
    return out


def _mask_scale(input_size: int, size: int) -> np.float32:
    """transformers' mask scale, `(input_size / torch.tensor(size)) / 4`, in numpy float32 with
    torch's rounding: torch divides a scalar by a tensor as the scalar times the tensor's
    reciprocal, each step rounded to float32 (equal to torch's for every size 1 to 5,000 and
    the corners in it, and a sample to 40,000), and multiplies a corner as float32."""
    return (np.float32(input_size) * (np.float32(1) / np.float32(size))) / np.float32(4)


def _scaled(corner: np.int32, scale: np.float32) -> int:
    """A box corner in mask pixels, as transformers rounds it (float32, Python's round)."""
    return round(float(np.float32(corner) * scale))


def _mask_to_polygon(mask: np.ndarray, epsilon_ratio: float = 0.004) -> np.ndarray | None:
    """The largest outer contour, simplified (transformers' `_mask2polygon`)."""
    contours, _ = cv2.findContours(mask, cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)
    if not contours:
        return None
    contour = max(contours, key=cv2.contourArea)
    epsilon = epsilon_ratio * cv2.arcLength(contour, True)
    points = np.atleast_2d(cv2.approxPolyDP(contour, epsilon, True).squeeze())
    return np.array(_custom_vertices(points)).reshape(-1, 2)


def _custom_vertices(polygon: np.ndarray, sharp_angle: float = 45) -> list[tuple[float, ...]]:
    """The convex corners, a 45-degree one pushed out along its bisector (transformers'
    `extract_custom_vertices`)."""
    poly = np.array(polygon)
    n = len(poly)
    res = []
    for i in range(n):
        previous_point, current_point, next_point = poly[(i - 1) % n], poly[i], poly[(i + 1) % n]
        vector_1 = previous_point - current_point
        vector_2 = next_point - current_point
        cross_product_value = (vector_1[1] * vector_2[0]) - (vector_1[0] * vector_2[1])
        if cross_product_value >= 0:
            continue
        norms = np.linalg.norm(vector_1) * np.linalg.norm(vector_2)
        angle = np.degrees(np.arccos(np.clip((vector_1 @ vector_2) / norms, -1.0, 1.0)))
        if abs(angle - sharp_angle) < 1:
            direction = vector_1 / np.linalg.norm(vector_1) + vector_2 / np.linalg.norm(vector_2)
            direction = direction / np.linalg.norm(direction)
            step = (np.linalg.norm(vector_1) + np.linalg.norm(vector_2)) / 2
            res.append(tuple(current_point + direction * step))
        else:
            res.append(tuple(current_point))
    return res
