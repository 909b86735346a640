"""PP-DocLayoutV3 through transformers' own model class: loaded, placed, warmed, run on batches."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from transformers import PPDocLayoutV3ForObjectDetection

from ocrvl_layout.detections import Candidates, RawOutputs, candidates
from ocrvl_layout.graphs import GraphedForward, capturable, cuda_capture, sizes_for
from ocrvl_layout.images import Preprocessing

log = logging.getLogger("ocrvl_layout")


# PaddleX's label list for PP-DocLayoutV2 and V3, the names its pipeline works with
# (paddlex/modules/base/utils/pdparams2safetensors/inference_meta.py, _LABEL_DOC_LAYOUT_V2V3)
PADDLEX_LABELS = (
    "abstract", "algorithm", "aside_text", "chart", "content", "display_formula", "doc_title",
    "figure_title", "footer", "footer_image", "footnote", "formula_number", "header",
    "header_image", "image", "inline_formula", "number", "paragraph_title", "reference",
    "reference_content", "seal", "table", "text", "vertical_text", "vision_footnote",
)  # fmt: skip


def gpu_memory() -> dict[str, int]:
    """torch's CUDA caching allocator on this process's current device, in bytes: what tensors
    hold now (`allocated`) and at most since the start (`max_allocated`), what the allocator
    holds from the driver now and at most (`reserved`, `max_reserved`); empty before CUDA is
    initialised (the CPU, or a GPU model still loading). The CUDA context itself is in neither:
    nvidia-smi's per-process memory is reserved plus the context."""
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return {}
    return {
        "allocated": torch.cuda.memory_allocated(),
        "max_allocated": torch.cuda.max_memory_allocated(),
        "reserved": torch.cuda.memory_reserved(),
        "max_reserved": torch.cuda.max_memory_reserved(),
    }


class CheckpointError(RuntimeError):
    """The folder is not a PP-DocLayoutV3 checkpoint transformers can load."""


def labels_of(folder: Path, config_labels: list[str]) -> list[str]:
    """The label names by class id, as PaddleX resolves them (`_resolve_labels`): the
    `label_list` of the folder's inference.yml, else config.json's id2label.

    PaddleX's converter writes an id2label that repeats names (formula, footer, header, text;
    inference.yml's label_list tells them apart, as display_formula and inline_formula, ...):
    such an id2label of 25 names, without its inference.yml, is read as PaddleX's list."""
    path = folder / "inference.yml"
    listed = (yaml.safe_load(path.read_text()) or {}).get("label_list") if path.is_file() else None
    if listed:
        labels = [str(label) for label in listed]
    elif len(set(config_labels)) < len(config_labels) == len(PADDLEX_LABELS):
        log.warning("%s: id2label repeats names and there is no inference.yml: using "
                    "PaddleX's PP-DocLayoutV3 labels", folder)  # fmt: skip
        labels = list(PADDLEX_LABELS)
    else:
        labels = config_labels
    if len(labels) != len(config_labels):
        raise CheckpointError(
            f"{folder}: inference.yml names {len(labels)} labels, the model has "
            f"{len(config_labels)}"
        )
    return labels


def checkpoint_folder(name: str) -> Path:
    """The checkpoint's folder: `name` itself, or a Hugging Face repo id's snapshot (from the
    cache, or fetched into it when the hub is reachable and HF_HUB_OFFLINE is not set)."""
    folder = Path(name)
    if folder.is_dir():
        return folder
    if folder.exists() or name.count("/") != 1:
        raise CheckpointError(f"{name} is neither a checkpoint folder nor a Hugging Face repo id")
    from huggingface_hub import snapshot_download  # noqa: PLC0415  (only for a repo id)

    try:
        files = ["*.json", "*.safetensors", "*.yml"]
        return Path(snapshot_download(repo_id=name, allow_patterns=files))
    except Exception as error:  # offline and not cached, unknown repo, no network
        raise CheckpointError(
            f"{name} is no folder here and the Hugging Face hub did not give it: {error}"
        ) from error


def pretrained(loader: Any, checkpoint: str, dtype: torch.dtype, kind: str, name: str) -> Any:
    """`loader.from_pretrained` on the checkpoint's folder, which must hold a `kind` model
    (`name` in the message); CheckpointError naming the folder otherwise."""
    folder = checkpoint_folder(checkpoint)
    try:
        model = loader.from_pretrained(folder, dtype=dtype)
    except (OSError, ValueError, KeyError) as error:
        raise CheckpointError(f"{folder}: {error}") from error
    if model.config.model_type != kind:
        raise CheckpointError(f"{folder} holds a {model.config.model_type}, not {name}")
    return model


