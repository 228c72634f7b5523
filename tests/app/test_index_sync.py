"""One index for all replicas: each replica's in-memory FAISS follows the PostgreSQL catalog's change log.

Real PostgreSQL and FAISS; embeddings are given (stored in the catalog), so no model is loaded.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest
from pgserver import pg_server, pg_url  # noqa: F401
from sqlalchemy import event

from app.catalog import Catalog, DocumentStatus
from app.catalog.records import NewChunk, NewDocument
from app.index_sync import CatalogFedRetriever, EmbedOnlyRetriever, IndexSync
from retrieval.config import RetrievalSettings
from retrieval.types import IndexedChunk, SearchFilters

DIM = 8


class CountingEmbedder:
    """Stands in for MiniLM where a test needs chunks embedded; records what it was asked to embed."""

    def __init__(self) -> None:
        self.texts: list[str] = []

    def embed_passages(self, texts: list[str]) -> np.ndarray:
        self.texts.extend(texts)
        return np.stack([np.eye(DIM, dtype=np.float32)[len(t) % DIM] for t in texts])


def vector(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(DIM).astype(np.float32)


def commit_document(catalog: Catalog, title: str, num_chunks: int, seed: int) -> tuple[str, list[int]]:
    """What a worker's commit does: chunks with embeddings while pending, then the flip to ready."""
    doc = catalog.add_document(NewDocument(title=title, tags=["t"]))
    ids = catalog.replace_chunks(
        doc.id,
        [
            NewChunk(
                index=i,
                text=f"{title} part {i}",
                token_ids=[i],
                page=None,
                char_start=0,
                char_end=1,
                embedding=vector(seed * 100 + i),
            )
            for i in range(num_chunks)
        ],
    )
    catalog.set_document_status(doc.id, DocumentStatus.READY)
    return doc.id, ids


def replica(catalog: Catalog, interval_s: float = 0.05) -> tuple[CatalogFedRetriever, IndexSync]:
    retriever = CatalogFedRetriever(RetrievalSettings(), embedder=CountingEmbedder())
    sync = IndexSync(catalog, retriever, interval_s=interval_s)
    sync.rebuild()
    return retriever, sync


def wait_until(predicate, timeout: float = 5.0) -> float:  # noqa: ANN001
    """Seconds until predicate() held; fails after `timeout` (the issue's bound: 5 s)."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"not within {timeout} s")
        time.sleep(0.01)
    return time.monotonic() - start


@pytest.fixture
def catalogs(pg_url: str) -> Iterator[tuple[Catalog, Catalog, Catalog]]:  # noqa: F811
    """Three connections to one catalog: a worker's and two replicas'."""
    opened = (Catalog(pg_url), Catalog(pg_url), Catalog(pg_url))
    yield opened
    for c in opened:
        c.close()


def test_every_replica_sees_ready_and_deleted_documents_within_5_s(catalogs: tuple[Catalog, ...]) -> None:
    worker, cat_a, cat_b = catalogs
    old_doc, old_ids = commit_document(worker, "Before start", 2, seed=1)
    (a, sync_a), (b, sync_b) = replica(cat_a), replica(cat_b)
    assert a.chunk_ids() == b.chunk_ids() == old_ids  # built from the catalog at start
    sync_a.start()
    sync_b.start()
    try:
        doc, ids = commit_document(worker, "Fresh", 3, seed=2)
        wait_until(lambda: a.chunk_ids() == b.chunk_ids() == sorted(old_ids + ids))
        hit = a.search("", top_k=1, query_vector=vector(201))[0]
        assert (hit.chunk_id, hit.document_id, hit.title, hit.tags) == (ids[1], doc, "Fresh", ("t",))
        # deleted through replica B's catalog connection: gone from A too
        cat_b.delete_document(old_doc)
        wait_until(lambda: a.chunk_ids() == b.chunk_ids() == ids)
        # a pending document is never indexed; one that fails after being ready is dropped
        pending = worker.add_document(NewDocument(title="P"))
        worker.replace_chunks(
            pending.id,
            [NewChunk(index=0, text="p", token_ids=[1], page=None, char_start=0, char_end=1, embedding=vector(5))],
        )
        worker.set_document_status(doc, DocumentStatus.FAILED, error="re-ingest failed")
        wait_until(lambda: a.chunk_ids() == b.chunk_ids() == [])
    finally:
        sync_a.stop()
        sync_b.stop()
    # a replica started now catches up from the catalog alone
    late, _ = replica(cat_a)
    assert late.chunk_ids() == []


def test_two_jobs_committing_at_once_miss_no_chunk(catalogs: tuple[Catalog, ...]) -> None:
    """The slower of two simultaneous commits drew the lower event id. The replica polls while it is still
    open, and must neither skip it nor show the other one's chunks out of order."""
    slow, fast, reader = catalogs
    retriever, sync = replica(reader)
    in_commit, release = threading.Event(), threading.Event()
    slow_doc = slow.add_document(NewDocument(title="Slow"))
    slow_ids = slow.replace_chunks(
        slow_doc.id,
        [NewChunk(index=0, text="s", token_ids=[1], page=None, char_start=0, char_end=1, embedding=vector(7))],
    )

    def hold(_conn: object) -> None:
        in_commit.set()
        release.wait(10)

    event.listen(slow.engine, "commit", hold)
    committing = threading.Thread(target=slow.set_document_status, args=(slow_doc.id, DocumentStatus.READY))
    committing.start()
    assert in_commit.wait(10)
    fast_result: list[tuple[str, list[int]]] = []
    racing = threading.Thread(target=lambda: fast_result.append(commit_document(fast, "Fast", 2, seed=3)))
    racing.start()
    for _ in range(10):  # polls while the slow commit is open
        sync.poll()
        time.sleep(0.05)
    release.set()
    committing.join(10)
    racing.join(10)
    event.remove(slow.engine, "commit", hold)
    sync.poll()
    assert retriever.chunk_ids() == sorted(slow_ids + fast_result[0][1])


