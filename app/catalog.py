"""Model names: what the backends serve, plus the PaddleOCR-VL names clients send by habit."""

from __future__ import annotations

import re
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


VERSION = re.compile(r"PaddleOCR-VL(?:-(\d+\.\d+))?(?:-0\.9B)?$", re.IGNORECASE)


def version(name: str) -> str:
    """The PaddleOCR-VL version a name says (`1.6`; `1.0` for the first's `PaddleOCR-VL-0.9B`
    and `PaddleOCR-VL`), from its last path segment (`PaddlePaddle/PaddleOCR-VL-1.6`); "" for
    a name that says none (a served name of the operator's own)."""
    match = VERSION.match(name.rsplit("/", 1)[-1])
    return "" if match is None else match.group(1) or "1.0"


def resolve(requested: str, served: dict[str, dict[str, Any]]) -> str:
    """The served model name that `requested` names, or an error saying what is known. An alias
    goes to a served model of its version when one is (a gateway in front of 1.5 and 1.6
    engines keeps PaddleOCR's `pipeline_version` apart), else to the first served model."""
    if requested in served:
        return requested
    if requested in ALIASES:
        wanted = version(requested)
        return next((name for name in served if version(name) == wanted), next(iter(served)))
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
