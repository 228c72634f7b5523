"""AskService on the fast stack (tiny random Llama, hash embedder): exact and quick."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from app.build import Services, new_ask, new_ingest, new_scheduler
from app.services.ask.types import AskRequest, DoneEvent, SourcesEvent, TokenDelta
from app.services.ingest import IngestSource
from retrieval.types import SearchFilters

DOCS = {
    "zorblat": "Quintaro is the capital of Zorblat. It has purple rivers and a kite festival in May.",
    "bread": "Sourdough needs flour, water, salt and a starter. Bake it at 250 degrees for forty minutes.",
    "moon": "The Moon orbits the Earth every 27.3 days and always shows the same face.",
}


@pytest.fixture
def ingested(services: Services) -> dict[str, str]:
    service = new_ingest(services)
    submitted = service.submit(
        [IngestSource(kind="text", title=t, text=x, tags=[t]) for t, x in DOCS.items()], enqueue=False
    )
    service.run_job(submitted.job_id)
    return dict(zip(DOCS, submitted.document_ids, strict=True))


def ask(services: Services, request: AskRequest) -> list:
    async def go() -> list:
        scheduler = new_scheduler(services.settings, services.engine)
        scheduler.start()
        try:
            return [e async for e in new_ask(services, scheduler=scheduler).ask(request)]
        finally:
            await asyncio.to_thread(scheduler.stop)

    return asyncio.run(go())


def test_events_come_in_order_and_tokens_make_the_answer(services: Services, ingested) -> None:
    events = ask(services, AskRequest(question="What is the capital of Zorblat?", top_k=2, max_tokens=6))
    assert isinstance(events[0], SourcesEvent)
    assert isinstance(events[-1], DoneEvent)
    assert all(isinstance(e, TokenDelta) for e in events[1:-1])
    done = events[-1]
    assert done.answer == "".join(e.text for e in events[1:-1])
    assert len(events[0].sources) == 2
    assert [s.rank for s in events[0].sources] == [1, 2]
    assert events[0].sources[0].document_id == ingested["zorblat"]
    assert done.kv_hits == 2 and done.kv_misses == 0
    assert done.mode == "blend"
    assert (done.finish_reason, done.usage.completion_tokens) == ("length", 6)


def test_a_repetition_stop_reaches_done_with_what_it_withheld(
    services: Services, ingested, monkeypatch: pytest.MonkeyPatch
) -> None:
    from engine.sampling import IncrementalDetokenizer
    from engine.types import RepeatedLine

    # The tiny model writes random tokens: the text they decode to is scripted, the engine's stop is real.
    script = iter(["Quintaro is the capital.", " It has purple rivers.", " Quintaro is the capital.", " More"])
    monkeypatch.setattr(IncrementalDetokenizer, "add", lambda self, token_id: next(script))
    events = ask(services, AskRequest(question="What is the capital of Zorblat?", top_k=2, max_tokens=4))
    done = events[-1]
    assert isinstance(done, DoneEvent)
    assert (done.finish_reason, done.usage.completion_tokens) == ("repetition", 3)
    assert done.answer == "Quintaro is the capital. It has purple rivers."
    assert done.repeated_line == RepeatedLine("Quintaro is the capital.", 0)


def test_blend_at_ratio_one_answers_exactly_like_full(services: Services, ingested) -> None:
    q = "When is the kite festival?"
    full = ask(services, AskRequest(question=q, top_k=3, mode="full", max_tokens=8))[-1]
    blend = ask(services, AskRequest(question=q, top_k=3, mode="blend", recompute_ratio=1.0, max_tokens=8))[-1]
    assert full.mode == "full" and blend.mode == "blend"
    assert blend.answer == full.answer
    assert blend.recompute_ratio == 1.0
    assert full.usage.prompt_tokens == blend.usage.prompt_tokens


def test_filters_restrict_sources(services: Services, ingested) -> None:
    events = ask(
        services,
        AskRequest(question="capital?", top_k=3, max_tokens=2, filters=SearchFilters(document_ids=[ingested["moon"]])),
    )
    assert [s.document_id for s in events[0].sources] == [ingested["moon"]]
    events = ask(
        services, AskRequest(question="capital?", top_k=3, max_tokens=2, filters=SearchFilters(tags=["bread"]))
    )
    assert [s.document_id for s in events[0].sources] == [ingested["bread"]]


def test_missing_kv_is_recomputed_and_counted(services: Services, ingested, monkeypatch) -> None:
    import threading

    real = services.engine.precompute_chunks
    threads: list[str] = []

    def recording(chunks, prefix_ids=None, max_batch_tokens=4096):
        threads.append(threading.current_thread().name)
        return real(chunks, prefix_ids, max_batch_tokens)

    monkeypatch.setattr(services.engine, "precompute_chunks", recording)
    for chunk in services.catalog.iter_chunks():
        services.store.delete(chunk.kv_key)
    done = ask(services, AskRequest(question="capital of Zorblat?", top_k=2, max_tokens=2))[-1]
    assert (done.kv_hits, done.kv_misses) == (0, 2)
    # Both chunks in one scheduler job, run by the engine's worker; a lone stateless question (no
    # conversation, no history) stores no turn entry of its own.
    assert threads == ["blendrag-engine"]
    done = ask(services, AskRequest(question="capital of Zorblat?", top_k=2, max_tokens=2))[-1]
    assert (done.kv_hits, done.kv_misses) == (2, 0)


def test_no_documents_still_answers_without_context(services: Services) -> None:
    events = ask(services, AskRequest(question="Hello?", max_tokens=3))
    assert events[0].sources == []
    assert events[-1].mode == "full"
    assert events[-1].usage.context_tokens == 0


def test_corrupt_entry_found_mid_request_is_recomputed(tmp_path, make_fast_settings, make_fast_services) -> None:
    """Disk-only store; one entry's last bytes flipped: its checksum fails while layers stream in."""
    settings = make_fast_settings(kvcache={"memory_bytes": 0})
    services = make_fast_services(settings)
    try:
        service = new_ingest(services)
        submitted = service.submit([IngestSource(kind="text", title="zorblat", text=DOCS["zorblat"])], enqueue=False)
        service.run_job(submitted.job_id)
        (chunk,) = services.catalog.chunks_of(submitted.document_ids[0])
        files = [p for p in (tmp_path / "data" / "kv").rglob("*") if p.is_file() and chunk.kv_key in p.name]
        assert len(files) == 1
        data = bytearray(files[0].read_bytes())
        for i in range(1, 65):
            data[-i] ^= 0xFF
        files[0].write_bytes(bytes(data))

        reference = ask(services, AskRequest(question="capital?", mode="full", max_tokens=4))[-1]
        done = ask(services, AskRequest(question="capital?", mode="blend", recompute_ratio=1.0, max_tokens=4))[-1]
        assert isinstance(done, DoneEvent)
        assert done.answer == reference.answer
        assert (done.kv_hits, done.kv_misses) == (1, 1)
        assert services.store.stats().num_faults >= 1
        assert services.store.contains(chunk.kv_key) == "disk"  # stored again, healthy
    finally:
        services.close()


