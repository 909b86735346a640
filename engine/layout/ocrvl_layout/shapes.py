"""A box's outline by `layout_shape_mode`: PaddleX's `_normalize_layout_polygon` and
`convert_polygon_to_quad` (paddlex/inference/models/layout_analysis/processors.py, PaddleX 3.7).

PaddleX measures polygon overlap with shapely (`calculate_polygon_overlap_ratio`); the engine
venv has no shapely, and every overlap asked here has one convex side (a box's rectangle, or the
quad fitted around the outline), so the intersection is the other polygon clipped by the convex
one (Sutherland-Hodgman) and the areas are the shoelace's: what shapely computes for simple
polygons. An outline that crosses itself (shapely first repairs it with `buffer(0)`) is measured
as drawn, and two empty shapes overlap by 0 where PaddleX divides by zero.
"""

from __future__ import annotations

import cv2
import numpy as np

SHAPE_MODES = ("rect", "quad", "poly", "auto")  # PaddleX's layout_shape_mode values


def rect_of(box: np.ndarray) -> np.ndarray:
    """The box's corners, clockwise from the top left (PaddleX's `_rect_from_box`)."""
    x_min, y_min, x_max, y_max = np.asarray(box).astype(np.int32)
    return np.array(
        [[x_min, y_min], [x_max, y_min], [x_max, y_max], [x_min, y_max]], dtype=np.float32
    )


def outline(
    box: np.ndarray, polygon: np.ndarray | None, mode: str, previous: np.ndarray | None
) -> np.ndarray:
    """The outline PaddleX keeps for `box` (x1 y1 x2 y2) and its mask `polygon` under `mode`;
    `previous` is the outline kept for the box before it in reading order."""
    rect = rect_of(box)
    if polygon is None:
        return rect
    polygon = np.asarray(polygon, dtype=np.float32)
    if polygon.ndim == 1:
        polygon = polygon.reshape(-1, 2)
    if len(polygon) < 4 or mode == "rect":
        return rect
    if mode == "poly":
        return polygon
    quad = quad_of(polygon)
    if mode == "quad":
        return quad if quad is not None else rect
    if mode != "auto":
        raise ValueError(f"layout_shape_mode must be one of {SHAPE_MODES}; got {mode!r}")
    return polygon if quad is None else _auto(rect, polygon, quad, previous)


def _auto(
    rect: np.ndarray, polygon: np.ndarray, quad: np.ndarray, previous: np.ndarray | None
) -> np.ndarray:
    """ "auto": the rectangle when the fitted quad is nearly it; the quad when it fits the
    outline well and the box before does not reach into this one; else the outline."""
    if overlap(rect, quad, "union") >= 0.95:
        return rect
    previous_overlap = 0.0 if previous is None else overlap(previous, rect, "small")
    if overlap(polygon, quad, "union") >= 0.8 and previous_overlap < 0.01:
        return quad
    return polygon


def quad_of(polygon: np.ndarray) -> np.ndarray | None:
    """The minimum-area rectangle around `polygon`, clockwise from the top-left corner."""
    if polygon is None or len(polygon) < 3:
        return None
    points = np.array(polygon, dtype=np.float32)
    if len(points.shape) == 1:
        points = points.reshape(-1, 2)
    quad = cv2.boxPoints(cv2.minAreaRect(points))
    center = quad.mean(axis=0)
    angles = np.arctan2(quad[:, 1] - center[1], quad[:, 0] - center[0])
    quad = quad[np.argsort(angles)]
    return np.roll(quad, -np.argmin(quad[:, 0] + quad[:, 1]), axis=0)


def overlap(first: np.ndarray, second: np.ndarray, mode: str) -> float:
    """Intersection over the union, the smaller or the larger area; one side must be convex."""
    a = np.asarray(first, dtype=np.float64).reshape(-1, 2)
    b = np.asarray(second, dtype=np.float64).reshape(-1, 2)
    area_a, area_b = _area(a), _area(b)
    clipper, subject = (b, a) if _is_convex(b) else (a, b)
    intersection = _area(_clip(subject, clipper))
    reference = {
        "union": area_a + area_b - intersection,
        "small": min(area_a, area_b),
        "large": max(area_a, area_b),
    }[mode]
    return intersection / reference if reference > 0 else 0.0


def _area(points: np.ndarray) -> float:
    if len(points) < 3:
        return 0.0
    x, y = points[:, 0], points[:, 1]
    return float(abs(np.dot(x, np.roll(y, -1)) - np.dot(y, np.roll(x, -1))) / 2)


def _cross(o: np.ndarray, a: np.ndarray, b: np.ndarray) -> float:
    return float((a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0]))


def _is_convex(points: np.ndarray) -> bool:
    n = len(points)
    signs = {np.sign(_cross(points[i], points[(i + 1) % n], points[(i + 2) % n])) for i in range(n)}
    return len(signs - {0.0}) <= 1


def _clip(subject: np.ndarray, clipper: np.ndarray) -> np.ndarray:
    """`subject` clipped by the convex polygon `clipper` (Sutherland-Hodgman)."""
    n = len(clipper)
    orientation = np.sign(
        sum(_cross(clipper[0], clipper[i], clipper[(i + 1) % n]) for i in range(1, n - 1))
    )
    if orientation == 0:  # an empty clipper
        return np.zeros((0, 2))
    output = list(subject)
    for i in range(n):
        edge_start, edge_end = clipper[i], clipper[(i + 1) % n]
        points, output = output, []
        for j, current in enumerate(points):
            previous = points[j - 1]
            inside_now = orientation * _cross(edge_start, edge_end, current) >= 0
            inside_before = orientation * _cross(edge_start, edge_end, previous) >= 0
            if inside_now != inside_before:
                output.append(_crossing(previous, current, edge_start, edge_end))
            if inside_now:
                output.append(current)
        if not output:
            break
    return np.array(output).reshape(-1, 2)


def _crossing(p: np.ndarray, q: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Where segment p-q crosses the line through a and b."""
    side_p, side_q = _cross(a, b, p), _cross(a, b, q)
    point: np.ndarray = p + (q - p) * (side_p / (side_p - side_q))
    return point
