"""Many concurrent callers, one loaded model: one worker thread owns all compute, events stream back async.

    scheduler = Scheduler(engine, max_queue=16, max_running=4)
    scheduler.start()
    stream = scheduler.submit(request)   # raises EngineBusy at once (synchronously) when the queue is full
    async for event in stream:
        ...
    kvs = scheduler.prefill_chunks(chunks, priority=PrefillPriority.INGEST)   # blocking, from any thread
    scheduler.stop()

Each request has one `RequestRun` (status, sampler, working KV cache), created when it is submitted;
nothing is shared between requests except the read-only weights and the engine's exact prefix KV.

Policy, one iteration of the worker:
  1. at most one unit of prompt work, questions first: a unit of a chunk prefill that a question waits
     for (a KV entry missing or corrupt at question time), else the prompt pass of one waiting request,
     else a unit of an ingest chunk prefill (at most `prefill_unit_tokens` tokens, so decode steps keep
     coming while a large document is ingested);
  2. one decode step for every running request, batched into one pass over the weights
     (engine/batched_decode.py).
A prompt pass is split at its layers: between two layers the running requests take their next (batched)
decode step, at most every DECODE_DURING_PREFILL_S, so one long prompt delays other answers a little
instead of stopping them for its whole length.
A consumer that stops iterating (breaks, is cancelled, or drops the stream) cancels its request; the
worker notices between layers of the prompt pass and between decode steps.

A scheduler that is not started runs `prefill_chunks` in the caller's thread: with no worker there is no
other compute to share the cores with (CLI ingest, unit tests).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import enum
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.batched_decode import decode_batch
from engine.generation import RequestRun, RequestStatus
from engine.types import EngineBusy, EngineError, FinishEvent, GenerationEvent, GenerationRequest

if TYPE_CHECKING:
    from engine.engine import Engine
    from kvcache.types import ChunkKV

logger = logging.getLogger(__name__)

DEFAULT_PREFILL_UNIT_TOKENS = 2048
# While a prompt pass runs, the decoding requests take one step each at most this often (between layers).
DECODE_DURING_PREFILL_S = 0.05


class SchedulerStopped(EngineError):
    """submit() after stop(), or the scheduler stopped while the request was pending."""


class PrefillPriority(enum.IntEnum):
    QUESTION = 0  # a question waits for this KV (missing or corrupt entry): before any prompt pass
    INGEST = 1  # after every waiting question


@dataclass(eq=False)  # identity: the scheduler's lists hold each one once
class RequestState:
    """One submitted request: its run (which holds the one status) and the channel to its consumer."""

    run: RequestRun
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
    cancelled: threading.Event = field(default_factory=threading.Event)

    @property
    def request(self) -> GenerationRequest:
        return self.run.request

    @property
    def status(self) -> RequestStatus:
        return self.run.status

    def deliver(self, item: GenerationEvent | BaseException) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:  # the consumer's event loop is closed: nobody is listening any more
            self.cancelled.set()


@dataclass(eq=False)  # identity (its fields hold tensors)
class PrefillJob:
    """Chunks whose KV someone waits for; the worker computes them a unit at a time."""

    chunks: list[list[int]]
    prefix_ids: list[int] | None
    priority: PrefillPriority
    on_unit: Callable[[int, float], None] | None = None
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)
    results: list[ChunkKV] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return len(self.results) == len(self.chunks)


class RequestStream:
    """Async iterator over one request's events; cancelling or dropping it cancels the request."""

    def __init__(self, state: RequestState) -> None:
        self._state = state
        self._done = False

    @property
    def request_id(self) -> str:
        return self._state.request.request_id

    @property
    def status(self) -> RequestStatus:
        return self._state.status

    def cancel(self) -> None:
        self._state.cancelled.set()

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> GenerationEvent:
        if self._done:
            raise StopAsyncIteration
        try:
            item = await self._state.queue.get()
        except BaseException:  # CancelledError: the consumer task went away (e.g. client disconnect)
            self._done = True
            self.cancel()
            raise
        if isinstance(item, BaseException):
            self._done = True
            raise item
        if isinstance(item, FinishEvent):
            self._done = True
        return item

    async def aclose(self) -> None:
        if not self._done:
            self._done = True
            self.cancel()

    async def __aenter__(self) -> RequestStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __del__(self) -> None:
        # `async for … : break` drops the iterator; CPython finalises it right away.
        if not self._done:
            self._state.cancelled.set()


