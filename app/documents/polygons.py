"""Polygons of layout boxes, in pure Python (the gateway has no shapely).

    area(points)          the area of a simple polygon (shoelace)
    overlap_small(a, b)   shapely's `a ∩ b` area over the smaller area: PaddleX's
                          `calculate_polygon_overlap_ratio(a, b, "small")`

`overlap_small` triangulates both polygons (ear clipping) and sums the clipped areas of every
pair of triangles, exact for simple polygons; a self-intersecting one (shapely would repair it
with `buffer(0)`) gives None and the caller falls back to the boxes.
"""

from __future__ import annotations

from collections.abc import Sequence

Point = tuple[float, float]


def area(points: Sequence[Point]) -> float:
    """The area of a simple polygon (shoelace; orientation ignored); 0 for fewer than 3."""
    if len(points) < 3:
        return 0.0
    total = 0.0
    for (x1, y1), (x2, y2) in zip(points, [*points[1:], points[0]], strict=True):
        total += x1 * y2 - x2 * y1
    return abs(total) / 2


def overlap_small(a: Sequence[Point], b: Sequence[Point]) -> float | None:
    """Area of `a` ∩ `b` over the smaller of their areas; None when either polygon is not
    simple (shapely would repair it first, which this does not attempt)."""
    ta, tb = _triangles(a), _triangles(b)
    if ta is None or tb is None:
        return None
    small = min(area(a), area(b))
    if small <= 0:
        return 0.0  # PaddleX would divide by zero; no overlap is the harmless reading
    shared = sum(area(_clip_convex(s, t)) for s in ta for t in tb if _bounds_meet(s, t))
    return shared / small


def _signed(points: Sequence[Point]) -> float:
    total = 0.0
    for (x1, y1), (x2, y2) in zip(points, [*points[1:], points[0]], strict=True):
        total += x1 * y2 - x2 * y1
    return total / 2


def _cross(o: Point, a: Point, b: Point) -> float:
    return (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0])


def _triangles(points: Sequence[Point]) -> list[list[Point]] | None:
    """Ear clipping of a simple polygon (counter-clockwise triangles); None if not simple."""
    polygon = [(float(x), float(y)) for x, y in points]
    polygon = [p for i, p in enumerate(polygon) if p != polygon[i - 1]]  # repeated points
    if len(polygon) < 3 or _self_intersecting(polygon):
        return None if len(polygon) >= 3 else []
    if _signed(polygon) < 0:
        polygon.reverse()
    triangles: list[list[Point]] = []
    while len(polygon) > 3:
        for i in range(len(polygon)):
            a, b, c = polygon[i - 1], polygon[i], polygon[(i + 1) % len(polygon)]
            if _cross(a, b, c) <= 0:
                if _cross(a, b, c) == 0:  # a straight or spiked vertex: drop it
                    del polygon[i]
                    break
                continue
            if any(_inside(p, a, b, c) for p in polygon if p not in (a, b, c)):
                continue
            triangles.append([a, b, c])
            del polygon[i]
            break
        else:
            return None  # no ear: numerically degenerate
    if len(polygon) == 3 and _cross(*polygon) > 0:
        triangles.append(polygon)
    return triangles


def _inside(p: Point, a: Point, b: Point, c: Point) -> bool:
    return _cross(a, b, p) >= 0 and _cross(b, c, p) >= 0 and _cross(c, a, p) >= 0


def _self_intersecting(polygon: list[Point]) -> bool:
    sides = list(zip(polygon, [*polygon[1:], polygon[0]], strict=True))
    for i, (p1, p2) in enumerate(sides):
        for j in range(i + 2, len(sides)):
            if i == 0 and j == len(sides) - 1:
                continue  # neighbours share a point
            q1, q2 = sides[j]
            d1, d2 = _cross(p1, p2, q1), _cross(p1, p2, q2)
            d3, d4 = _cross(q1, q2, p1), _cross(q1, q2, p2)
            if ((d1 > 0) != (d2 > 0) and d1 and d2) and ((d3 > 0) != (d4 > 0) and d3 and d4):
                return True
    return False


def _bounds_meet(s: list[Point], t: list[Point]) -> bool:
    return (
        min(p[0] for p in s) < max(p[0] for p in t)
        and min(p[0] for p in t) < max(p[0] for p in s)
        and min(p[1] for p in s) < max(p[1] for p in t)
        and min(p[1] for p in t) < max(p[1] for p in s)
    )


def _clip_convex(subject: list[Point], clipper: list[Point]) -> list[Point]:
    """Sutherland-Hodgman: `subject` clipped by the convex, counter-clockwise `clipper`."""
    output = subject
    for a, b in zip(clipper, [*clipper[1:], clipper[0]], strict=True):
        if not output:
            return []
        points, output = output, []
        for p, q in zip([points[-1], *points[:-1]], points, strict=True):
            p_in, q_in = _cross(a, b, p) >= 0, _cross(a, b, q) >= 0
            if q_in:
                if not p_in:
                    output.append(_meet(p, q, a, b))
                output.append(q)
            elif p_in:
                output.append(_meet(p, q, a, b))
    return output if len(output) >= 3 else []


def _meet(p: Point, q: Point, a: Point, b: Point) -> Point:
    """Where segment p-q crosses the line a-b."""
    dp, dq = _cross(a, b, p), _cross(a, b, q)
    t = dp / (dp - dq)
    return (p[0] + t * (q[0] - p[0]), p[1] + t * (q[1] - p[1]))
