"""A stop that has begun: `ocrvl serve` got SIGTERM or Ctrl-C, and requests in flight drain.

uvicorn, told to stop, closes its listeners and waits for the requests in flight to end; only
then does the lifespan's shutdown run. Work that is no request (the job runner) must not go on
through that drain: it hands its jobs back at once, when the stop begins (`Stop.wait`), so the
next gateway reads their pages in flight again, and the preprocessing workers the draining
requests need stop last, with the lifespan.
"""

from __future__ import annotations

import asyncio
from types import FrameType

import uvicorn


class Stop:
    """Set once, from a signal handler, when the server begins to stop."""

    def __init__(self) -> None:
        self.begun = False
        self._event = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None

    def begin(self) -> None:
        """The stop has begun (safe in a signal handler: it only schedules the wake-up)."""
        self.begun = True
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._event.set)

    async def wait(self) -> None:
        """Return once the stop has begun."""
        self._loop = asyncio.get_running_loop()
        if not self.begun:
            await self._event.wait()


class StoppingServer(uvicorn.Server):
    """uvicorn's server, telling `stop` as soon as SIGTERM or SIGINT arrives (uvicorn itself
    acts on it only after the requests in flight have drained)."""

    def __init__(self, config: uvicorn.Config, stop: Stop) -> None:
        super().__init__(config)
        self.stop = stop

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """uvicorn's stop (a second Ctrl-C forces it), and the app told."""
        super().handle_exit(sig, frame)
        self.stop.begin()
