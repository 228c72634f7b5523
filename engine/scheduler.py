"""Many concurrent callers, one loaded model: one worker thread owns all compute, events stream back async.

    scheduler = Scheduler(engine, max_queue=16, max_running=4)
    scheduler.start()
    stream = scheduler.submit(request)   # raises EngineBusy at once (synchronously) when the queue is full
    async for event in stream:
        ...
    kvs = scheduler.precompute_chunks(chunks, priority=PrecomputePriority.INGEST)   # blocking, from any thread
    scheduler.stop()

Three types carry a request through here: the caller's `GenerationRequest`, its `RequestRun` (status,
sampler, working KV cache; engine/generation.py), created when it is submitted, and the `RequestStream`
its consumer iterates. Nothing is shared between requests except the read-only weights and the engine's
exact prefix KV. The scheduler decides; the engine executes (`Engine.run_prompt`, `Engine.decode`).

Policy, one iteration of the worker (pick → execute → deliver):
  1. at most one unit of prompt work, questions first: a unit of a chunk precompute that a question waits
     for (a KV entry missing or corrupt at question time), else the prompt pass of one waiting request,
     else a unit of an ingest chunk precompute (at most `precompute_unit_tokens` tokens, so decode steps keep
     coming while a large document is ingested);
  2. one decode step for every running request, batched into one pass over the weights
     (engine/batched_decode.py).
A prompt pass is split at its layers: between two layers the running requests take their next (batched)
decode step, at most every DECODE_DURING_PROMPT_S (DECODE_WHILE_QUESTIONS_WAIT_S while other questions wait
for their own pass: first tokens before faster streaming), so one long prompt delays other answers a little
instead of stopping them for its whole length.
Admission: `submit` refuses (EngineBusy, carrying the seconds a client should wait before it retries) when
`max_queue` requests wait already, or when a request submitted now would wait longer than `max_queue_wait_s`
for its prompt pass (if set). The wait is estimated from the queue and the rates the worker measures as it
works (engine/admission.py); `admission()` says it without submitting.
A consumer that stops iterating (breaks, is cancelled, or drops the stream) cancels its request; the
worker notices between layers of the prompt pass and between decode steps.
Once `submit` returns, the request's `kv_reader` belongs to the worker, which closes it when the prompt
pass ends (or when the request is cancelled or stopped before it); a `submit` that raises leaves it with
the caller.

A scheduler that is not started runs `precompute_chunks` in the caller's thread: with no worker there is no
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
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.admission import (
    AdmissionEstimate,
    PromptWork,
    QueueSnapshot,
    ServiceRates,
    estimate_admission,
    fresh_tokens,
)
from engine.generation import RequestRun, RequestStatus
from engine.types import EngineBusy, EngineError, FinishEvent, GenerationEvent, GenerationRequest

if TYPE_CHECKING:
    from engine.engine import Engine
    from kvcache.types import ChunkKV

logger = logging.getLogger(__name__)

DEFAULT_PRECOMPUTE_UNIT_TOKENS = 2048
# On an accelerator a unit is one large batch: its matrix units are busy only with thousands of rows at once, and
# the decode steps it delays are milliseconds.
DEVICE_PRECOMPUTE_UNIT_TOKENS = 32768
# While a prompt pass runs, the decoding requests take one step each at most this often (between layers).
DECODE_DURING_PROMPT_S = 0.05
# ... and at most this often while other questions wait for their prompt pass too. A step of eight answers costs
# as much as a layer or two of a blend's prompt pass, so at 0.05 s the decoding answers took over half of every
# pass and a queue of questions waited twice as long for its first tokens (`python -m bench capacity`, 8
# clients). At this interval the answers already streaming still get ~5 tokens/s each while the queue drains,
# about reading speed, and each waiting question's pass runs ~1.5x sooner.
DECODE_WHILE_QUESTIONS_WAIT_S = 0.15


class SchedulerStopped(EngineError):
    """submit() after stop(), or the scheduler stopped while the request was pending."""


class PrecomputePriority(enum.IntEnum):
    QUESTION = 0  # a question waits for this KV (missing or corrupt entry): before any prompt pass
    INGEST = 1  # after every waiting question


@dataclass(eq=False)  # identity (its fields hold tensors)
class PrecomputeJob:
    """Chunks whose KV someone waits for; the worker computes them a unit at a time."""

    chunks: list[list[int]]
    prefix_ids: list[int] | None
    priority: PrecomputePriority
    on_unit: Callable[[int, float], None] | None = None
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)
    results: list[ChunkKV] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return len(self.results) == len(self.chunks)


@dataclass(eq=False)
class _IdleCall:
    work: Callable[[], object]
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)


# What the worker hands a consumer: events, or the error that ended its request.
Outbox = Callable[["GenerationEvent | BaseException"], None]
# One result of executing a run: its new events, or the error that failed it.
Outcome = tuple[RequestRun, "list[GenerationEvent] | EngineError"]


@dataclass(frozen=True)
class _Iteration:
    """What one iteration of the worker executes: at most one unit of prompt work, then a decode step."""

    precompute: PrecomputeJob | None = None  # a unit of this chunk precompute
    prompt: RequestRun | None = None  # the prompt pass of this request
    idle: _IdleCall | None = None  # background work, run only when there is nothing else to do


class RequestStream:
    """Async iterator over one request's events; cancelling or dropping it cancels the request."""

    def __init__(self, run: RequestRun, queue: asyncio.Queue) -> None:
        self._run = run
        self._queue = queue
        self._done = False

    @property
    def request_id(self) -> str:
        return self._run.request.request_id

    @property
    def status(self) -> RequestStatus:
        return self._run.status

    def cancel(self) -> None:
        self._run.cancel_requested.set()

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> GenerationEvent:
        if self._done:
            raise StopAsyncIteration
        try:
            item = await self._queue.get()
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
        # `async for … : break` drops the iterator; CPython finalises it right away. The scheduler holds the
        # run, never the stream, so dropping the stream is seen here.
        if not self._done:
            self._run.cancel_requested.set()