def place(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """`model` on `device`, in eval mode (transformers' wrappers of both are typed loosely)."""
    model.to(device)
    return model.eval()


@dataclass(frozen=True)
class BatchPage:
    """One page of a batch: its resized pixels, the size it was sent at, its score threshold."""

    pixels: np.ndarray  # (H, W, 3) uint8 at the model's input size
    width: int
    height: int
    threshold: float  # transformers' post-processing threshold (0.0 for per-class thresholds)


class LayoutModel:
    """The detector on its device, and the labels it names."""

    def __init__(
        self, checkpoint: str | Path, device: str = "auto", *, compile: bool = False
    ) -> None:
        folder = checkpoint_folder(str(checkpoint))
        if not (folder / "config.json").is_file():
            raise CheckpointError(f"{folder} has no config.json: not a transformers checkpoint")
        self.device = torch.device(
            "cuda"
            if device == "auto" and torch.cuda.is_available()
            else ("cpu" if device == "auto" else device)
        )
        # bf16 on a GPU (its tensor cores), fp32 on a CPU (bf16 matmuls there are slower)
        self.dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        try:
            model = PPDocLayoutV3ForObjectDetection.from_pretrained(folder, dtype=self.dtype)
        except (OSError, ValueError, KeyError) as error:
            raise CheckpointError(f"{folder}: {error}") from error
        if model.config.model_type != "pp_doclayout_v3":
            raise CheckpointError(f"{folder} holds a {model.config.model_type}, not PP-DocLayoutV3")
        # transformers' wrappers of `to` and `eval` are typed loosely
        model.to(self.device)  # type: ignore[arg-type]
        self.model = model.eval()  # type: ignore[no-untyped-call]
        self.forward = torch.compile(self.model) if compile else self.model
        id2label = {int(k): str(v) for k, v in (model.config.id2label or {}).items()}
        self.labels = labels_of(folder, [id2label[i] for i in sorted(id2label)])
        self.preprocessing = Preprocessing.of_checkpoint(folder)
        self.scaling = self.preprocessing.scaling(self.device)
        self.parameters = sum(p.numel() for p in self.model.parameters())
        self.compiled = compile
        self.graphed: GraphedForward | None = None
        self.graphs = "off"  # what describe() says of CUDA graphs

    def describe(self) -> str:
        """One line for the log: what runs where."""
        return (
            f"PP-DocLayoutV3 ({self.parameters / 1e6:.1f} M parameters, {len(self.labels)} labels)"
            f" on {self.device.type}, {str(self.dtype).removeprefix('torch.')}, input "
            f"{self.preprocessing.width}x{self.preprocessing.height}, CUDA graphs {self.graphs}"
        )

    def capture(self, max_batch: int, *, wanted: bool = True) -> str:
        """CUDA graphs of the forward pass at every size a batch of up to `max_batch` runs in
        (graphs.py), after the warm-up; eager where they are not `wanted` (--no-cuda-graphs) or
        cannot be (not a GPU, --compile) or where a capture fails or differs from the eager
        pass (logged). What describe() says."""
        if not wanted:
            self.graphs = "off (--no-cuda-graphs)"
        elif self.device.type != "cuda":
            self.graphs = "off (not on a GPU)"
        elif self.compiled:
            self.graphs = "off (--compile)"
        else:
            prep = self.preprocessing
            sample = torch.randint(
                0, 256, (1, prep.height, prep.width, 3), dtype=torch.uint8, device=self.device,
                generator=torch.Generator(self.device).manual_seed(0),
            )  # fmt: skip
            sizes = sizes_for(max_batch)
            capturable()
            try:
                with torch.inference_mode():
                    self.graphed = GraphedForward(self.run, sample, sizes,
                                                  cuda_capture(self.device))  # fmt: skip
                self.graphs = f"at batches {','.join(map(str, sizes))}"
            except (RuntimeError, ValueError) as error:  # OutOfMemoryError is a RuntimeError
                self.graphed = None
                self.graphs = f"off (the capture failed: {str(error)[:200]})"
                log.warning(
                    "CUDA graphs of the layout model: %s; it runs eager", error, exc_info=True
                )  # where in the pass: the next run's fix
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()
        return self.graphs

    def warm_up(self, batch_sizes: tuple[int, ...] = (1,)) -> float:
        """Run blank pages through every batch size given; the seconds it took."""
        started = time.monotonic()
        prep = self.preprocessing
        blank = np.full((prep.height, prep.width, 3), 255, dtype=np.uint8)
        for size in batch_sizes:
            self.detect([BatchPage(blank, prep.width, prep.height, 0.3)] * size)
        return time.monotonic() - started

    @torch.inference_mode()
    def detect(self, pages: list[BatchPage]) -> list[Candidates]:
        """One forward pass over `pages`, and each page's candidate boxes (transformers'
        post_process_object_detection, before PaddleX's layout post-processing)."""
        raw = self.outputs(np.stack([page.pixels for page in pages]))
        sizes = [(page.width, page.height) for page in pages]
        thresholds = [page.threshold for page in pages]
        input_size = (self.preprocessing.width, self.preprocessing.height)
        found = candidates(raw, sizes, thresholds, input_size)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return found

    @torch.inference_mode()
    def outputs(self, pixels: np.ndarray) -> RawOutputs:
        """The model's raw outputs for a (B, H, W, 3) uint8 batch at its input size (from a
        CUDA graph once `capture` made them)."""
        batch = torch.from_numpy(pixels).to(self.device)
        if self.graphed is not None:
            found: RawOutputs = self.graphed(batch)
            return found
        return self.run(batch)

    def run(self, batch: torch.Tensor) -> RawOutputs:
        """The forward pass of a (B, H, W, 3) uint8 batch on the model's device."""
        outputs = self.forward(
            pixel_values=self.preprocessing.normalise(batch, self.dtype, self.scaling)
        )
        return RawOutputs(
            logits=outputs.logits.float(),
            pred_boxes=outputs.pred_boxes.float(),
            order_logits=outputs.order_logits.float(),
            # transformers' out_masks is a view into every decoder layer's masks (B, layers,
            # queries, 200, 200): kept as it is, the last layer's held all of them alive (144
            # MiB a page in bf16 at 6 layers), and each CUDA graph's static outputs its size's
            # (2.2 GiB at rest for graphs of 1, 2, 4 and 8 pages on the H200). A copy of the last
            # layer's alone lets the rest go with the pass.
            out_masks=outputs.out_masks.clone(memory_format=torch.contiguous_format),
        )
