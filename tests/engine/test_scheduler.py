"""The scheduler: concurrent requests don't mix state, cancellation is prompt, a full queue says busy."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time

import pytest
import torch
from enginetest_tiny import random_chunks

from engine.admission import AdmissionEstimate
from engine.generation import RequestStatus
from engine.scheduler import PrecomputePriority, Scheduler, SchedulerStopped
from engine.types import (
    BlendConfig,
    EngineBusy,
    EngineError,
    FinishEvent,
    GenerationRequest,
    SamplingParams,
    TokenEvent,
)
from kvcache.types import InMemoryLayerReader


def _request(engine, i: int, max_tokens: int = 8, mode: str = "blend") -> GenerationRequest:
    chunks = random_chunks([15 + i, 20], seed=100 + i)
    layout = engine.prompt.layout(chunks, f"question number {i}?")
    return GenerationRequest(
        f"r{i}",
        layout,
        InMemoryLayerReader(engine.precompute_chunks(chunks)),
        mode,
        BlendConfig(recompute_ratio=0.3),
        SamplingParams(max_tokens=max_tokens, ignore_eos=True),
    )


def _gated(request: GenerationRequest, release: threading.Event) -> GenerationRequest:
    """The request with a KV reader that blocks its prompt pass at its first layer until `release` is set."""

    class GatedSource(InMemoryLayerReader):
        def layer(self, layer_idx: int):
            release.wait(30)
            return super().layer(layer_idx)

    return dataclasses.replace(request, kv_reader=GatedSource(request.kv_reader._chunks))


async def _collect(stream) -> list:
    return [event async for event in stream]


async def _wait_until(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


async def test_concurrent_equals_sequential(tiny_engine) -> None:
    expected = [
        [e.token_id for e in tiny_engine.generate(_request(tiny_engine, i)) if isinstance(e, TokenEvent)]
        for i in range(4)
    ]
    async with Scheduler(tiny_engine, max_queue=8, max_running=3) as scheduler:
        streams = [scheduler.submit(_request(tiny_engine, i)) for i in range(4)]
        results = await asyncio.wait_for(asyncio.gather(*(_collect(s) for s in streams)), 60)
    for i, events in enumerate(results):
        assert [e.token_id for e in events if isinstance(e, TokenEvent)] == expected[i]
        fin = events[-1]
        assert isinstance(fin, FinishEvent) and fin.finish_reason == "length" and fin.ttft_s > 0


async def test_consumer_that_stops_cancels_request(tiny_engine) -> None:
    async with Scheduler(tiny_engine) as scheduler:
        stream = scheduler.submit(_request(tiny_engine, 0, max_tokens=100_000))
        seen = 0
        async for event in stream:
            assert isinstance(event, TokenEvent)
            seen += 1
            if seen == 2:
                break
        await stream.aclose()
        await _wait_until(lambda: scheduler.num_running == 0 and stream.status == RequestStatus.CANCELLED)
        # The model is free again for the next caller.
        events = await asyncio.wait_for(_collect(scheduler.submit(_request(tiny_engine, 1, max_tokens=3))), 30)
        assert events[-1].finish_reason == "length"


async def test_dropped_iterator_and_cancelled_task_cancel(tiny_engine) -> None:
    async with Scheduler(tiny_engine) as scheduler:

        async def consume_forever() -> None:
            async for _ in scheduler.submit(_request(tiny_engine, 2, max_tokens=100_000)):
                pass

        task = asyncio.create_task(consume_forever())
        await _wait_until(lambda: scheduler.num_running == 1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await _wait_until(lambda: scheduler.num_running == 0)

        async def first_event_only() -> None:
            async for _ in scheduler.submit(_request(tiny_engine, 3, max_tokens=100_000)):
                break  # no aclose: dropping the iterator is enough

        await first_event_only()
        await _wait_until(lambda: scheduler.num_running == 0)


async def test_cancel_before_prompt_pass(tiny_engine) -> None:
    async with Scheduler(tiny_engine, max_running=1) as scheduler:
        blocker = scheduler.submit(_request(tiny_engine, 0, max_tokens=100_000))
        await blocker.__anext__()
        waiting = scheduler.submit(_request(tiny_engine, 1))
        waiting.cancel()
        blocker.cancel()
        events = await asyncio.wait_for(_collect(waiting), 30)
        assert len(events) == 1 and events[0].finish_reason == "cancelled" and events[0].num_completion_tokens == 0


async def test_full_queue_raises_busy(tiny_engine) -> None:
    async with Scheduler(tiny_engine, max_queue=1, max_running=1) as scheduler:
        running = scheduler.submit(_request(tiny_engine, 0, max_tokens=100_000))
        await running.__anext__()  # it is running now
        queued = scheduler.submit(_request(tiny_engine, 1, max_tokens=2))
        with pytest.raises(EngineBusy, match="max_queue=1") as busy:
            scheduler.submit(_request(tiny_engine, 2))
        assert busy.value.retry_after_s >= 1.0  # when the queued one is expected to start, a second at least
        running.cancel()
        events = await asyncio.wait_for(_collect(queued), 30)
        assert events[-1].finish_reason == "length"


async def test_failed_request_reports_error_and_worker_survives(tiny_engine) -> None:
    bad = _request(tiny_engine, 0)
    bad = dataclasses.replace(
        bad, kv_reader=InMemoryLayerReader(tiny_engine.precompute_chunks(random_chunks([5], seed=1)))
    )  # wrong size
    async with Scheduler(tiny_engine) as scheduler:
        with pytest.raises(EngineError, match="KV reader"):
            await asyncio.wait_for(_collect(scheduler.submit(bad)), 30)
        events = await asyncio.wait_for(_collect(scheduler.submit(_request(tiny_engine, 1, max_tokens=2))), 30)
        assert events[-1].finish_reason == "length"


async def test_stop_cancels_running_and_refuses_new(tiny_engine) -> None:
    scheduler = Scheduler(tiny_engine)
    scheduler.start()
    stream = scheduler.submit(_request(tiny_engine, 0, max_tokens=100_000))
    await stream.__anext__()
    await asyncio.to_thread(scheduler.stop)
    events = await asyncio.wait_for(_collect(stream), 10)
    assert events[-1].finish_reason == "cancelled"
    with pytest.raises(SchedulerStopped):
        scheduler.submit(_request(tiny_engine, 1))


async def test_source_error_keeps_its_cause(tiny_engine) -> None:
    class BrokenSource(InMemoryLayerReader):
        def layer(self, layer_idx: int):
            if layer_idx == 2:
                raise OSError("disk read failed")
            return super().layer(layer_idx)

    req = _request(tiny_engine, 0)
    req = dataclasses.replace(req, kv_reader=BrokenSource(req.kv_reader._chunks))  # same chunks, fails mid-way
    async with Scheduler(tiny_engine) as scheduler:
        with pytest.raises(EngineError) as info:
            await asyncio.wait_for(_collect(scheduler.submit(req)), 30)
    assert isinstance(info.value.__cause__, OSError)


async def test_queue_depth_counts_the_request_in_its_prompt_pass(tiny_engine) -> None:
    release = threading.Event()

    req = _gated(_request(tiny_engine, 0, max_tokens=2), release)
    async with Scheduler(tiny_engine, max_queue=4, max_running=2) as scheduler:
        assert scheduler.queue_depth == 0
        stream = scheduler.submit(req)
        await _wait_until(lambda: scheduler.num_prompt_passes == 1)
        assert (scheduler.num_waiting, scheduler.num_running, scheduler.queue_depth) == (0, 0, 1)
        release.set()
        events = await asyncio.wait_for(_collect(stream), 30)
        assert events[-1].finish_reason == "length"
        await _wait_until(lambda: scheduler.queue_depth == 0)
        assert scheduler.num_prompt_passes == 0


async def test_readmit_skips_the_queue_limit(tiny_engine) -> None:
    async with Scheduler(tiny_engine, max_queue=1, max_running=1) as scheduler:
        running = scheduler.submit(_request(tiny_engine, 0, max_tokens=100_000))
        await running.__anext__()
        queued = scheduler.submit(_request(tiny_engine, 1, max_tokens=2))
        with pytest.raises(EngineBusy):
            scheduler.submit(_request(tiny_engine, 2, max_tokens=2))
        again = scheduler.submit(_request(tiny_engine, 3, max_tokens=2), readmit=True)  # an admitted retry
        assert scheduler.num_waiting == 2
        running.cancel()
        for stream in (queued, again):
            events = await asyncio.wait_for(_collect(stream), 30)
            assert events[-1].finish_reason == "length"


async def test_decoding_requests_go_on_during_a_long_prompt_pass(tiny_engine) -> None:
    window: list[float] = []  # when the slow prompt pass read its first and its last layer
    lock = threading.Lock()

    class SlowSource(InMemoryLayerReader):
        """A prompt pass whose every layer takes 0.3 s (slow storage or a long prompt)."""

        def layer(self, layer_idx: int):
            with lock:
                window.append(time.perf_counter())
            time.sleep(0.3)
            return super().layer(layer_idx)

    slow = _request(tiny_engine, 1, max_tokens=1)
    slow = dataclasses.replace(slow, kv_reader=SlowSource(slow.kv_reader._chunks))
    async with Scheduler(tiny_engine, max_queue=4, max_running=4) as scheduler:
        running = scheduler.submit(_request(tiny_engine, 0, max_tokens=100_000))
        await running.__anext__()  # decoding
        slow_stream = scheduler.submit(slow)
        token_times: list[float] = []

        async def read_tokens() -> None:
            async for _event in running:
                token_times.append(time.perf_counter())

        reader = asyncio.create_task(read_tokens())
        slow_events = await asyncio.wait_for(_collect(slow_stream), 60)
        running.cancel()
        await asyncio.wait_for(reader, 30)
    assert slow_events[-1].finish_reason == "length"
    start, end = window[0], window[-1]
    during = [t for t in token_times if start < t < end]
    # 4 layers × 0.3 s, a decode turn at each of the 3 boundaries inside the window; without the split the
    # worker is stuck in the prompt pass and no token comes at all.
    assert len(during) >= 2, (len(during), end - start)


async def test_chunk_precompute_through_scheduler_equals_engine(tiny_engine) -> None:
    chunks = random_chunks([9, 30, 4, 17], seed=7)
    expected = tiny_engine.precompute_chunks(chunks)
    units: list[int] = []
    async with Scheduler(tiny_engine, precompute_unit_tokens=35) as scheduler:
        kvs = await asyncio.to_thread(
            scheduler.precompute_chunks, chunks, on_unit=lambda tokens, seconds: units.append(tokens)
        )
    assert units == [9, 34, 17]  # units of at most 35 tokens, at least one chunk, in order
    assert [kv.num_tokens for kv in kvs] == [9, 30, 4, 17]
    for got, want in zip(kvs, expected, strict=True):
        torch.testing.assert_close(got.k, want.k)
        torch.testing.assert_close(got.v, want.v)


def test_unstarted_scheduler_precomputes_in_the_callers_thread(tiny_engine) -> None:
    chunks = random_chunks([6, 11], seed=8)
    kvs = Scheduler(tiny_engine).precompute_chunks(chunks)
    torch.testing.assert_close(kvs[1].v, tiny_engine.precompute_chunks(chunks)[1].v)


async def test_questions_go_before_ingest(tiny_engine, monkeypatch) -> None:
    """While an ingest unit runs, a question's chunk recompute and a prompt pass arrive: both go first."""
    request = _request(tiny_engine, 0, max_tokens=2)
    real, real_prompt_pass = tiny_engine.precompute_chunks, tiny_engine.prompt_pass
    calls: list[int | str] = []  # first chunk length of each precompute unit, or "prompt", in the order they ran
    release = threading.Event()

    def recording(chunks, prefix_ids=None, max_batch_tokens=4096):
        calls.append(len(chunks[0]))
        if len(calls) == 1:
            assert release.wait(30)
        return real(chunks, prefix_ids, max_batch_tokens)

    def recording_prompt_pass(*args, **kwargs):
        calls.append("prompt")
        return real_prompt_pass(*args, **kwargs)

    monkeypatch.setattr(tiny_engine, "precompute_chunks", recording)
    monkeypatch.setattr(tiny_engine, "prompt_pass", recording_prompt_pass)
    ingest_chunks = random_chunks([11, 12, 13], seed=9)
    question_chunks = random_chunks([5], seed=10)
    async with Scheduler(tiny_engine, precompute_unit_tokens=1) as scheduler:
        ingest = asyncio.create_task(asyncio.to_thread(scheduler.precompute_chunks, ingest_chunks))
        await _wait_until(lambda: len(calls) == 1)  # the first ingest unit runs and blocks
        question = asyncio.create_task(
            asyncio.to_thread(scheduler.precompute_chunks, question_chunks, priority=PrecomputePriority.QUESTION)
        )
        await _wait_until(lambda: scheduler.num_precompute_jobs == 2)
        stream = scheduler.submit(request)
        release.set()
        events = await asyncio.wait_for(_collect(stream), 30)
        kvs = await asyncio.wait_for(ingest, 30)
        await asyncio.wait_for(question, 30)
    # The running ingest unit finishes; then the question's chunk, the prompt pass, the rest of ingest.
    assert calls == [11, 5, "prompt", 12, 13]
    assert events[-1].finish_reason == "length"
    assert [kv.num_tokens for kv in kvs] == [11, 12, 13]


