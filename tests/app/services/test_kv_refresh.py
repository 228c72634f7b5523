"""After a model switch the library's KV is recomputed in the background: old entries evicted first, the
new model's computed through the one KV writer, coverage fresh again; chunks another tokenizer encoded are
re-encoded before anything reads them."""

from __future__ import annotations

from pathlib import Path

import pytest
from enginetest_tiny import build_model
from hash_embedder import HashEmbedder

from app.components import Components
from app.services.coverage_service import CoverageService
from app.services.ingest import IngestService, IngestSource
from app.services.kv_refresh import KVRefresh, plan_refresh
from engine.scheduler import Scheduler
from ingest.chunker import encode_chunk_text

DOCS = {
    "zorblat": "The capital of the planet Zorblat is Quintaro. Quintaro has purple rivers.",
    "bread": "Sourdough needs flour, water, salt and a starter. Let it rise overnight.",
}


def _ingest(components: Components) -> None:
    service = IngestService(components)
    sources = [IngestSource(kind="text", title=t, text=x) for t, x in DOCS.items()]
    service.run_job(service.submit(sources, enqueue=False).job_id)


@pytest.fixture(scope="module")
def other_engine(tmp_path_factory: pytest.TempPathFactory):
    """Another model (other weights, same tokenizer): what the server is switched to."""
    from engine.config import EngineSettings
    from engine.engine import Engine

    path = build_model(tmp_path_factory.mktemp("other-llama"), "llama", seed=1)
    return Engine(EngineSettings(model=str(path), device="cpu", dtype="float32"), tmp_path_factory.mktemp("m"))


def _components_on(settings, engine) -> Components:  # noqa: ANN001 - test helper
    from app.catalog import Catalog
    from kvcache.store import TieredKVStore
    from retrieval.retriever import Retriever

    return Components(
        settings=settings,
        catalog=Catalog(settings.catalog.url or ""),
        engine=engine,
        store=TieredKVStore(settings.kvcache),
        retriever=Retriever.open(settings.index_dir, settings.retrieval, embedder=HashEmbedder()),  # type: ignore[arg-type]
    )


def test_a_model_switch_evicts_the_old_entries_then_recomputes_every_chunk(
    make_fast_settings, make_fast_components, other_engine, tmp_path: Path
) -> None:
    settings = make_fast_settings()
    before = make_fast_components(settings)
    _ingest(before)
    old_keys = sorted({c.kv_key for c in before.catalog.iter_chunks()})
    assert all(before.store.contains(k) for k in old_keys)
    before.store.close()

    switched = _components_on(settings.model_copy(update={"engine": other_engine.settings}), other_engine)
    try:
        coverage = CoverageService(switched).compute()
        assert (coverage.chunks_fresh, coverage.chunks_stale) == (0, len(old_keys))  # another model's KV
        plan = plan_refresh(switched)
        assert (len(plan.stale), plan.num_retokenized, plan.old_keys) == (len(old_keys), 0, old_keys)
        refresh = KVRefresh(switched, Scheduler(other_engine), plan)  # not started: it computes inline
        refresh.run()
        assert refresh.num_done == len(old_keys)
        assert not any(switched.store.contains(k) for k in old_keys)  # evicted
        chunks = switched.catalog.iter_chunks()
        assert all(c.kv_key == switched.expected_kv_key(c.token_ids) for c in chunks)
        assert all(switched.store.contains(c.kv_key) for c in chunks)
        coverage = CoverageService(switched).compute()
        assert (coverage.chunks_fresh, coverage.chunks_stale, coverage.coverage) == (len(chunks), 0, 1.0)
        assert plan_refresh(switched).stale == []  # nothing left: the next start does no work
    finally:
        switched.close()


def test_chunks_of_another_tokenizer_are_re_encoded_from_their_text(make_fast_settings, make_fast_components) -> None:
    components = make_fast_components(make_fast_settings())
    _ingest(components)
    chunk = components.catalog.iter_chunks()[0]
    # What another model's tokenizer left: ids that mean something else to this one.
    components.catalog.set_chunk_token_ids({chunk.id: [5, 6, 7]})
    plan = plan_refresh(components)
    assert (plan.num_retokenized, [c.id for c in plan.stale]) == (1, [chunk.id])
    again = next(c for c in components.catalog.iter_chunks() if c.id == chunk.id)
    assert again.token_ids == encode_chunk_text(components.engine.tokenizer, chunk.text) == chunk.token_ids
    assert plan.old_keys == []  # its entry is still this model's: kept, and found by the writer
    KVRefresh(components, Scheduler(components.engine), plan).run()
    again = next(c for c in components.catalog.iter_chunks() if c.id == chunk.id)
    assert again.kv_key == chunk.kv_key