class Scheduler:
    def __init__(
        self,
        engine: Engine,
        max_queue: int | None = None,
        max_running: int | None = None,
        precompute_unit_tokens: int | None = None,
        max_queue_wait_s: float | None = None,
    ) -> None:
        """Limits default to the engine's settings (EngineSettings.max_queue / max_running / max_queue_wait_s)."""
        self.engine = engine
        # Requests waiting for their prompt pass; one more → EngineBusy.
        self.max_queue = max_queue if max_queue is not None else engine.settings.max_queue
        # A request whose estimated wait for its prompt pass is longer → EngineBusy; None: no such limit.
        self.max_queue_wait_s = max_queue_wait_s if max_queue_wait_s is not None else engine.settings.max_queue_wait_s
        # Requests decoding at once; their decode steps run batched.
        self.max_running = max_running if max_running is not None else engine.settings.max_running
        # Chunk precompute work between two decode steps (at least one chunk); device-sized on an accelerator.
        if precompute_unit_tokens is None:
            on_cpu = engine.device.type == "cpu"
            precompute_unit_tokens = DEFAULT_PRECOMPUTE_UNIT_TOKENS if on_cpu else DEVICE_PRECOMPUTE_UNIT_TOKENS
        self.precompute_unit_tokens = precompute_unit_tokens
        self._cv = threading.Condition()
        self._waiting: collections.deque[RequestRun] = collections.deque()
        self._running: list[RequestRun] = []
        self._outboxes: dict[RequestRun, Outbox] = {}  # every submitted run until it is done
        self._num_prompt_passes = 0  # requests taken off _waiting whose prompt pass runs now (0 or 1)
        self._precompute_jobs: list[PrecomputeJob] = []  # kept sorted by priority, FIFO within one
        self._idle_calls: collections.deque[_IdleCall] = collections.deque()
        self._thread: threading.Thread | None = None
        self._stopping = False
        # What the wait estimate reads (engine/admission.py): the measured rates, each queued request's prompt
        # work (from submit until its pass ends), the pass running now and the compute it has had.
        self.rates = ServiceRates()
        self._prompt_work: dict[RequestRun, PromptWork] = {}
        self._in_pass: RequestRun | None = None
        self._pass_started = 0.0  # perf_counter at its start
        self._pass_decode_s = 0.0  # seconds of decode steps taken between its layers so far

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
    def num_precompute_jobs(self) -> int:
        return len(self._precompute_jobs)

    @property
    def num_prompt_passes(self) -> int:
        """Requests in their prompt pass now: neither waiting nor yet decoding."""
        return self._num_prompt_passes

    @property
    def queue_depth(self) -> int:
        """Every request the scheduler holds: waiting, in its prompt pass, or decoding."""
        with self._cv:
            return len(self._waiting) + self._num_prompt_passes + len(self._running)

    # ------------------------------------------------------------------------------------ admission
    def admission(self) -> AdmissionEstimate:
        """What a request submitted now faces: its estimated wait for its prompt pass, and when a place in the
        queue frees (engine/admission.py)."""
        with self._cv:
            return self._estimate()

    def refusal(self) -> EngineBusy | None:
        """Why a request submitted now would be refused (the EngineBusy `submit` would raise), or None. Not
        binding: other requests may come or go before the submit."""
        with self._cv:
            return self._refusal()

    def _estimate(self) -> AdmissionEstimate:
        """Under the lock."""
        in_pass, compute_s = self._in_pass, 0.0
        if in_pass is not None:
            compute_s = max(0.0, time.perf_counter() - self._pass_started - self._pass_decode_s)
        question_tokens = sum(
            sum(len(c) for c in job.chunks[len(job.results) :])
            for job in self._precompute_jobs
            if job.priority == PrecomputePriority.QUESTION
        )
        snapshot = QueueSnapshot(
            question_precompute_tokens=question_tokens,
            in_pass=self._prompt_work.get(in_pass) if in_pass is not None else None,
            in_pass_compute_s=compute_s,
            # A request cancelled while it waits leaves at its turn without a pass.
            waiting=tuple(
                self._prompt_work[r]
                for r in self._waiting
                if r in self._prompt_work and not r.cancel_requested.is_set()
            ),
            running=tuple(
                PromptWork(r.request.mode, 0.0, r.request.sampling.max_tokens, r.num_completion_tokens)
                for r in self._running
                if r.status == RequestStatus.DECODING
            ),
            max_running=self.max_running,
            # A request submitted now waits behind the queue: the passes before its own run at the waiting interval.
            decode_interval_s=DECODE_WHILE_QUESTIONS_WAIT_S if self._waiting else DECODE_DURING_PROMPT_S,
        )
        return estimate_admission(snapshot, self.rates)

    def _refusal(self) -> EngineBusy | None:
        """Under the lock: the queue is full, or a new request's estimated wait is over max_queue_wait_s."""
        queue_full = len(self._waiting) >= self.max_queue
        limit = self.max_queue_wait_s
        if not queue_full and limit is None:
            return None  # nothing to estimate
        estimate = self._estimate()
        retry_after_s = estimate.retry_after_s(queue_full=queue_full, max_wait_s=limit)
        if queue_full:
            return EngineBusy(
                f"engine busy: {len(self._waiting)} requests waiting (max_queue={self.max_queue}), "
                f"{len(self._running)} running",
                retry_after_s=retry_after_s,
            )
        if limit is not None and estimate.wait_s is not None and estimate.wait_s > limit:
            return EngineBusy(
                f"engine busy: a new request would wait about {estimate.wait_s:.0f} s for its prompt pass "
                f"(max_queue_wait_s={limit:g}); {len(self._waiting)} waiting, {len(self._running)} running",
                retry_after_s=retry_after_s,
            )
        return None

    # --------------------------------------------------------------------------------------- submit
    def submit(self, request: GenerationRequest, *, readmit: bool = False) -> RequestStream:
        """Queue a request; call from a running event loop. Raises EngineBusy when the queue is full.

        The queue limit counts requests waiting for their prompt pass (`max_queue`); the ones in their
        prompt pass or decoding are limited by `max_running` instead. With `max_queue_wait_s`, a request whose
        estimated wait is longer is refused too. EngineBusy carries `retry_after_s`, when a retry may be
        admitted. On success the worker owns `request.kv_reader` (module docstring).

        The check is synchronous, so a caller that submits before it answers its own client can turn a full
        queue into an honest "busy" reply instead of a stream that fails later. `readmit=True` skips the
        queue limit: for a request that was already admitted once and must start over (e.g. its stored KV
        turned out corrupt before the first token), so an admitted caller is never refused half-way.
        """
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        run = self.engine.new_run(request)
        work = PromptWork(request.mode, fresh_tokens(request, self.engine.num_layers), request.sampling.max_tokens)

        def outbox(item: GenerationEvent | BaseException) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, item)

        with self._cv:
            if self._stopping or self._thread is None:
                raise SchedulerStopped("the engine scheduler is not running")
            if not readmit and (busy := self._refusal()) is not None:
                raise busy
            self._waiting.append(run)
            self._prompt_work[run] = work
            self._outboxes[run] = outbox
            self._cv.notify_all()
        return RequestStream(run, queue)

    def precompute_chunks(
        self,
        chunks: list[list[int]],
        prefix_ids: list[int] | None = None,
        priority: PrecomputePriority = PrecomputePriority.INGEST,
        on_unit: Callable[[int, float], None] | None = None,
    ) -> list[ChunkKV]:
        """The chunks' KV (as Engine.precompute_chunks), computed by the worker under the policy above.

        Blocks the calling thread (never call it from an event loop); raises SchedulerStopped when the
        scheduler stops first. Runs in the caller's thread when the scheduler is not started.
        on_unit(tokens, seconds) is called after each unit with its compute time (no queueing time).
        """
        if not chunks:
            return []
        job = PrecomputeJob(chunks=chunks, prefix_ids=prefix_ids, priority=priority, on_unit=on_unit)
        with self._cv:
            inline = self._thread is None or threading.current_thread() is self._thread
            if not inline:
                if self._stopping:
                    raise SchedulerStopped("the engine scheduler is stopping")
                # Stable insertion: after every job of the same or a more urgent priority.
                at = sum(1 for j in self._precompute_jobs if j.priority <= priority)
                self._precompute_jobs.insert(at, job)
                self._cv.notify_all()
        if inline:
            while not job.future.done():
                self._precompute_unit(job)
        return job.future.result()

    def run_when_idle(self, work: Callable[[], object]) -> object:
        """Run `work()` on the worker when no question, answer or chunk precompute waits; block for its result.

        For background engine work (a calibration) in small pieces: each piece runs between the worker's
        iterations, only when it is otherwise idle, so it delays a question by at most one piece. Runs in the
        caller's thread when the scheduler is not started; raises SchedulerStopped when it stops first.
        """
        call = _IdleCall(work)
        with self._cv:
            inline = self._thread is None or threading.current_thread() is self._thread
            if not inline:
                if self._stopping:
                    raise SchedulerStopped("the engine scheduler is stopping")
                self._idle_calls.append(call)
                self._cv.notify_all()
        if inline:
            return work()
        return call.future.result()

    # --------------------------------------------------------------------------------------- worker
    def _work(self) -> None:
        while (iteration := self._pick()) is not None:
            try:
                for run, outcome in self._execute(iteration):
                    self._deliver(run, outcome)
            except Exception:  # a bug here must not kill the worker: every later request would hang
                logger.exception("engine worker step failed")
        self._shutdown()

    def _pick(self) -> _Iteration | None:
        """Wait for work and decide this iteration's (questions first); None once the scheduler stops."""
        with self._cv:
            self._running = [r for r in self._running if r.status == RequestStatus.DECODING]
            while (
                not self._stopping
                and not self._waiting
                and not self._running
                and not self._precompute_jobs
                and not self._idle_calls
            ):
                self._cv.wait()
            if self._stopping:
                return None
            head = self._precompute_jobs[0] if self._precompute_jobs else None
            if head is not None and head.priority == PrecomputePriority.QUESTION:
                return _Iteration(precompute=head)
            if self._waiting and len(self._running) < self.max_running:
                self._num_prompt_passes += 1
                return _Iteration(prompt=self._waiting.popleft())
            if head is not None and not self._waiting:
                return _Iteration(precompute=head)
            if self._idle_calls and not self._waiting and not self._running:
                return _Iteration(idle=self._idle_calls.popleft())
            return _Iteration()

    def _execute(self, iteration: _Iteration) -> Iterator[Outcome]:
        """Run the iteration's prompt work, then one decode step of the running requests."""
        if iteration.precompute is not None:
            self._precompute_unit(iteration.precompute)
        elif iteration.idle is not None:
            try:
                iteration.idle.future.set_result(iteration.idle.work())
            except Exception as exc:  # the caller gets it; the worker goes on
                iteration.idle.future.set_exception(exc)
        elif iteration.prompt is not None:
            yield self._prompt(iteration.prompt)
        if self._running:
            yield from self._decode_step()

    def _deliver(self, run: RequestRun, outcome: list[GenerationEvent] | EngineError) -> None:
        """Hand a run's events (or its error) to its consumer; a finished run lets go of its cache."""
        outbox = self._outboxes.get(run)
        items: list[GenerationEvent | BaseException] = list(outcome) if isinstance(outcome, list) else [outcome]
        for item in items:
            try:
                if outbox is not None:
                    outbox(item)
            except RuntimeError:  # the consumer's event loop is closed: nobody is listening any more
                run.cancel_requested.set()
        if run.finished:
            if run.status == RequestStatus.FINISHED:  # ended by itself: how much of its limit an answer uses
                self.rates.observe_answer(run.num_completion_tokens, run.request.sampling.max_tokens)
            run.release()
            with self._cv:
                self._outboxes.pop(run, None)

    def _precompute_unit(self, job: PrecomputeJob) -> None:
        start = len(job.results)
        end, tokens = start, 0
        while end < len(job.chunks) and (end == start or tokens + len(job.chunks[end]) <= self.precompute_unit_tokens):
            tokens += len(job.chunks[end])
            end += 1
        t0 = time.perf_counter()
        try:
            job.results.extend(self.engine.precompute_chunks(job.chunks[start:end], job.prefix_ids))
            seconds = time.perf_counter() - t0
            self.rates.observe_prompt("full", tokens, seconds)  # every token computed: a full pass's rate
            if job.on_unit is not None:
                job.on_unit(tokens, seconds)
        except Exception as exc:  # the caller gets it; the worker goes on
            logger.exception("chunk precompute failed")
            self._drop_job(job)
            job.future.set_exception(exc)
            return
        if job.done:
            self._drop_job(job)
            job.future.set_result(job.results)

    def _drop_job(self, job: PrecomputeJob) -> None:
        with self._cv:
            if job in self._precompute_jobs:
                self._precompute_jobs.remove(job)

    def _cancelled(self, run: RequestRun) -> bool:
        return self._stopping or run.cancel_requested.is_set()

    def _prompt(self, run: RequestRun) -> Outcome:
        last_round = started = time.perf_counter()
        with self._cv:
            self._in_pass, self._pass_started, self._pass_decode_s = run, started, 0.0

        def between_layers() -> None:
            # The prompt pass is split at its layers: the requests already decoding take their next step
            # in between, so one long prompt does not stall every other answer.
            nonlocal last_round
            # `_waiting` is read without the lock: a request queued a moment ago only changes which interval
            # this one check uses.
            interval = DECODE_WHILE_QUESTIONS_WAIT_S if self._waiting else DECODE_DURING_PROMPT_S
            if self._running and time.perf_counter() - last_round >= interval:
                t0 = time.perf_counter()
                for other, outcome in self._decode_step():
                    self._deliver(other, outcome)
                last_round = time.perf_counter()
                self._pass_decode_s += last_round - t0  # not the pass's own compute

        try:
            outcome: list[GenerationEvent] | EngineError = self.engine.run_prompt(
                run, between_layers=between_layers, cancelled=lambda: self._cancelled(run)
            )
        except Exception as exc:
            outcome = self._failure(run, exc)
        finally:
            with self._cv:
                self._num_prompt_passes -= 1
                self._in_pass = None
                work = self._prompt_work.pop(run, None)
                if run.status == RequestStatus.DECODING:
                    self._running.append(run)
        if work is not None and run.first_token_time is not None:  # a whole pass (not cancelled, not failed)
            compute_s = run.first_token_time - started - self._pass_decode_s
            self.rates.observe_prompt(work.mode, work.num_fresh_tokens, compute_s)
        return run, outcome

    def _decode_step(self) -> Iterator[Outcome]:
        """One decode step of every running request: cancelled ones finish, the rest decode batched."""
        active: list[RequestRun] = []
        for run in self._running:
            if run.status != RequestStatus.DECODING:
                continue
            if self._cancelled(run):
                yield run, [run.cancel()]
            else:
                active.append(run)
        if not active:
            return
        t0 = time.perf_counter()
        try:
            per_run = self.engine.decode(active)
        except Exception as exc:
            for run in active:
                yield run, self._failure(run, exc)
            return
        self.rates.observe_decode_step(len(active), time.perf_counter() - t0)
        yield from zip(active, per_run, strict=True)

    def _failure(self, run: RequestRun, exc: Exception) -> EngineError:
        logger.error("request %s failed", run.request.request_id, exc_info=exc)
        run.fail()
        if isinstance(exc, EngineError):
            return exc
        wrapped = EngineError(f"generation failed: {exc}")
        wrapped.__cause__ = exc  # callers react to typed causes (e.g. a corrupt KV entry)
        return wrapped

    def _shutdown(self) -> None:
        with self._cv:
            waiting, running = list(self._waiting), list(self._running)
            jobs = list(self._precompute_jobs)
            idle_calls = list(self._idle_calls)
            self._idle_calls.clear()
            self._waiting.clear()
            self._prompt_work.clear()
            self._running = []
            self._precompute_jobs = []
        for run in waiting:
            run.status = RequestStatus.CANCELLED
            if run.request.kv_reader is not None:
                run.request.kv_reader.close()
            self._deliver(run, SchedulerStopped("the engine scheduler stopped before this request ran"))
        for run in running:
            if not run.finished:
                self._deliver(run, [run.cancel()])
        for job in jobs:
            job.future.set_exception(SchedulerStopped("the engine scheduler stopped before this precompute ran"))
        for call in idle_calls:
            call.future.set_exception(SchedulerStopped("the engine scheduler stopped before this work ran"))