def test_every_mode_decodes_with_the_same_repetition_control(
    services: Services, ingested, monkeypatch: pytest.MonkeyPatch
) -> None:
    from engine.scheduler import Scheduler

    seen = []
    submit = Scheduler.submit

    def spy(self, request, **kwargs):
        seen.append((request.mode, request.sampling))
        return submit(self, request, **kwargs)

    monkeypatch.setattr(Scheduler, "submit", spy)
    for mode in ("full", "prefix", "reuse", "blend"):
        events = ask(services, AskRequest(question="What is the capital of Zorblat?", top_k=2, mode=mode, max_tokens=5))
        assert isinstance(events[-1], DoneEvent)
    assert [m for m, _ in seen] == ["full", "prefix", "reuse", "blend"]
    settings = services.settings.engine
    assert {s for _, s in seen} == {settings.sampling_params(max_tokens=5)}
    assert seen[0][1].stop_on_repeated_line is True


def test_a_store_that_keeps_nothing_still_answers_from_the_kv_it_computed(
    tmp_path, make_fast_settings, make_fast_services, monkeypatch
) -> None:
    """Memory tier off and a disk tier that refuses every write (a 1-byte budget): the question computes its
    chunks' KV once and serves that, instead of reading the store again and failing."""
    writer = make_fast_services(make_fast_settings())
    service = new_ingest(writer)
    submitted = service.submit([IngestSource(kind="text", title="zorblat", text=DOCS["zorblat"])], enqueue=False)
    service.run_job(submitted.job_id)
    for chunk in writer.catalog.iter_chunks():
        writer.store.delete(chunk.kv_key)
    writer.retriever.save()

    services = make_fast_services(make_fast_settings(kvcache={"memory_bytes": 0, "disk_bytes": 1}))
    assert services.store.tier_names == ("disk",)
    real = services.engine.precompute_chunks
    computed: list[list[int]] = []

    def recording(chunks, prefix_ids=None, max_batch_tokens=4096):
        computed.extend(list(c) for c in chunks)
        return real(chunks, prefix_ids, max_batch_tokens)

    monkeypatch.setattr(services.engine, "precompute_chunks", recording)
    q = "What is the capital of Zorblat?"
    (chunk,) = services.catalog.iter_chunks()
    reference = ask(services, AskRequest(question=q, top_k=1, mode="full", max_tokens=4))[-1]
    assert chunk.token_ids not in computed  # full prefill needs no stored KV (only its own turn's entry)
    done = ask(services, AskRequest(question=q, top_k=1, mode="blend", recompute_ratio=1.0, max_tokens=4))[-1]
    assert isinstance(done, DoneEvent)
    assert done.answer == reference.answer
    assert (done.kv_hits, done.kv_misses) == (0, 1)
    assert computed.count(chunk.token_ids) == 1  # computed once
    assert services.store.contains(chunk.kv_key) is None  # and indeed not kept