async def test_stop_fails_pending_precompute(tiny_engine, monkeypatch) -> None:
    release = threading.Event()
    real = tiny_engine.precompute_chunks

    def blocking(chunks, prefix_ids=None, max_batch_tokens=4096):
        assert release.wait(30)
        return real(chunks, prefix_ids, max_batch_tokens)

    monkeypatch.setattr(tiny_engine, "precompute_chunks", blocking)
    scheduler = Scheduler(tiny_engine, precompute_unit_tokens=1)
    scheduler.start()
    pending = asyncio.create_task(asyncio.to_thread(scheduler.precompute_chunks, random_chunks([4, 5], seed=11)))
    await _wait_until(lambda: scheduler.num_precompute_jobs == 1)
    stopping = asyncio.create_task(asyncio.to_thread(scheduler.stop))
    await asyncio.sleep(0.05)
    release.set()
    await stopping
    with pytest.raises(SchedulerStopped):
        await asyncio.wait_for(pending, 30)


async def test_failed_precompute_raises_to_its_caller_and_the_worker_goes_on(tiny_engine, monkeypatch) -> None:
    real = tiny_engine.precompute_chunks

    def failing_on_seven(chunks, prefix_ids=None, max_batch_tokens=4096):
        if any(len(c) == 7 for c in chunks):
            raise RuntimeError("no memory for this chunk")
        return real(chunks, prefix_ids, max_batch_tokens)

    request = _request(tiny_engine, 1, max_tokens=2)
    monkeypatch.setattr(tiny_engine, "precompute_chunks", failing_on_seven)
    async with Scheduler(tiny_engine, precompute_unit_tokens=1) as scheduler:
        bad = asyncio.to_thread(scheduler.precompute_chunks, random_chunks([5, 7, 9], seed=12))
        good = asyncio.to_thread(scheduler.precompute_chunks, random_chunks([6, 8], seed=13))
        results = await asyncio.wait_for(asyncio.gather(bad, good, return_exceptions=True), 30)
        assert isinstance(results[0], RuntimeError) and str(results[0]) == "no memory for this chunk"
        assert [kv.num_tokens for kv in results[1]] == [6, 8]
        assert scheduler.num_precompute_jobs == 0
        events = await asyncio.wait_for(_collect(scheduler.submit(request)), 30)
        assert events[-1].finish_reason == "length"


