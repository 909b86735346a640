"""UVDoc through transformers' own class: a photographed page flattened.

PaddleX's `DocPreprocessor` runs UVDoc (`image_unwarping`) after the orientation: the model
predicts a 2-D mesh from the page at 712 x 488 and the page, at its own size, is resampled
along it. The steps are transformers' `UVDocImageProcessor` (1/255, BGR, bilinear resize with
aligned corners) and its `post_process_document_rectification` (the mesh upsampled to the page,
`grid_sample`, x 255, uint8), written with torch alone (the processor needs torchvision, which
the engine venv leaves out). The output keeps the page's size.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from transformers import UVDocModel

from ocrvl_layout.model import place, pretrained

INPUT = (712, 488)  # (height, width): UVDocImageProcessor's size


class UnwarpingModel:
    """UVDoc on its device."""

    def __init__(self, checkpoint: str, device: torch.device, dtype: torch.dtype) -> None:
        model = pretrained(UVDocModel, checkpoint, dtype, "uvdoc", "UVDoc")
        self.device, self.dtype = device, dtype
        self.model = place(model, device)
        self.parameters = sum(p.numel() for p in self.model.parameters())

    @torch.inference_mode()
    def unwarp(self, pages: list[np.ndarray]) -> list[np.ndarray]:
        """Each (H, W, 3) uint8 RGB page flattened, at its own size (one forward pass)."""
        originals = [self._bgr(page) for page in pages]
        batch = torch.cat(
            [
                F.interpolate(image[None], size=INPUT, mode="bilinear", align_corners=True)
                for image in originals
            ]
        )
        mesh = self.model(pixel_values=batch.to(self.device, self.dtype)).last_hidden_state
        mesh = mesh.float()
        flattened = []
        for i, image in enumerate(originals):
            height, width = image.shape[1:]
            grid = F.interpolate(mesh[i : i + 1], size=(height, width), mode="bilinear",
                                 align_corners=True).permute(0, 2, 3, 1)  # fmt: skip
            out = F.grid_sample(image[None].to(self.device), grid, align_corners=True)
            bgr = (out[0].permute(1, 2, 0) * 255).to(torch.uint8)
            flattened.append(bgr.flip(-1).cpu().numpy())  # back to RGB
        return flattened

    @staticmethod
    def _bgr(page: np.ndarray) -> torch.Tensor:
        """(3, H, W) float in [0, 1], BGR, as the processor gives the model."""
        return torch.from_numpy(page[:, :, ::-1].copy()).permute(2, 0, 1).float() / 255
