"""Stop work for a client that went away: every answer path iterates its events through `while_connected`.

Starlette notices a disconnect only when it next writes to the socket, and a non-streaming route writes
nothing until the answer is complete, so a long prompt pass or a long JSON answer would run to its end for
nobody. `while_connected` races each next event against a watcher that polls the connection; when the
client is gone it cancels the pending `__anext__`, which cancels the engine request behind it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import TypeVar

from starlette.requests import Request

T = TypeVar("T")

POLL_S = 0.2


class ConnectionWatch:
    """Iterate `events` while the client of `request` is connected; `.disconnected` says why it ended."""

    def __init__(self, request: Request, poll_s: float = POLL_S) -> None:
        self._request = request
        self._poll_s = poll_s
        self.disconnected = False

    async def _until_disconnected(self) -> None:
        while not await self._request.is_disconnected():
            await asyncio.sleep(self._poll_s)

    async def iterate(self, events: AsyncIterator[T]) -> AsyncIterator[T]:
        watcher = asyncio.ensure_future(self._until_disconnected())
        step: asyncio.Future[T] | None = None
        try:
            while True:
                step = asyncio.ensure_future(_next(events))
                done, _ = await asyncio.wait({step, watcher}, return_when=asyncio.FIRST_COMPLETED)
                if step not in done:
                    self.disconnected = True
                    return
                try:
                    item = step.result()
                except StopAsyncIteration:
                    return
                yield item
        finally:
            # Also reached when this task is cancelled (Starlette's own disconnect listener): the pending
            # `__anext__` must end before anyone may close `events`.
            for task in (step, watcher):
                if task is not None and not task.done():
                    task.cancel()
                    with contextlib.suppress(Exception, asyncio.CancelledError):
                        await task


async def _next(events: AsyncIterator[T]) -> T:
    return await events.__anext__()


def while_connected(request: Request, events: AsyncIterator[T]) -> AsyncIterator[T]:
    return ConnectionWatch(request).iterate(events)
