"""Model names: what the backends serve, plus the PaddleOCR-VL names clients send by habit."""

from __future__ import annotations

from typing import Any

from app.errors import ModelNotFound, quoted

# Names PaddleOCR's pipeline client and users' configs send (PaddleOCR#17603: 404s came from
# exactly this mismatch). The gateway rewrites them to a backend's served name.
ALIASES = (
    "PaddleOCR-VL-0.9B",
    "PaddleOCR-VL-1.5-0.9B",
    "PaddleOCR-VL-1.6-0.9B",
    "PaddleOCR-VL",
    "PaddleOCR-VL-1.5",
    "PaddleOCR-VL-1.6",
)


def resolve(requested: str, served: dict[str, dict[str, Any]]) -> str:
    """The served model name that `requested` names, or an error saying what is known."""
    if requested in served:
        return requested
    if requested in ALIASES:
        return next(iter(served))
    known = ", ".join([*served, *(a for a in ALIASES if a not in served)])
    raise ModelNotFound(
        f"the model {quoted(requested)} does not exist; known models: {known}", param="model"
    )


def listing(served: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """OpenAI's model list: the served models first (PaddleOCR reads `data[0]`), then aliases."""
    data = list(served.values())
    if data:
        target = data[0]
        data += [
            {**target, "id": alias, "root": target["id"], "owned_by": "ocrvl-alias"}
            for alias in ALIASES
            if alias not in served
        ]
    return {"object": "list", "data": data}
