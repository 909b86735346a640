"""From the model's raw outputs to each page's candidate boxes: a port of transformers'
`PPDocLayoutV3ImageProcessor.post_process_object_detection` (transformers 5.19,
models/pp_doclayout_v3/image_processing_pp_doclayout_v3.py), which PaddleX's own transformers
engine for PP-DocLayoutV3 calls before its layout post-processing
(paddlex/inference/models/layout_analysis/predictor.py, LayoutAnalysisTransformersPredictor).

It is a port, not a call, because that image processor class needs torchvision, which the engine
venv leaves out. The steps and their order are transformers' own, so ties break the same way;
tests/engine/test_layout_postprocess.py runs transformers' code beside this one on the same
outputs. Two changes, both for the service: each page may have its own threshold (a request's),
and only the masks of the boxes kept are read back from the device.
"""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np
import torch


@dataclass(frozen=True)
class RawOutputs:
    """PPDocLayoutV3ForObjectDetection's outputs for a batch (logits, boxes, order in float32)."""

    logits: torch.Tensor  # (B, Q, C)
    pred_boxes: torch.Tensor  # (B, Q, 4) cx, cy, w, h in [0, 1]
    order_logits: torch.Tensor  # (B, Q, Q)
    out_masks: torch.Tensor  # (B, Q, h, w) mask logits at a quarter of the input size


@dataclass(frozen=True)
class Candidates:
    """One page's boxes at or above its threshold, in the model's reading order."""

    scores: np.ndarray  # (N,) float32
    labels: np.ndarray  # (N,) int64
    boxes: np.ndarray  # (N, 4) float32, x1 y1 x2 y2 in the page's pixels
    order: np.ndarray  # (N,) int64, the reading-order rank of each box's query
    masks: np.ndarray  # (N, h, w) binary masks (sigmoid > threshold)
    width: int
    height: int
    input_size: tuple[int, int]  # the model's (width, height): masks are a quarter of it


def order_sequences(order_logits: torch.Tensor) -> torch.Tensor:
    """Each query's reading-order rank (transformers' `_get_order_seqs`)."""
    order_scores = torch.sigmoid(order_logits)
    batch_size, sequence_length, _ = order_scores.shape
    order_votes = order_scores.triu(diagonal=1).sum(dim=1) + (
        1.0 - order_scores.transpose(1, 2)
    ).tril(diagonal=-1).sum(dim=1)
    order_pointers = torch.argsort(order_votes, dim=1)
    order_seq = torch.empty_like(order_pointers)
    ranks = torch.arange(
        sequence_length, device=order_pointers.device, dtype=order_pointers.dtype
    ).expand(batch_size, -1)
    order_seq.scatter_(1, order_pointers, ranks)
    return order_seq


def candidates(
    raw: RawOutputs,
    sizes: list[tuple[int, int]],
    thresholds: list[float],
    input_size: tuple[int, int],
) -> list[Candidates]:
    """Every page's candidates; `sizes` are the pages' (width, height) as sent, `input_size`
    the model's."""
    order_seqs = order_sequences(raw.order_logits)
    centers, dims = torch.split(raw.pred_boxes, 2, dim=-1)
    boxes = torch.cat([centers - 0.5 * dims, centers + 0.5 * dims], dim=-1)
    scale = torch.tensor([[w, h, w, h] for w, h in sizes], dtype=torch.int64, device=boxes.device)
    boxes = boxes * scale[:, None, :]
    num_queries, num_classes = raw.logits.shape[1], raw.logits.shape[2]
    scores, index = torch.topk(torch.sigmoid(raw.logits).flatten(1), num_queries, dim=-1)
    labels = index % num_classes
    index = index // num_classes
    boxes = boxes.gather(dim=1, index=index.unsqueeze(-1).repeat(1, 1, boxes.shape[-1]))
    order_seqs = order_seqs.gather(dim=1, index=index)
    found = []
    for page, ((width, height), threshold) in enumerate(zip(sizes, thresholds, strict=True)):
        keep = scores[page] >= threshold
        masks = raw.out_masks[page, index[page][keep]].float().sigmoid() > threshold
        order, indices = torch.sort(order_seqs[page][keep].cpu())
        found.append(
            Candidates(
                scores=scores[page][keep].cpu()[indices].numpy(),
                labels=labels[page][keep].cpu()[indices].numpy(),
                boxes=boxes[page][keep].cpu()[indices].numpy(),
                order=order.numpy(),
                masks=masks.to(torch.uint8).cpu()[indices].numpy(),
                width=width,
                height=height,
                input_size=input_size,
            )
        )
    return found


def polygons(found: Candidates) -> list[np.ndarray | None]:
    """Each box's outline from its mask (transformers' `_extract_polygon_points_by_masks`); the
    box's rectangle where the mask says nothing, None where its contour vanishes."""
    # transformers computes the mask scale as 0-d float32 tensors (size / target size, / 4) and
    # multiplies numpy int32 corners by them: the same types here give the same rounding.
    scale_width = (found.input_size[0] / torch.tensor(found.width)) / 4
    scale_height = (found.input_size[1] / torch.tensor(found.height)) / 4
    mask_height, mask_width = found.masks.shape[1:]
    out: list[np.ndarray | None] = []
    for box, mask in zip(found.boxes, found.masks, strict=True):
        x_min, y_min, x_max, y_max = box.astype(np.int32)
        box_w, box_h = x_max - x_min, y_max - y_min
        rect = np.array(
            [[x_min, y_min], [x_max, y_min], [x_max, y_max], [x_min, y_max]], dtype=np.float32
        )
        if box_w <= 0 or box_h <= 0:
            out.append(rect)
            continue
        x_start, x_end = np.clip(
            [round((x_min * scale_width).item()), round((x_max * scale_width).item())],
            0,
            mask_width,
        )
        y_start, y_end = np.clip(
            [round((y_min * scale_height).item()), round((y_max * scale_height).item())],
            0,
            mask_height,
        )
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
