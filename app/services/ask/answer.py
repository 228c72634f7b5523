"""Answer: a question the engine has accepted, streamed as sources, token deltas, then done or error.

It holds the stages after planning: open the prompt's KV (`PromptKV`), submit the engine request, stream
the engine's events, and hand the finish to the `TurnFinisher`, which builds the one `DoneEvent`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import KW_ONLY, dataclass, field
from typing import TYPE_CHECKING

from app.services.ask.recorder import AnswerRecorder, KVCounts
from app.services.ask.types import AskEvent, AskPlan, AskRequest, ErrorEvent, SourcesEvent, TokenDelta

if TYPE_CHECKING:
    from app.services.ask.kv import PromptKV
    from app.services.ask.resolve import SettledRequest
    from app.services.ask.turn import TurnFinisher
    from engine.scheduler import RequestStream, Scheduler

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class Answer:
    """A question the engine has accepted: `events()` streams sources, token deltas, then done or error.

    `settled` is the engine request's every value (resolve.py); each submission adds a fresh id and the KV
    reader just opened (only when the settled mode reads stored KV). Once a request is
    submitted its KV source belongs to the engine's worker, which closes it; this object only closes a
    source whose submit failed. An answer that is never iterated is cancelled when it is dropped.
    """

    request: AskRequest
    plan: AskPlan
    sources: SourcesEvent
    settled: SettledRequest
    _: KW_ONLY
    kv: PromptKV
    scheduler: Scheduler
    recorder: AnswerRecorder
    finisher: TurnFinisher
    _stream: RequestStream | None = field(default=None, init=False)
    _kv_counts: KVCounts = field(default_factory=KVCounts, init=False)

    async def open_and_submit(self, readmit: bool) -> None:
        """Open the prompt's KV (computing missing entries) and queue the request; EngineBusy if full."""
        started = time.perf_counter()
        kv_reader = None
        counts = self._kv_counts
        if self.settled.opens_kv:
            opened = await asyncio.to_thread(self.kv.open, self.plan)
            kv_reader = opened.reader
            counts = dataclasses.replace(
                counts,
                # A re-open after a corrupt entry adds what it computed to the first open's counts.
                num_hits=counts.num_hits if readmit else opened.num_hits,
                num_misses=counts.num_misses + opened.num_misses if readmit else opened.num_misses,
                # After a corrupt entry, the second open says which turns were computed after all.
                num_history_reused_tokens=opened.num_history_reused_tokens,
            )
        self._kv_counts = dataclasses.replace(counts, load_ms=counts.load_ms + (time.perf_counter() - started) * 1000)
        request = self.settled.generation(str(uuid.uuid4()), kv_reader)
        try:
            self._stream = self.scheduler.submit(request, readmit=readmit)
        except BaseException:
            if kv_reader is not None:  # never handed over: still ours to close
                kv_reader.close()
            raise

    def cancel(self) -> None:
        if self._stream is not None:
            self._stream.cancel()

    async def events(self) -> AsyncIterator[AskEvent]:
        from engine.scheduler import SchedulerStopped
        from engine.types import EngineError, FinishEvent
        from kvcache.errors import KVEntryCorrupt

        recorder, mode = self.recorder, self.settled.mode
        pieces: list[str] = []
        yield self.sources
        try:
            # A stored entry found corrupt while its layers stream in has already been dropped by the store:
            # opening again recomputes it. Only before the first token, so the client never sees a restart.
            for attempt in range(2):
                if attempt == 1:
                    await self.open_and_submit(readmit=True)
                stream = self._stream
                assert stream is not None
                try:
                    async for event in stream:
                        if isinstance(event, FinishEvent):
                            yield await self.finisher.finish(
                                self.request, self.plan, self.sources, event, "".join(pieces), self._kv_counts
                            )
                            return
                        if event.text:
                            pieces.append(event.text)
                            yield TokenDelta(text=event.text)
                except SchedulerStopped as exc:  # the server is shutting down
                    logger.info("ask cancelled: %s", exc)
                    recorder.count(mode, "cancelled")
                    yield ErrorEvent(message=f"the server is shutting down: {exc}", code="cancelled")
                    return
                except (KVEntryCorrupt, EngineError) as exc:
                    corrupt = exc if isinstance(exc, KVEntryCorrupt) else exc.__cause__
                    if not isinstance(corrupt, KVEntryCorrupt):
                        logger.exception("ask failed")
                        recorder.count(mode, "error")
                        yield ErrorEvent(message=str(exc), code="internal")
                        return
                    if pieces or attempt == 1:
                        logger.error("KV entry corrupt mid-answer: %s", exc)
                        recorder.count(mode, "error")
                        yield ErrorEvent(message=f"stored KV was corrupt: {exc}", code="internal")
                        return
                    logger.warning("KV entry corrupt (%s); recomputing it and starting over", exc)
                finally:
                    await stream.aclose()  # cancels the request if it is still running; the worker cleans up
        except Exception as exc:
            logger.exception("ask failed")
            recorder.count(mode, "error")
            yield ErrorEvent(message=f"{type(exc).__name__}: {exc}", code="internal")
