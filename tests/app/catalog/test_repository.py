from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from app.catalog import Catalog, DocumentStatus, JobStatus
from app.catalog.records import JobUpdate, NewChunk, NewDocument, decode_token_ids, encode_token_ids
from ingest.chunker import Chunk


@pytest.fixture(params=["sqlite", "postgresql"])
def catalog(request: pytest.FixtureRequest, tmp_path: Path) -> Catalog:
    """The same tests against the embedded SQLite catalog and a real PostgreSQL server."""
    url = f"sqlite:///{tmp_path / 'cat.db'}" if request.param == "sqlite" else request.getfixturevalue("pg_url")
    c = Catalog(url)
    yield c
    c.close()


def _chunk(i: int, ids: list[int], key: str | None = None) -> NewChunk:
    return NewChunk(index=i, text=f"chunk {i}", token_ids=ids, page=None, char_start=0, char_end=7, kv_key=key)


def test_a_new_chunk_is_the_chunkers_chunk_with_its_kv_key_and_embedding() -> None:
    chunk = Chunk(index=3, text="some text\n\n", token_ids=[5, 6, 7], page=2, char_start=10, char_end=21)
    vector = np.arange(4, dtype=np.float32)
    new = NewChunk.of(chunk, "k" * 64, vector)
    assert (new.index, new.text, new.token_ids, new.page, new.char_start, new.char_end) == (
        3,
        "some text\n\n",
        [5, 6, 7],
        2,
        10,
        21,
    )
    assert new.kv_key == "k" * 64 and new.embedding is vector and new.num_tokens == 3


def test_token_ids_round_trip_exactly() -> None:
    ids = [0, 1, 49151, 2**31 - 1]
    assert decode_token_ids(encode_token_ids(ids)) == ids


def test_document_lifecycle_and_chunk_ids(catalog: Catalog) -> None:
    doc = catalog.add_document(NewDocument(title="A", source_path="/x/a.txt", tags=["t"]))
    assert doc.status == DocumentStatus.PENDING
    ids = catalog.replace_chunks(doc.id, [_chunk(0, [5, 6], "k0"), _chunk(1, [7], "k1")])
    assert len(ids) == 2 and ids[1] == ids[0] + 1
    assert catalog.get_document(doc.id).num_chunks == 2
    assert catalog.get_document(doc.id).num_tokens == 3
    # pending documents never answer
    assert catalog.ready_chunk_ids(ids) == set()
    catalog.set_document_status(doc.id, DocumentStatus.READY)
    assert catalog.ready_chunk_ids(ids) == set(ids)
    got = catalog.chunks_by_ids(ids)
    assert [got[i].token_ids for i in ids] == [[5, 6], [7]]
    assert got[ids[0]].title == "A"
    # replacing chunks drops the old ones
    new_ids = catalog.replace_chunks(doc.id, [_chunk(0, [9], "k9")])
    assert catalog.chunks_by_ids(ids) == {}
    assert [c.token_ids for c in catalog.chunks_of(doc.id)] == [[9]]
    assert catalog.ready_chunk_ids(new_ids) == set(new_ids)


def test_delete_returns_chunks_once_and_is_idempotent(catalog: Catalog) -> None:
    doc = catalog.add_document(NewDocument(title="A", content_hash="h"))
    catalog.replace_chunks(doc.id, [_chunk(0, [1], "shared"), _chunk(1, [2], "own")])
    other = catalog.add_document(NewDocument(title="B", content_hash="h2"))
    catalog.replace_chunks(other.id, [_chunk(0, [1], "shared")])
    deleted = catalog.delete_document(doc.id)
    assert sorted(c.kv_key for c in deleted) == ["own", "shared"]
    assert catalog.delete_document(doc.id) is None
    # the shared KV entry is still referenced by B's chunk, the other is not
    assert catalog.referenced_kv_keys({"own", "shared"}) == {"shared"}


def test_find_by_hash_respects_status(catalog: Catalog) -> None:
    doc = catalog.add_document(NewDocument(title="A"))
    catalog.set_content_hash(doc.id, "abc", {"k": 1})
    assert catalog.find_by_hash("abc", [DocumentStatus.PENDING]).id == doc.id
    assert catalog.find_by_hash("abc", [DocumentStatus.READY]) is None
    assert catalog.get_document(doc.id).metadata == {"k": 1}


def test_jobs(catalog: Catalog) -> None:
    job = catalog.create_job({"sources": []})
    assert job.status == JobStatus.QUEUED and not job.status.finished
    catalog.update_job(
        job.id, JobUpdate(status=JobStatus.RUNNING, stage="embed", progress={"embed": {"done": 1, "total": 2}})
    )
    got = catalog.get_job(job.id)
    assert (got.status, got.stage, got.progress) == (JobStatus.RUNNING, "embed", {"embed": {"done": 1, "total": 2}})
    assert [j.id for j in catalog.jobs_with_status([JobStatus.RUNNING])] == [job.id]
    assert JobStatus.CANCELLED.finished


