"""From the model's raw outputs to each page's candidate boxes: a port of transformers'
`PPDocLayoutV3ImageProcessor.post_process_object_detection` (transformers 5.19,
models/pp_doclayout_v3/image_processing_pp_doclayout_v3.py), which PaddleX's own transformers
engine for PP-DocLayoutV3 calls before its layout post-processing
(paddlex/inference/models/layout_analysis/predictor.py, LayoutAnalysisTransformersPredictor).

It is a port, not a call, because that image processor class needs torchvision, which the engine
venv leaves out. The steps and their order are transformers' own, so ties break the same way;
tests/engine/test_layout_postprocess.py runs transformers' code beside this one on the same
outputs. Three changes, all for the service: each page may have its own threshold (a request's),
only the masks of the boxes kept are read back from the device, packed to bits (an eighth of
the bytes to copy and to pickle to a worker), and a batch's pages are chosen on the host from
one copy of its scores (one gather of the kept masks, not a few copies a page). The candidates
and their outlines (torch-free, for the worker processes) are boxes.py's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ocrvl_layout.boxes import Candidates, polygons


@dataclass(frozen=True)
class RawOutputs:
    """PPDocLayoutV3ForObjectDetection's outputs for a batch (logits, boxes, order in float32)."""

    logits: torch.Tensor  # (B, Q, C)
    pred_boxes: torch.Tensor  # (B, Q, 4) cx, cy, w, h in [0, 1]
    order_logits: torch.Tensor  # (B, Q, Q)
    out_masks: torch.Tensor  # (B, Q, h, w) mask logits at a quarter of the input size


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


def pack_bits(bits: torch.Tensor) -> torch.Tensor:
    """(N, h, w) booleans as np.packbits packs them along the last axis, on their device: the
    masks cross to the host, and to the worker processes, in an eighth of the bytes."""
    count, height, width = bits.shape
    padded = torch.nn.functional.pad(bits.to(torch.uint8), (0, -width % 8))
    weights = torch.tensor([128, 64, 32, 16, 8, 4, 2, 1], dtype=torch.uint8, device=bits.device)
    bytes_wide = padded.shape[-1] // 8
    return (padded.view(count, height, bytes_wide, 8) * weights).sum(-1, dtype=torch.uint8)


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
    # The batch's small tensors to the host at once, each page's choice made there, and only
    # the kept masks read back, in one gather: a few device round trips a batch, not a few a
    # page (each one a GIL hand-off in the service's forward thread).
    scores, labels, boxes, order_seqs, index = (
        t.cpu() for t in (scores, labels, boxes, order_seqs, index)
    )
    kept, pages, queries = [], [], []
    for page, threshold in enumerate(thresholds):
        keep = scores[page] >= threshold
        order, indices = torch.sort(order_seqs[page][keep])
        kept.append((keep, order, indices))
        pages.append(torch.full((len(indices),), page))
        queries.append(index[page][keep][indices])
    device = raw.out_masks.device  # (page, query) pairs index the masks without a copy of all
    page_of = torch.cat(pages)
    picked = raw.out_masks[page_of.to(device), torch.cat(queries).to(device)].float().sigmoid()
    limit = torch.tensor(thresholds, dtype=torch.float32)[page_of].to(device)  # each its page's
    bits = picked > limit[:, None, None]
    if bits.device.type == "cpu":  # numpy packs ten times faster than torch's ops on a CPU
        masks = np.packbits(bits.numpy(), axis=-1)
    else:
        masks = pack_bits(bits).cpu().numpy()
    found, start = [], 0
    for page, ((width, height), (keep, order, indices)) in enumerate(zip(sizes, kept, strict=True)):
        end = start + len(indices)
        found.append(
            Candidates(
                scores=scores[page][keep][indices].numpy(),
                labels=labels[page][keep][indices].numpy(),
                boxes=boxes[page][keep][indices].numpy(),
                order=order.numpy(),
                masks=masks[start:end],
                mask_width=raw.out_masks.shape[-1],
                width=width,
                height=height,
                input_size=input_size,
            )
        )
        start = end
    return found


__all__ = ["Candidates", "RawOutputs", "candidates", "order_sequences", "pack_bits", "polygons"]