async def test_cancel_during_the_prompt_pass_stops_at_a_layer_and_the_worker_closes_the_source(
    tiny_engine, caplog: pytest.LogCaptureFixture
) -> None:
    inside, release = threading.Event(), threading.Event()
    layers_read: list[int] = []
    closed_by: list[str] = []

    class GatedSource(InMemoryLayerReader):
        def layer(self, layer_idx: int):
            layers_read.append(layer_idx)
            if layer_idx == 1:
                inside.set()
                release.wait(30)
            return super().layer(layer_idx)

        def close(self) -> None:
            closed_by.append(threading.current_thread().name)

    req = _request(tiny_engine, 0, mode="reuse")
    req = dataclasses.replace(req, kv_reader=GatedSource(req.kv_reader._chunks))
    async with Scheduler(tiny_engine) as scheduler:
        stream = scheduler.submit(req)
        await asyncio.to_thread(inside.wait, 30)
        stream.cancel()  # the consumer goes away while the worker is inside layer 1
        release.set()
        events = await asyncio.wait_for(_collect(stream), 30)
    assert [e.finish_reason for e in events] == ["cancelled"]
    # Stopped at the first boundary the worker reached after the cancel (before layer 1, or before layer 2 when
    # it passed that one first): the source is read at most one layer ahead (engine/stored_context.py).
    assert layers_read in ([0, 1], [0, 1, 2])
    assert closed_by == ["blendrag-engine"]
    assert "failed" not in caplog.text