class Scheduler:
    def __init__(
        self,
        engine: Engine,
        max_queue: int | None = None,
        max_running: int | None = None,
        prefill_unit_tokens: int = DEFAULT_PREFILL_UNIT_TOKENS,
    ) -> None:
        """Limits default to the engine's settings (EngineSettings.max_queue / max_running)."""
        self.engine = engine
        # Requests waiting for their prompt pass; one more → EngineBusy.
        self.max_queue = max_queue if max_queue is not None else engine.settings.max_queue
        # Requests decoding at once; their decode steps run batched.
        self.max_running = max_running if max_running is not None else engine.settings.max_running
        # Chunk prefill work between two decode steps (at least one chunk).
        self.prefill_unit_tokens = prefill_unit_tokens
        self._cv = threading.Condition()
        self._waiting: collections.deque[RequestState] = collections.deque()
        self._running: list[RequestState] = []
        self._prefilling = 0  # requests taken off _waiting whose prompt pass runs now (0 or 1)
        self._prefills: list[PrefillJob] = []  # kept sorted by priority, FIFO within one
        self._thread: threading.Thread | None = None
        self._stopping = False

    # ------------------------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        with self._cv:
            if self._thread is not None:
                return
            self._stopping = False
            self._thread = threading.Thread(target=self._work, name="blendrag-engine", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Cancel everything pending or running and join the worker."""
        with self._cv:
            self._stopping = True
            thread, self._thread = self._thread, None
            self._cv.notify_all()
        if thread is not None:
            thread.join(timeout)
            if thread.is_alive():
                logger.warning("engine worker did not stop within %.0fs", timeout)

    async def __aenter__(self) -> Scheduler:
        self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.stop)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_prefill_jobs(self) -> int:
        return len(self._prefills)

    @property
    def num_prefilling(self) -> int:
        """Requests in their prompt pass now: neither waiting nor yet decoding."""
        return self._prefilling

    @property
    def queue_depth(self) -> int:
        """Every request the scheduler holds: waiting, in its prompt pass, or decoding."""
        with self._cv:
            return len(self._waiting) + self._prefilling + len(self._running)

    # --------------------------------------------------------------------------------------- submit
    def submit(self, request: GenerationRequest, *, readmit: bool = False) -> RequestStream:
        """Queue a request; call from a running event loop. Raises EngineBusy when the queue is full.

        The check is synchronous, so a caller that submits before it answers its own client can turn a full
        queue into an honest "busy" reply instead of a stream that fails later. `readmit=True` skips the
        queue limit: for a request that was already admitted once and must start over (e.g. its stored KV
        turned out corrupt before the first token), so an admitted caller is never refused half-way.
        """
        loop = asyncio.get_running_loop()
        state = RequestState(run=self.engine.start(request), loop=loop, queue=asyncio.Queue())
        state.run.should_stop = lambda: state.cancelled.is_set() or self._stopping
        with self._cv:
            if self._stopping or self._thread is None:
                raise SchedulerStopped("the engine scheduler is not running")
            if not readmit and len(self._waiting) >= self.max_queue:
                raise EngineBusy(
                    f"engine busy: {len(self._waiting)} requests waiting (max_queue="
                    f"{self.max_queue}), {len(self._running)} running"
                )
            self._waiting.append(state)
            self._cv.notify_all()
        return RequestStream(state)

    def prefill_chunks(
        self,
        chunks: list[list[int]],
        prefix_ids: list[int] | None = None,
        priority: PrefillPriority = PrefillPriority.INGEST,
        on_unit: Callable[[int, float], None] | None = None,
    ) -> list[ChunkKV]:
        """The chunks' KV (as Engine.prefill_chunks), computed by the worker under the policy above.

        Blocks the calling thread (never call it from an event loop); raises SchedulerStopped when the
        scheduler stops first. Runs in the caller's thread when the scheduler is not started.
        on_unit(tokens, seconds) is called after each unit with its compute time (no queueing time).
        """
        if not chunks:
            return []
        job = PrefillJob(chunks=chunks, prefix_ids=prefix_ids, priority=priority, on_unit=on_unit)
        with self._cv:
            inline = self._thread is None or threading.current_thread() is self._thread
            if not inline:
                if self._stopping:
                    raise SchedulerStopped("the engine scheduler is stopping")
                # Stable insertion: after every job of the same or a more urgent priority.
                at = sum(1 for j in self._prefills if j.priority <= priority)
                self._prefills.insert(at, job)
                self._cv.notify_all()
        if inline:
            while not job.future.done():
                self._prefill_unit(job)
        return job.future.result()

    # --------------------------------------------------------------------------------------- worker
    def _work(self) -> None:
        while True:
            with self._cv:
                while not self._stopping and not self._waiting and not self._running and not self._prefills:
                    self._cv.wait()
                if self._stopping:
                    break
                job, admit = self._pick()
                if admit is not None:
                    self._prefilling += 1
            try:
                if job is not None:
                    self._prefill_unit(job)
                elif admit is not None:
                    try:
                        self._admit(admit)
                    finally:
                        with self._cv:
                            self._prefilling -= 1
                if self._running:
                    self._decode_step()
            except Exception:  # a bug here must not kill the worker: every later request would hang
                logger.exception("engine worker step failed")
            with self._cv:
                self._running = [s for s in self._running if s.status == RequestStatus.DECODING]
        self._shutdown()

    def _pick(self) -> tuple[PrefillJob | None, RequestState | None]:
        """The next unit of prompt work (call with the lock held): questions first."""
        head = self._prefills[0] if self._prefills else None
        if head is not None and head.priority == PrefillPriority.QUESTION:
            return head, None
        if self._waiting and len(self._running) < self.max_running:
            return None, self._waiting.popleft()
        if head is not None and not self._waiting:
            return head, None
        return None, None

    def _prefill_unit(self, job: PrefillJob) -> None:
        start = len(job.results)
        end, tokens = start, 0
        while end < len(job.chunks) and (end == start or tokens + len(job.chunks[end]) <= self.prefill_unit_tokens):
            tokens += len(job.chunks[end])
            end += 1
        t0 = time.perf_counter()
        try:
            job.results.extend(self.engine.prefill_chunks(job.chunks[start:end], job.prefix_ids))
            if job.on_unit is not None:
                job.on_unit(tokens, time.perf_counter() - t0)
        except Exception as exc:  # the caller gets it; the worker goes on
            logger.exception("chunk prefill failed")
            self._drop_job(job)
            job.future.set_exception(exc)
            return
        if job.done:
            self._drop_job(job)
            job.future.set_result(job.results)

    def _drop_job(self, job: PrefillJob) -> None:
        with self._cv:
            if job in self._prefills:
                self._prefills.remove(job)

    def _admit(self, state: RequestState) -> None:
        if state.cancelled.is_set():
            state.deliver(state.run.cancel())
            if state.request.kv_source is not None:
                state.request.kv_source.close()
            return
        plain = state.run.should_stop
        last_round = [time.perf_counter()]

        def between_layers() -> bool:
            # The prompt pass is split at its layers: the requests already decoding take their next step
            # in between, so one long prompt does not stall every other answer.
            if self._running and time.perf_counter() - last_round[0] >= DECODE_DURING_PREFILL_S:
                self._decode_step()
                last_round[0] = time.perf_counter()
            return plain() if plain is not None else False

        state.run.should_stop = between_layers
        try:
            self._emit(state, state.run.prefill)
        finally:
            state.run.should_stop = plain
        if state.status == RequestStatus.DECODING:
            with self._cv:
                self._running.append(state)

    def _decode_step(self) -> None:
        """One decode step of every running request: cancelled ones finish, the rest decode batched."""
        active: list[RequestState] = []
        for state in self._running:
            if state.status != RequestStatus.DECODING:
                continue
            if state.cancelled.is_set() or self._stopping:
                self._emit(state, lambda s=state: [s.run.cancel()])
            else:
                active.append(state)
        if len(active) == 1:
            self._emit(active[0], active[0].run.step)
        elif active:
            try:
                logits = decode_batch(
                    self.engine.transformer, [s.run.cache for s in active], [s.run.pending_token for s in active]
                )
            except Exception as exc:
                for state in active:
                    self._fail(state, exc)
                return
            for i, state in enumerate(active):
                self._emit(state, lambda s=state, row=logits[i]: s.run.advance(row))

    def _emit(self, state: RequestState, action: Callable[[], list[GenerationEvent]]) -> None:
        """Run one prefill/step action of a request and hand its events to the consumer."""
        try:
            events = action()
        except Exception as exc:
            self._fail(state, exc)
            return
        for event in events:
            state.deliver(event)
        if state.run.finished:
            state.run.release()

    def _fail(self, state: RequestState, exc: Exception) -> None:
        logger.error("request %s failed", state.request.request_id, exc_info=exc)
        state.run.fail()
        if not isinstance(exc, EngineError):
            wrapped = EngineError(f"generation failed: {exc}")
            wrapped.__cause__ = exc  # callers react to typed causes (e.g. a corrupt KV entry)
            exc = wrapped
        state.deliver(exc)

    def _shutdown(self) -> None:
        with self._cv:
            pending = list(self._waiting) + list(self._running)
            jobs = list(self._prefills)
            self._waiting.clear()
            self._running = []
            self._prefills = []
        for state in pending:
            if state.status == RequestStatus.WAITING:
                state.deliver(SchedulerStopped("the engine scheduler stopped before this request ran"))
                state.run.status = RequestStatus.CANCELLED
                if state.request.kv_source is not None:
                    state.request.kv_source.close()
            elif not state.run.finished:
                state.deliver(state.run.cancel())
                state.run.release()
        for job in jobs:
            job.future.set_exception(SchedulerStopped("the engine scheduler stopped before this prefill ran"))
