"""After a model switch the library's KV is recomputed in the background: old entries evicted first, the
new model's computed through the one KV writer, coverage fresh again; chunks another tokenizer encoded are
re-encoded before anything reads them."""

from __future__ import annotations

from pathlib import Path

import pytest
from enginetest_tiny import build_model
from hash_embedder import HashEmbedder

from app.build import Services, build_services, new_ingest
from app.services.ingest import IngestSource
from app.services.kv_refresh import KVRefresh, RefreshPlan, plan_refresh
from engine.scheduler import Scheduler
from ingest.chunker import encode_chunk_text

DOCS = {
    "zorblat": "The capital of the planet Zorblat is Quintaro. Quintaro has purple rivers.",
    "bread": "Sourdough needs flour, water, salt and a starter. Let it rise overnight.",
}


def _ingest(services: Services) -> None:
    service = new_ingest(services)
    sources = [IngestSource(kind="text", title=t, text=x) for t, x in DOCS.items()]
    service.run_job(service.submit(sources, enqueue=False).job_id)


@pytest.fixture(scope="module")
def other_engine(tmp_path_factory: pytest.TempPathFactory):
    """Another model (other weights, same tokenizer): what the server is switched to."""
    from engine.config import EngineSettings
    from engine.engine import Engine

    path = build_model(tmp_path_factory.mktemp("other-llama"), "llama", seed=1)
    return Engine(EngineSettings(model=str(path), device="cpu", dtype="float32"), tmp_path_factory.mktemp("m"))


def _services_on(settings, engine) -> Services:  # noqa: ANN001 - test helper
    return build_services(settings, {"coverage", "documents"}, engine=engine, embedder=HashEmbedder())  # type: ignore[arg-type]


def _plan(services: Services) -> RefreshPlan:
    assert services.catalog is not None and services.engine is not None and services.kv_space is not None
    return plan_refresh(services.catalog, services.engine.tokenizer, services.kv_space)


def _refresh(services: Services, plan: RefreshPlan) -> KVRefresh:
    """The refresh on an unstarted scheduler: it computes inline."""
    assert services.catalog is not None and services.engine is not None and services.kv_space is not None
    scheduler = Scheduler(services.engine)
    return KVRefresh(services.catalog, services.engine, services.kv_space, scheduler, plan)


def test_a_model_switch_evicts_the_old_entries_then_recomputes_every_chunk(
    make_fast_settings, make_fast_services, other_engine, tmp_path: Path
) -> None:
    settings = make_fast_settings()
    before = make_fast_services(settings)
    _ingest(before)
    old_keys = sorted({c.kv_key for c in before.catalog.iter_chunks()})
    assert all(before.store.contains(k) for k in old_keys)
    before.store.close()

    switched = _services_on(settings.model_copy(update={"engine": other_engine.settings}), other_engine)
    try:
        coverage = switched.coverage.compute()
        assert (coverage.chunks_fresh, coverage.chunks_stale) == (0, len(old_keys))  # another model's KV
        plan = _plan(switched)
        assert (len(plan.stale), plan.num_retokenized, plan.old_keys) == (len(old_keys), 0, old_keys)
        refresh = _refresh(switched, plan)
        refresh.run()
        assert refresh.num_done == len(old_keys)
        assert not any(switched.store.contains(k) for k in old_keys)  # evicted
        chunks = switched.catalog.iter_chunks()
        assert all(c.kv_key == switched.kv_space.key(c.token_ids) for c in chunks)
        assert all(switched.store.contains(c.kv_key) for c in chunks)
        coverage = switched.coverage.compute()
        assert (coverage.chunks_fresh, coverage.chunks_stale, coverage.coverage) == (len(chunks), 0, 1.0)
        assert _plan(switched).stale == []  # nothing left: the next start does no work
    finally:
        switched.close()


def test_chunks_of_another_tokenizer_are_re_encoded_from_their_text(make_fast_settings, make_fast_services) -> None:
    services = make_fast_services(make_fast_settings())
    _ingest(services)
    chunk = services.catalog.iter_chunks()[0]
    # What another model's tokenizer left: ids that mean something else to this one.
    services.catalog.set_chunk_token_ids({chunk.id: [5, 6, 7]})
    plan = _plan(services)
    assert (plan.num_retokenized, [c.id for c in plan.stale]) == (1, [chunk.id])
    again = next(c for c in services.catalog.iter_chunks() if c.id == chunk.id)
    assert again.token_ids == encode_chunk_text(services.engine.tokenizer, chunk.text) == chunk.token_ids
    assert plan.old_keys == []  # its entry is still this model's: kept, and found by the writer
    _refresh(services, plan).run()
    again = next(c for c in services.catalog.iter_chunks() if c.id == chunk.id)
    assert again.kv_key == chunk.kv_key
