"""The catalog's typed records: what every store returns (never live ORM rows) and what writers hand in.

A record is read from its ORM row by `from_row`: a column the record carries under the same name is
named nowhere else (the row and the record only; the API's Out models read the record the same way)."""

from __future__ import annotations

import uuid
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any, TypeVar

import numpy as np

from app.catalog.models import (
    DEFAULT_COLLECTION,
    ChunkRow,
    DocumentRow,
    DocumentStatus,
    IndexEventOp,
    JobRow,
    JobStatus,
)
from ingest.chunker import Chunk

R = TypeVar("R")


def encode_token_ids(token_ids: Sequence[int]) -> bytes:
    return np.asarray(token_ids, dtype="<i4").tobytes()


def decode_token_ids(blob: bytes) -> list[int]:
    return np.frombuffer(blob, dtype="<i4").tolist()


@dataclass(frozen=True)
class DocumentRecord:
    id: str
    title: str
    source_path: str | None
    content_hash: str | None
    status: DocumentStatus
    error: str | None
    tags: list[str]
    metadata: dict[str, Any]
    num_chunks: int
    num_tokens: int
    job_id: str | None
    created_at: datetime
    updated_at: datetime
    collection: str = DEFAULT_COLLECTION


@dataclass(frozen=True)
class ChunkRecord:
    id: int
    document_id: str
    index: int
    text: str
    token_ids: list[int]
    page: int | None
    kv_key: str | None
    title: str = ""
    char_start: int = 0
    char_end: int = 0

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


@dataclass(frozen=True)
class NewChunk(Chunk):
    """A chunker's chunk as the catalog stores it: with its KV entry's key and its passage embedding."""

    kv_key: str | None = None
    embedding: np.ndarray | None = None  # (dim,) float32 passage embedding, for replicas' indexes

    @classmethod
    def of(cls, chunk: Chunk, kv_key: str | None, embedding: np.ndarray | None) -> NewChunk:
        return cls(**{f.name: getattr(chunk, f.name) for f in fields(Chunk)}, kv_key=kv_key, embedding=embedding)


@dataclass(frozen=True)
class IndexEntry:
    """A ready chunk with what an in-memory index needs: its embedding (None if never stored) and tags."""

    chunk: ChunkRecord
    tags: list[str]
    embedding: np.ndarray | None  # (dim,) float32
    collection: str = DEFAULT_COLLECTION


@dataclass(frozen=True)
class IndexEvent:
    id: int
    document_id: str
    op: IndexEventOp
    collection: str = DEFAULT_COLLECTION


@dataclass(frozen=True)
class CollectionCounts:
    """One collection's size in the catalog (its coverage comes from the CoverageService)."""

    name: str
    num_documents: int
    num_ready_documents: int
    num_chunks: int


@dataclass
class JobRecord:
    id: str
    status: JobStatus
    stage: str | None
    progress: dict[str, Any]
    errors: list[dict[str, Any]]
    spec: dict[str, Any]
    document_ids: list[str]
    duplicate_ids: list[str]
    cancel_requested: bool
    created_at: datetime
    updated_at: datetime
    collection: str = DEFAULT_COLLECTION


@dataclass(frozen=True)
class NewDocument:
    """A document to add, pending until its job commits it."""

    title: str
    source_path: str | None = None
    content_hash: str | None = None
    tags: list[str] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    job_id: str | None = None
    collection: str = DEFAULT_COLLECTION
    id: str = field(default_factory=lambda: str(uuid.uuid4()))

    def row(self, now: datetime) -> dict[str, Any]:
        """Its `documents` row, for a bulk insert."""
        return {
            "id": self.id,
            "title": self.title,
            "source_path": self.source_path,
            "content_hash": self.content_hash,
            "status": DocumentStatus.PENDING,
            "error": None,
            "tags": self.tags,
            "metadata_": self.metadata,
            "num_chunks": 0,
            "num_tokens": 0,
            "job_id": self.job_id,
            "collection": self.collection,
            "created_at": now,
            "updated_at": now,
        }


@dataclass(frozen=True)
class JobUpdate:
    """The columns of an ingest job to change: a field left None stays as it is; `clear_stage` sets the
    stage to none (a job that stopped running)."""

    status: JobStatus | None = None
    stage: str | None = None
    clear_stage: bool = False
    progress: dict[str, Any] | None = None
    errors: list[dict[str, Any]] | None = None
    spec: dict[str, Any] | None = None
    document_ids: list[str] | None = None
    duplicate_ids: list[str] | None = None
    cancel_requested: bool | None = None

    def values(self) -> dict[str, Any]:
        """The columns to set."""
        values = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "clear_stage"}
        changed = {name: value for name, value in values.items() if value is not None}
        if self.clear_stage:
            changed["stage"] = None
        return changed


def from_row(record_type: type[R], row: Any, **values: Any) -> R:
    """A record read from an ORM row: each field from the row's attribute of the same name, except those in
    `values` (stored differently: decoded, copied out of a JSON column, or not on the row). A column the
    record also carries is named here by nobody: a new one is added to the row and the record only."""
    names = [f.name for f in fields(record_type) if f.name not in values]  # type: ignore[arg-type]
    return record_type(**{name: getattr(row, name) for name in names}, **values)


def document_record(row: DocumentRow) -> DocumentRecord:
    return from_row(DocumentRecord, row, tags=list(row.tags or []), metadata=dict(row.metadata_ or {}))


def chunk_record(row: ChunkRow, title: str = "") -> ChunkRecord:
    return from_row(ChunkRecord, row, token_ids=decode_token_ids(row.token_ids_blob), title=title)


def job_record(row: JobRow) -> JobRecord:
    return from_row(
        JobRecord,
        row,
        progress=dict(row.progress or {}),
        errors=list(row.errors or []),
        spec=dict(row.spec or {}),
        document_ids=list(row.document_ids or []),
        duplicate_ids=list(row.duplicate_ids or []),
    )


def in_collection(collection: str | None) -> tuple[Any, ...]:
    """WHERE clauses for one collection (none: every collection)."""
    return () if collection is None else (DocumentRow.collection == collection,)


def in_collections(collections: Collection[str] | None, column: Any = None) -> tuple[Any, ...]:
    """WHERE clauses for a set of collections (None: every collection; an empty set matches nothing)."""
    if collections is None:
        return ()
    return ((DocumentRow.collection if column is None else column).in_(sorted(collections)),)


def encode_embedding(vector: np.ndarray | None) -> bytes | None:
    return None if vector is None else np.asarray(vector, dtype="<f4").tobytes()


def decode_embedding(blob: bytes | None) -> np.ndarray | None:
    return None if blob is None else np.frombuffer(blob, dtype="<f4").copy()