def test_many_concurrent_commits_end_identical_on_a_replica(catalogs: tuple[Catalog, ...]) -> None:
    worker_a, worker_b, reader = catalogs
    retriever, sync = replica(reader, interval_s=0.001)
    sync.start()
    barrier = threading.Barrier(2)

    def commit_many(catalog: Catalog, name: str) -> None:
        barrier.wait()
        for i in range(15):
            commit_document(catalog, f"{name}{i}", 2, seed=hash(name) % 1000 + i)

    threads = [threading.Thread(target=commit_many, args=(c, n)) for c, n in ((worker_a, "a"), (worker_b, "b"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    expected = sorted(c.id for c in reader.iter_chunks([DocumentStatus.READY]))
    assert len(expected) == 60
    wait_until(lambda: retriever.chunk_ids() == expected)
    sync.stop()


def test_chunks_without_a_stored_embedding_are_embedded_once(catalogs: tuple[Catalog, ...]) -> None:
    worker, reader, _ = catalogs
    doc = worker.add_document(NewDocument(title="Legacy"))
    ids = worker.replace_chunks(
        doc.id, [NewChunk(index=0, text="abc", token_ids=[1], page=None, char_start=0, char_end=3)]
    )
    worker.set_document_status(doc.id, DocumentStatus.READY)
    retriever, _ = replica(reader)
    assert retriever.chunk_ids() == ids
    assert retriever.embedder.texts == ["Legacy\nabc"]  # title + text, as at ingest
    stored = reader.index_entries()[0].embedding
    assert stored.tolist() == np.eye(DIM)[len("Legacy\nabc") % DIM].tolist()
    again, _ = replica(reader)
    assert again.embedder.texts == []  # stored: not embedded again


def test_a_replica_behind_pruned_events_rebuilds(catalogs: tuple[Catalog, ...]) -> None:
    from datetime import UTC, datetime, timedelta

    worker, reader, _ = catalogs
    retriever, sync = replica(reader)
    doc1, ids1 = commit_document(worker, "One", 1, seed=1)
    doc2, ids2 = commit_document(worker, "Two", 1, seed=2)
    worker.delete_document(doc1)
    assert worker.prune_index_events(datetime.now(UTC) + timedelta(seconds=1)) == 3  # all of them
    _, ids3 = commit_document(worker, "Three", 1, seed=3)
    assert sync.poll() == 1
    assert retriever.chunk_ids() == sorted(ids2 + ids3)


def test_a_workers_retriever_embeds_but_keeps_nothing() -> None:
    retriever = EmbedOnlyRetriever(RetrievalSettings(), embedder=CountingEmbedder())
    chunk = IndexedChunk(chunk_id=1, document_id="d", text="abc", title="T")
    assert retriever.embed_chunks([chunk]).shape == (1, DIM)
    retriever.add([chunk], np.ones((1, DIM), dtype=np.float32))
    assert retriever.count == 0 and retriever.save() is False


def test_replicas_keep_each_chunks_collection_for_the_search_filter(catalogs: tuple[Catalog, ...]) -> None:
    """The change log names the collection and a replica's index keeps it: a filtered search on a replica
    answers only from the collection asked for, for chunks indexed at start and after."""
    worker, cat_a, _ = catalogs
    first = worker.add_document(NewDocument(title="A"))
    a, sync_a = replica(cat_a)
    sync_a.start()
    try:
        docs = {}
        for name, seed in (("team-a", 1), ("team-b", 2)):
            doc = worker.add_document(NewDocument(title=name, collection=name))
            worker.replace_chunks(
                doc.id,
                [
                    NewChunk(
                        index=0, text=name, token_ids=[1], page=None, char_start=0, char_end=1, embedding=vector(seed)
                    )
                ],
            )
            worker.set_document_status(doc.id, DocumentStatus.READY)
            docs[name] = doc.id
        wait_until(lambda: len(a.chunk_ids()) == 2)
        assert [(e.document_id, e.collection) for e in worker.index_events_after(0)] == [
            (docs["team-a"], "team-a"),
            (docs["team-b"], "team-b"),
        ]
        only_b = a.search("", top_k=5, filters=SearchFilters(collections=["team-b"]), query_vector=vector(1))
        assert [h.document_id for h in only_b] == [docs["team-b"]]
    finally:
        sync_a.stop()
    rebuilt, _ = replica(cat_a)  # built from the catalog at start
    assert sorted(rebuilt.get(i).collection for i in rebuilt.chunk_ids()) == ["team-a", "team-b"]
    assert first.collection == "default"