def test_a_client_that_disconnects_during_the_prompt_pass_fails_nothing(
    services: Services, ingested, monkeypatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The KV source is the engine worker's to close: the event loop never closes it under the worker."""
    import threading

    inside, release = threading.Event(), threading.Event()
    closed_by: list[str] = []
    open_layers = services.store.open_layers

    class Gated:
        """The store's real layer source, held at layer 1 until the client has gone."""

        def __init__(self, source) -> None:
            self._source = source
            self.num_layers, self.num_tokens = source.num_layers, source.num_tokens

        def layer(self, layer_idx: int):
            if layer_idx == 1:
                inside.set()
                release.wait(30)
            return self._source.layer(layer_idx)

        def close(self) -> None:
            closed_by.append(threading.current_thread().name)
            self._source.close()

    monkeypatch.setattr(services.store, "open_layers", lambda *a, **kw: Gated(open_layers(*a, **kw)))

    async def go() -> None:
        scheduler = new_scheduler(services.settings, services.engine)
        scheduler.start()
        try:
            events = new_ask(services, scheduler=scheduler).ask(
                AskRequest(question="capital of Zorblat?", top_k=2, mode="reuse", max_tokens=4)
            )
            assert isinstance(await events.__anext__(), SourcesEvent)
            reader = asyncio.create_task(events.__anext__())
            await asyncio.to_thread(inside.wait, 30)
            reader.cancel()  # the client disconnects: the server's task is cancelled mid-stream
            with pytest.raises(asyncio.CancelledError):
                await reader
            await events.aclose()
            release.set()
            deadline = time.monotonic() + 30
            while scheduler.queue_depth or not closed_by:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.01)
        finally:
            release.set()
            await asyncio.to_thread(scheduler.stop)

    with caplog.at_level(logging.INFO):
        asyncio.run(go())
    assert closed_by == ["blendrag-engine"]
    assert "request failed" not in caplog.text and "ask failed" not in caplog.text


def test_a_question_the_stopping_scheduler_never_ran_ends_with_code_cancelled(
    services: Services, ingested, monkeypatch
) -> None:
    import threading

    from app.services.ask.types import ErrorEvent

    inside, release = threading.Event(), threading.Event()
    open_layers = services.store.open_layers

    class Gated:
        """Holds the first question's prompt pass at layer 1, so the second one waits behind it."""

        def __init__(self, source) -> None:
            self._source = source
            self.num_layers, self.num_tokens = source.num_layers, source.num_tokens

        def layer(self, layer_idx: int):
            if layer_idx == 1 and not inside.is_set():
                inside.set()
                release.wait(30)
            return self._source.layer(layer_idx)

        def close(self) -> None:
            self._source.close()

    monkeypatch.setattr(services.store, "open_layers", lambda *a, **kw: Gated(open_layers(*a, **kw)))

    async def go() -> tuple[list, list]:
        scheduler = new_scheduler(services.settings, services.engine)
        scheduler.start()
        service = new_ask(services, scheduler=scheduler)
        request = AskRequest(question="capital of Zorblat?", top_k=2, mode="reuse", max_tokens=4)
        first = await service.admit(request)
        await asyncio.to_thread(inside.wait, 30)
        second = await service.admit(request)  # waits: the worker is inside the first prompt pass
        stopping = asyncio.create_task(asyncio.to_thread(scheduler.stop))
        deadline = time.monotonic() + 30
        while not scheduler._stopping:  # stop() has begun (it then waits for the worker)
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        release.set()
        await stopping
        return [e async for e in first.events()], [e async for e in second.events()]

    first, second = asyncio.run(go())
    assert isinstance(first[-1], DoneEvent) and first[-1].finish_reason == "cancelled"
    assert isinstance(second[-1], ErrorEvent) and second[-1].code == "cancelled"