def test_list_documents_pages(catalog: Catalog) -> None:
    for i in range(5):
        catalog.add_document(NewDocument(title=f"d{i}"))
    page, total = catalog.list_documents(offset=0, limit=2)
    assert total == 5 and len(page) == 2
    rest, _ = catalog.list_documents(offset=2, limit=10)
    assert len(rest) == 3
    assert {d.id for d in page}.isdisjoint({d.id for d in rest})


def test_collections_scope_reads_deletes_and_jobs(catalog: Catalog) -> None:
    ids = {}
    for name in ("a", "b"):
        job = catalog.create_job({}, collection=name)
        doc = catalog.add_document(
            NewDocument(title=name, source_path="same.txt", content_hash="h", job_id=job.id, collection=name)
        )
        catalog.replace_chunks(doc.id, [_chunk(0, [1, 2], key="shared")])
        catalog.set_document_status(doc.id, DocumentStatus.READY)
        ids[name] = doc.id
    chunk_a, chunk_b = catalog.chunks_of(ids["a"])[0].id, catalog.chunks_of(ids["b"])[0].id
    assert catalog.ready_chunk_ids([chunk_a, chunk_b], {"b"}) == {chunk_b}
    assert catalog.ready_chunk_ids([chunk_a, chunk_b]) == {chunk_a, chunk_b}
    assert [j.collection for j in catalog.list_jobs(collections={"a"})] == ["a"]
    assert [(e.collection, e.chunk.id) for e in catalog.index_entries()] == [("a", chunk_a), ("b", chunk_b)]
    assert [c.id for c in catalog.iter_chunks(collections={"a"})] == [chunk_a]
    assert [(c.name, c.num_documents, c.num_ready_documents, c.num_chunks) for c in catalog.collection_counts()] == [
        ("a", 1, 1, 1),
        ("b", 1, 1, 1),
    ]
    assert catalog.find_by_hashes({"h"}, [DocumentStatus.READY], "b")["h"].id == ids["b"]
    catalog.set_document_status(ids["a"], DocumentStatus.FAILED, error="x")
    assert catalog.delete_documents_with_status(DocumentStatus.FAILED, {"b"})[0] == 0
    assert catalog.delete_documents_with_status(DocumentStatus.FAILED, {"a"})[0] == 1
    assert catalog.referenced_kv_keys({"shared"}) == {"shared"}  # b's chunk still uses the entry
    assert catalog.list_documents(collections=set())[1] == 0


def test_job_update_sets_only_what_it_names(catalog: Catalog) -> None:
    job = catalog.create_job({"sources": []})
    catalog.update_job(job.id, JobUpdate(status=JobStatus.RUNNING, stage="kv", errors=[{"source": "a"}]))
    catalog.update_job(job.id, JobUpdate(document_ids=["d1"]))  # status, stage and errors stay
    got = catalog.get_job(job.id)
    assert (got.status, got.stage, got.errors, got.document_ids) == (JobStatus.RUNNING, "kv", [{"source": "a"}], ["d1"])
    catalog.update_job(job.id, JobUpdate(status=JobStatus.FAILED, clear_stage=True, errors=[]))
    got = catalog.get_job(job.id)
    assert (got.status, got.stage, got.errors, got.document_ids) == (JobStatus.FAILED, None, [], ["d1"])
    assert JobUpdate().values() == {} and JobUpdate(clear_stage=True).values() == {"stage": None}


def test_new_documents_are_pending_and_keep_their_fields(catalog: Catalog) -> None:
    one = NewDocument(title="A", source_path="a.md", content_hash="h", tags=["t"], metadata={"k": 1}, collection="c")
    doc = catalog.add_document(one)
    assert doc.id == one.id and doc.status == DocumentStatus.PENDING
    assert (doc.title, doc.source_path, doc.content_hash, doc.tags, doc.metadata, doc.collection) == (
        "A",
        "a.md",
        "h",
        ["t"],
        {"k": 1},
        "c",
    )
    many = [NewDocument(title=f"B{i}", job_id="j") for i in range(3)]
    catalog.add_documents(many)
    assert [catalog.get_document(d.id).title for d in many] == ["B0", "B1", "B2"]
    assert len({d.id for d in many}) == 3  # each new document draws its own id


def test_from_row_reads_every_field_of_the_record_by_name() -> None:
    from dataclasses import dataclass

    from app.catalog.records import from_row

    @dataclass(frozen=True)
    class Record:
        id: str
        title: str

    class Row:
        id = "r1"
        title = "stored"
        other = "not in the record"

    assert from_row(Record, Row()) == Record("r1", "stored")
    assert from_row(Record, Row(), title="decoded") == Record("r1", "decoded")
    with pytest.raises(AttributeError):  # a record field the row lacks is an error, not a silent default

        @dataclass(frozen=True)
        class Wider(Record):
            extra: int = 0

        from_row(Wider, Row())
