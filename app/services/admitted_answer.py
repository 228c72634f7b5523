"""AdmittedAnswer: a question the engine has accepted, streamed as sources, token deltas, then done or error."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING

from app.services.ask_types import AskEvent, DoneEvent, ErrorEvent, SourcesEvent, TokenDelta

if TYPE_CHECKING:
    from app.services.answer_recorder import AnswerRecorder
    from app.services.prompt_kv import OpenedKV
    from engine.scheduler import RequestStream, Scheduler
    from engine.types import GenerationRequest, Mode
    from kvcache.types import LayerKVSource

logger = logging.getLogger(__name__)


class AdmittedAnswer:
    """A question the engine has accepted: `events()` streams sources, token deltas, then done or error.

    Its collaborators come in: `open_kv` (None: no stored KV, mode full), `build` (the engine request for a
    KV source), the scheduler, the recorder and `finish` (the finished turn: its KV stored, its conversation
    recorded, the `done` that says so; given the history tokens served from the store). Once a request is
    submitted its KV source belongs to the engine's worker, which closes it; this object only closes a
    source whose submit failed.
    """

    def __init__(
        self,
        *,
        sources: SourcesEvent,
        mode: Mode,
        open_kv: Callable[[], OpenedKV] | None,
        build: Callable[[LayerKVSource | None, Mode], GenerationRequest],
        scheduler: Scheduler,
        recorder: AnswerRecorder,
        finish: Callable[[DoneEvent, int], Awaitable[DoneEvent]] | None = None,
    ) -> None:
        self.sources = sources
        self._mode = mode
        self._open_kv = open_kv
        self._build = build
        self._scheduler = scheduler
        self._recorder = recorder
        self._finish = finish
        self._stream: RequestStream | None = None
        self._kv_load_ms = 0.0
        self._kv_hits = 0
        self._kv_misses = 0
        self._history_reused = 0

    async def open_and_submit(self, readmit: bool) -> None:
        """Open the chunks' KV (computing missing entries) and queue the request; EngineBusy if full."""
        started = time.perf_counter()
        kv_source = None
        if self._open_kv is not None:
            opened = await asyncio.to_thread(self._open_kv)
            kv_source = opened.source
            if readmit:
                self._kv_misses += opened.num_misses
            else:
                self._kv_hits, self._kv_misses = opened.num_hits, opened.num_misses
            # After a corrupt entry, the second open says which turns were computed after all.
            self._history_reused = opened.num_history_reused_tokens
        self._kv_load_ms += (time.perf_counter() - started) * 1000
        gen = self._build(kv_source, self._mode if kv_source is not None else "full")
        try:
            self._stream = self._scheduler.submit(gen, readmit=readmit)
        except BaseException:
            if kv_source is not None:  # never handed over: still ours to close
                kv_source.close()
            raise

    def cancel(self) -> None:
        if self._stream is not None:
            self._stream.cancel()

    async def events(self) -> AsyncIterator[AskEvent]:
        from engine.scheduler import SchedulerStopped
        from engine.types import EngineError, FinishEvent
        from kvcache.errors import KVEntryCorrupt

        recorder, mode = self._recorder, self._mode
        pieces: list[str] = []
        yield self.sources
        retrieval_ms = self.sources.retrieval_ms
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
                            done = recorder.done(
                                event,
                                pieces,
                                retrieval_ms,
                                self._kv_load_ms,
                                self._kv_hits,
                                self._kv_misses,
                                self.sources,
                            )
                            if self._finish is not None:
                                done = await self._finish(done, self._history_reused)
                            yield done
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
