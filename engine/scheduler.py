"""Many concurrent callers, one loaded model: a worker thread runs requests, events stream back async.

    scheduler = Scheduler(engine, max_queue=16, max_running=4)
    scheduler.start()
    stream = scheduler.submit(request)   # raises EngineBusy at once (synchronously) when the queue is full
    async for event in stream:
        ...
    scheduler.stop()

Each request has its own state object (status, sampler, working KV cache); nothing is shared between
requests except the read-only weights and the engine's exact prefix KV. The worker admits one waiting
request at a time (its prompt pass), then runs one decode step for each running request in turn, so the
decode steps of up to `max_running` requests are interleaved. A prompt pass is split at its layers: between
two layers the running requests take their next decode step (at most every DECODE_DURING_PREFILL_S), so a
long prompt delays other answers by a little instead of stopping them for its whole length. A consumer that
stops iterating (breaks, is cancelled, or drops the stream) cancels its request; the worker notices between
layers of the prompt pass and between decode steps.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.generation import RequestRun, RequestStatus
from engine.types import EngineBusy, EngineError, FinishEvent, GenerationEvent, GenerationRequest

if TYPE_CHECKING:
    from engine.engine import Engine

logger = logging.getLogger(__name__)

# While a prompt pass runs, the decoding requests take one step each at most this often (between layers).
DECODE_DURING_PREFILL_S = 0.05


class SchedulerStopped(EngineError):
    """submit() after stop(), or the scheduler stopped while the request was pending."""


@dataclass
class RequestState:
    """Everything the worker knows about one request."""

    request: GenerationRequest
    arrival_time: float
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
    cancelled: threading.Event = field(default_factory=threading.Event)
    status: RequestStatus = RequestStatus.WAITING
    run: RequestRun | None = None

    def deliver(self, item: GenerationEvent | BaseException) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:  # the consumer's event loop is closed: nobody is listening any more
            self.cancelled.set()


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
    def __init__(self, engine: Engine, max_queue: int | None = None, max_running: int | None = None) -> None:
        """Limits default to the engine's settings (EngineSettings.max_queue / max_running)."""
        self.engine = engine
        # Requests waiting for their prompt pass; one more → EngineBusy.
        self.max_queue = max_queue if max_queue is not None else engine.settings.max_queue
        # Requests decoding at once, one step each in turn.
        self.max_running = max_running if max_running is not None else engine.settings.max_running
        self._cv = threading.Condition()
        self._waiting: collections.deque[RequestState] = collections.deque()
        self._running: list[RequestState] = []
        self._prefilling = 0  # requests taken off _waiting whose prompt pass runs now (0 or 1)
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
        state = RequestState(request=request, arrival_time=time.perf_counter(), loop=loop, queue=asyncio.Queue())
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

    # --------------------------------------------------------------------------------------- worker
    def _work(self) -> None:
        while True:
            with self._cv:
                while not self._stopping and not self._waiting and not self._running:
                    self._cv.wait()
                if self._stopping:
                    break
                admit = self._waiting.popleft() if self._waiting and len(self._running) < self.max_running else None
                if admit is not None:
                    self._prefilling += 1
            try:
                if admit is not None:
                    try:
                        self._admit(admit)
                    finally:
                        with self._cv:
                            self._prefilling -= 1
                for state in list(self._running):
                    self._advance(state)
            except Exception:  # a bug here must not kill the worker: every later request would hang
                logger.exception("engine worker step failed")
            with self._cv:
                self._running = [s for s in self._running if s.status == RequestStatus.DECODING]
        self._shutdown()

    def _admit(self, state: RequestState) -> None:
        if state.cancelled.is_set():
            self._close(state, cancelled=True)
            return
        state.status = RequestStatus.PREFILLING

        last_round = [time.perf_counter()]

        def between_layers() -> bool:
            # A long prompt pass is split at its layers: the requests already decoding take their next
            # steps in between, so one long prompt does not stall every other answer.
            # (Decode steps of this request call this too: only its own prompt pass hands out turns.)
            if (state.status == RequestStatus.PREFILLING and self._running
                    and time.perf_counter() - last_round[0] >= DECODE_DURING_PREFILL_S):
                for other in list(self._running):
                    self._advance(other)
                last_round[0] = time.perf_counter()
            return state.cancelled.is_set() or self._stopping

        def prefill() -> list[GenerationEvent]:
            state.run = self.engine.start(
                state.request,
                arrival_time=state.arrival_time,
                should_stop=between_layers,
            )
            return state.run.prefill()

        self._emit(state, prefill)
        if state.status == RequestStatus.DECODING:
            with self._cv:
                self._running.append(state)

    def _advance(self, state: RequestState) -> None:
        if state.status == RequestStatus.DECODING and state.run is not None:
            self._emit(state, state.run.step)

    def _emit(self, state: RequestState, action) -> None:
        """Run one prefill/step action of a request and hand its events to the consumer."""
        try:
            events = action()
        except Exception as exc:
            logger.exception("request %s failed", state.request.request_id)
            state.status = RequestStatus.FAILED
            if not isinstance(exc, EngineError):
                wrapped = EngineError(f"generation failed: {exc}")
                wrapped.__cause__ = exc  # callers react to typed causes (e.g. a corrupt KV entry)
                exc = wrapped
            state.deliver(exc)
            if state.run is not None:
                state.run.release()
            return
        for event in events:
            state.deliver(event)
        run = state.run
        assert run is not None
        state.status = run.status if run.finished else RequestStatus.DECODING
        if run.finished:
            run.release()

    def _close(self, state: RequestState, cancelled: bool) -> None:
        run = self.engine.start(state.request, arrival_time=state.arrival_time)
        state.status = RequestStatus.CANCELLED if cancelled else RequestStatus.FAILED
        state.deliver(run.cancel())
        if state.request.kv_source is not None:
            state.request.kv_source.close()

    def _shutdown(self) -> None:
        with self._cv:
            pending = list(self._waiting) + list(self._running)
            self._waiting.clear()
            self._running = []
        for state in pending:
            if state.run is not None and not state.run.finished:
                state.deliver(state.run.cancel())
                state.run.release()
            elif state.run is None:
                state.deliver(SchedulerStopped("the engine scheduler stopped before this request ran"))
            state.status = RequestStatus.CANCELLED
