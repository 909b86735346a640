"""The one error the worker processes raise: picklable, turned into a 400 by the caller.

The worker side imports nothing of the web stack (app.errors pulls in FastAPI): workers start
faster and smaller.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from app.errors import InvalidRequest


class DocumentError(Exception):
    """The file (or the `pages` option) cannot be turned into pages; says why and what to do."""

    def __init__(self, message: str, code: str, param: str = "file") -> None:
        super().__init__(message, code, param)  # all in args: survives the trip between processes
        self.message = message
        self.code = code
        self.param = param

    def as_gateway_error(self) -> InvalidRequest:
        """The OpenAI-shaped 400 for this error."""
        from app.errors import InvalidRequest  # noqa: PLC0415 (see the module docstring)

        return InvalidRequest(self.message, param=self.param, code=self.code)