async def test_the_scheduler_measures_what_its_wait_estimate_needs(tiny_engine) -> None:
    async with Scheduler(tiny_engine, max_queue=4, max_running=2) as scheduler:
        rates = scheduler.rates
        assert rates.prompt_rate("blend") is None and rates.step_s(1) is None
        idle = AdmissionEstimate(wait_s=0.0, slot_s=0.0, num_waiting=0, num_running=0)
        assert scheduler.admission() == idle  # nothing ahead: no rate needed
        events = await asyncio.wait_for(_collect(scheduler.submit(_request(tiny_engine, 0, max_tokens=4))), 30)
        assert events[-1].finish_reason == "length"
        await asyncio.to_thread(scheduler.precompute_chunks, random_chunks([12], seed=7))
        blend, full, step = rates.prompt_rate("blend"), rates.prompt_rate("full"), rates.step_s(1)
        assert blend is not None and blend > 0 and full is not None and full > 0 and step is not None and step > 0
        assert rates.expected_decode_tokens(10, 0) == 10  # the answer used its whole limit (ignore_eos)
        assert scheduler.admission() == idle


async def test_a_wait_over_max_queue_wait_s_is_refused_with_when_it_would_fit(tiny_engine) -> None:
    release = threading.Event()

    req = _gated(_request(tiny_engine, 0, max_tokens=2), release)
    async with Scheduler(tiny_engine, max_queue=4, max_running=2, max_queue_wait_s=60.0) as scheduler:
        # A machine that computes a hundredth of a token a second: the pass in the way (its suffix and 11 of its 35
        # context tokens fresh) takes over 1,200 s, far past the limit however long the test itself takes.
        scheduler.rates.seed_full_rate(0.01)
        try:
            stream = scheduler.submit(req)
            await _wait_until(lambda: scheduler.num_prompt_passes == 1)
            wait_s = scheduler.admission().wait_s
            assert wait_s is not None and wait_s > 1000
            refusal = scheduler.refusal()
            assert refusal is not None and refusal.retry_after_s > 1000 - 60
            with pytest.raises(EngineBusy, match=r"max_queue_wait_s=60\)") as refused:
                scheduler.submit(_request(tiny_engine, 1, max_tokens=2))
            assert refused.value.retry_after_s > 1000 - 60
            assert scheduler.num_waiting == 0  # refused although the queue has room
        finally:
            release.set()
        events = await asyncio.wait_for(_collect(stream), 30)
        assert events[-1].finish_reason == "length"


