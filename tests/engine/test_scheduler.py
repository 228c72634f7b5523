"""The scheduler: concurrent requests don't mix state, cancellation is prompt, a full queue says busy."""

from __future__ import annotations

import asyncio
import time

import pytest
from enginetest_tiny import random_chunks

from engine.generation import RequestStatus
from engine.scheduler import Scheduler, SchedulerStopped
from engine.types import (
    BlendConfig,
    EngineBusy,
    EngineError,
    FinishEvent,
    GenerationRequest,
    SamplingParams,
    TokenEvent,
)
from kvcache.types import InMemoryLayerSource


def _request(engine, i: int, max_tokens: int = 8, mode: str = "blend") -> GenerationRequest:
    chunks = random_chunks([15 + i, 20], seed=100 + i)
    layout = engine.prompt.layout(chunks, f"question number {i}?")
    return GenerationRequest(
        f"r{i}",
        layout,
        InMemoryLayerSource(engine.prefill_chunks(chunks)),
        mode,
        BlendConfig(0.3),
        SamplingParams(max_tokens=max_tokens, ignore_eos=True),
    )


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
        with pytest.raises(EngineBusy, match="max_queue=1"):
            scheduler.submit(_request(tiny_engine, 2))
        running.cancel()
        events = await asyncio.wait_for(_collect(queued), 30)
        assert events[-1].finish_reason == "length"


async def test_failed_request_reports_error_and_worker_survives(tiny_engine) -> None:
    bad = _request(tiny_engine, 0)
    bad.kv_source = InMemoryLayerSource(tiny_engine.prefill_chunks(random_chunks([5], seed=1)))  # wrong size
    async with Scheduler(tiny_engine) as scheduler:
        with pytest.raises(EngineError, match="KV source"):
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
    class BrokenSource(InMemoryLayerSource):
        def layer(self, layer_idx: int):
            if layer_idx == 2:
                raise OSError("disk read failed")
            return super().layer(layer_idx)

    req = _request(tiny_engine, 0)
    req.kv_source = BrokenSource(req.kv_source._chunks)  # same chunks, fails mid-way
    async with Scheduler(tiny_engine) as scheduler:
        with pytest.raises(EngineError) as info:
            await asyncio.wait_for(_collect(scheduler.submit(req)), 30)
    assert isinstance(info.value.__cause__, OSError)


async def test_queue_depth_counts_the_request_in_its_prompt_pass(tiny_engine) -> None:
    import threading

    release = threading.Event()

    class GatedSource(InMemoryLayerSource):
        """Blocks the prompt pass at its first layer until the test lets it go."""

        def layer(self, layer_idx: int):
            release.wait(30)
            return super().layer(layer_idx)

    req = _request(tiny_engine, 0, max_tokens=2)
    req.kv_source = GatedSource(req.kv_source._chunks)
    async with Scheduler(tiny_engine, max_queue=4, max_running=2) as scheduler:
        assert scheduler.queue_depth == 0
        stream = scheduler.submit(req)
        await _wait_until(lambda: scheduler.num_prefilling == 1)
        assert (scheduler.num_waiting, scheduler.num_running, scheduler.queue_depth) == (0, 0, 1)
        release.set()
        events = await asyncio.wait_for(_collect(stream), 30)
        assert events[-1].finish_reason == "length"
        await _wait_until(lambda: scheduler.queue_depth == 0)
        assert scheduler.num_prefilling == 0


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
    import threading

    window: list[float] = []  # when the slow prompt pass read its first and its last layer
    lock = threading.Lock()

    class SlowSource(InMemoryLayerSource):
        """A prompt pass whose every layer takes 0.3 s (slow storage or a long prompt)."""

        def layer(self, layer_idx: int):
            with lock:
                window.append(time.perf_counter())
            time.sleep(0.3)
            return super().layer(layer_idx)

    slow = _request(tiny_engine, 1, max_tokens=1)
    slow.kv_source = SlowSource(slow.kv_source._chunks)
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