async def test_decoding_steps_less_often_during_a_pass_while_other_questions_wait(tiny_engine, monkeypatch) -> None:
    """The worker's clock advances 0.1 s per layer the slow pass reads (and nowhere else): with nobody else
    waiting the decoding request steps at every boundary between the pass's layers (0.1 s ≥
    DECODE_DURING_PROMPT_S); while another question waits, only once DECODE_WHILE_QUESTIONS_WAIT_S (0.15 s) has
    passed, so at every other boundary."""
    from engine import scheduler as scheduler_module

    clock = [0.0]
    monkeypatch.setattr(scheduler_module.time, "perf_counter", lambda: clock[0])
    steps: list[int] = [0]
    at_first_layer: list[int] = []  # decode steps taken before the pass read its first layer
    at_last_layer: list[int] = []  # … and its last

    queued = threading.Event()  # the pass reads its first layer only once the test has queued what it queues

    class ClockedSource(InMemoryLayerReader):
        def layer(self, layer_idx: int):
            assert queued.wait(30)
            if not at_first_layer:
                at_first_layer.append(steps[0])
            clock[0] += 0.1
            if layer_idx == tiny_engine.num_layers - 1:
                at_last_layer.append(steps[0])
            return super().layer(layer_idx)

    original = Scheduler._decode_step

    def counting(self):  # type: ignore[no-untyped-def]
        steps[0] += 1
        return original(self)

    monkeypatch.setattr(Scheduler, "_decode_step", counting)

    async def steps_during_pass(with_waiting: bool) -> int:
        slow = _request(tiny_engine, 1, max_tokens=1)
        slow = dataclasses.replace(slow, kv_reader=ClockedSource(slow.kv_reader._chunks))
        async with Scheduler(tiny_engine, max_queue=4, max_running=2) as scheduler:
            running = scheduler.submit(_request(tiny_engine, 0, max_tokens=100_000))
            await running.__anext__()  # decoding
            slow_stream = scheduler.submit(slow)
            # max_running=2: this one waits for its pass until a running request ends.
            waiting = scheduler.submit(_request(tiny_engine, 2, max_tokens=1)) if with_waiting else None
            queued.set()
            slow_events = await asyncio.wait_for(_collect(slow_stream), 60)
            running.cancel()
            if waiting is not None:
                await asyncio.wait_for(_collect(waiting), 60)
        assert slow_events[-1].finish_reason == "length"
        queued.clear()
        # Only the steps between the pass's layers (the worker steps before the pass starts as well).
        return at_last_layer.pop() - at_first_layer.pop()

    # Between the pass's first and last stored layer there are num_layers - 1 boundaries, each 0.1 s on the worker's
    # clock after the last: a step at each while nobody else waits, at every other one while a question waits.
    boundaries = tiny_engine.num_layers - 1
    assert await steps_during_pass(with_waiting=False) == boundaries
    assert await steps_during_pass(with_waiting=True) == boundaries // 2
