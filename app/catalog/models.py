"""SQLAlchemy tables. Chunk ids are integers because they double as FAISS ids."""

from __future__ import annotations

import enum
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, Boolean, DateTime, Enum, Float, ForeignKey, Integer, LargeBinary, String, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship


def utcnow() -> datetime:
    return datetime.now(UTC)


DEFAULT_COLLECTION = "default"  # where documents go without a `collection`, and where older catalogs migrated


class Base(DeclarativeBase):
    pass


def serial_id_column() -> Mapped[int]:
    """An integer primary key; with the table's `sqlite_autoincrement`, an id is never handed out twice."""
    return mapped_column(Integer, primary_key=True, autoincrement=True)


def parent_id_column(parent_id: str) -> Mapped[str]:
    """The id of the row this one belongs to (`parent_id`: "table.id"); deleted with it."""
    return mapped_column(ForeignKey(parent_id, ondelete="CASCADE"), index=True)


def created_at_column() -> Mapped[datetime]:
    """When the row was written (UTC)."""
    return mapped_column(DateTime(timezone=True), default=utcnow)


def updated_at_column(*, on_write: bool = True, index: bool | None = None) -> Mapped[datetime]:
    """When the row last changed (UTC): set at every write, or (`on_write` False) by the code that changes it."""
    return mapped_column(DateTime(timezone=True), default=utcnow, onupdate=utcnow if on_write else None, index=index)


def collection_column(*, index: bool | None = True) -> Mapped[str]:
    """The collection a row belongs to; rows from before collections existed are in the default one."""
    return mapped_column(String(64), index=index, default=DEFAULT_COLLECTION, server_default=DEFAULT_COLLECTION)


def children(back_populates: str, order_by: str) -> Any:
    """A parent's ordered child rows, deleted with it."""
    return relationship(back_populates=back_populates, cascade="all, delete-orphan", order_by=order_by)


class DocumentStatus(enum.StrEnum):
    PENDING = "pending"  # visible, not answerable yet: its job has not committed it
    READY = "ready"  # committed: chunks indexed, KV stored
    FAILED = "failed"


class JobStatus(enum.StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        return self in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED)


class DocumentRow(Base):
    __tablename__ = "documents"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    title: Mapped[str] = mapped_column(String(512))
    source_path: Mapped[str | None] = mapped_column(String(2048), index=True, nullable=True)
    content_hash: Mapped[str | None] = mapped_column(String(64), index=True, nullable=True)
    status: Mapped[DocumentStatus] = mapped_column(Enum(DocumentStatus), index=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    tags: Mapped[list[str]] = mapped_column(JSON, default=list)
    metadata_: Mapped[dict[str, Any]] = mapped_column("metadata", JSON, default=dict)
    num_chunks: Mapped[int] = mapped_column(Integer, default=0)
    num_tokens: Mapped[int] = mapped_column(Integer, default=0)
    job_id: Mapped[str | None] = mapped_column(String(36), index=True, nullable=True)
    collection: Mapped[str] = collection_column()
    created_at: Mapped[datetime] = created_at_column()
    updated_at: Mapped[datetime] = updated_at_column()

    chunks: Mapped[list[ChunkRow]] = children("document", order_by="ChunkRow.index")


class ChunkRow(Base):
    __tablename__ = "chunks"
    # AUTOINCREMENT: a deleted chunk's id is never handed out again, so a FAISS entry that outlived its
    # chunk (crash between the two writes) can never point at an unrelated, newer chunk.
    __table_args__ = {"sqlite_autoincrement": True}

    id: Mapped[int] = serial_id_column()
    document_id: Mapped[str] = parent_id_column("documents.id")
    index: Mapped[int] = mapped_column(Integer)
    text: Mapped[str] = mapped_column(Text)
    # int32 little-endian token ids: the exact ids the engine places in the prompt.
    token_ids_blob: Mapped[bytes] = mapped_column(LargeBinary)
    num_tokens: Mapped[int] = mapped_column(Integer)
    page: Mapped[int | None] = mapped_column(Integer, nullable=True)
    char_start: Mapped[int] = mapped_column(Integer, default=0)
    char_end: Mapped[int] = mapped_column(Integer, default=0)
    kv_key: Mapped[str | None] = mapped_column(String(128), nullable=True, index=True)
    # float32 little-endian passage embedding: replicas build their in-memory FAISS index from these.
    embedding: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)

    document: Mapped[DocumentRow] = relationship(back_populates="chunks")


class JobRow(Base):
    __tablename__ = "ingest_jobs"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    status: Mapped[JobStatus] = mapped_column(Enum(JobStatus), index=True)
    stage: Mapped[str | None] = mapped_column(String(32), nullable=True)
    # {"parse": {"done": n, "total": n}, "chunk": …}
    progress: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    # [{"source": "...", "error": "..."}]
    errors: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list)
    # What to ingest, persisted so an interrupted job can be run again after a restart.
    spec: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    document_ids: Mapped[list[str]] = mapped_column(JSON, default=list)
    duplicate_ids: Mapped[list[str]] = mapped_column(JSON, default=list)
    cancel_requested: Mapped[bool] = mapped_column(default=False)
    collection: Mapped[str] = collection_column()
    created_at: Mapped[datetime] = created_at_column()
    updated_at: Mapped[datetime] = updated_at_column()


class IndexEventOp(enum.StrEnum):
    READY = "ready"  # the document became answerable: index its current chunks
    REMOVED = "removed"  # the document is gone or no longer ready: drop its chunks from the index


class IndexEventRow(Base):
    """The index change log: every replica applies these, in id order, to its in-memory FAISS index.

    Ids are handed out in commit order (writers take a lock first, see `Catalog`), so a reader that has
    seen event n has seen every event below n: no change is skipped when two jobs commit at once.
    """

    __tablename__ = "index_events"
    __table_args__ = {"sqlite_autoincrement": True}

    id: Mapped[int] = serial_id_column()
    document_id: Mapped[str] = mapped_column(String(36))
    op: Mapped[str] = mapped_column(String(16))
    collection: Mapped[str] = collection_column(index=None)
    created_at: Mapped[datetime] = created_at_column()


class ConversationRow(Base):
    """A conversation of /ask (or /v1 with a `conversation_id`): its turns are answered with the earlier
    ones in the prompt. `owner` is the hash of the API key that created it (None: no key), never the key.
    `collections`: the collections its turns searched (None: every collection, and every conversation made
    before conversations recorded them); only a caller that may read all of them sees it."""

    __tablename__ = "conversations"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    owner: Mapped[str | None] = mapped_column(String(80), index=True, nullable=True)
    title: Mapped[str] = mapped_column(String(512))
    num_turns: Mapped[int] = mapped_column(Integer, default=0)
    collections: Mapped[list[str] | None] = mapped_column(JSON, nullable=True)
    created_at: Mapped[datetime] = created_at_column()
    updated_at: Mapped[datetime] = updated_at_column(on_write=False, index=True)  # a new turn sets it

    turns: Mapped[list[TurnRow]] = children("conversation", order_by="TurnRow.index")


class TurnRow(Base):
    """One question and its answer, with what answered it (sources, mode, selector, ratio, timings)."""

    __tablename__ = "conversation_turns"
    __table_args__ = {"sqlite_autoincrement": True}

    id: Mapped[int] = serial_id_column()
    conversation_id: Mapped[str] = parent_id_column("conversations.id")
    index: Mapped[int] = mapped_column(Integer)
    question: Mapped[str] = mapped_column(Text)
    answer: Mapped[str] = mapped_column(Text)
    source_chunk_ids: Mapped[list[int]] = mapped_column(JSON, default=list)
    mode: Mapped[str] = mapped_column(String(16))
    selector: Mapped[str | None] = mapped_column(String(16), nullable=True)
    recompute_ratio: Mapped[float] = mapped_column(Float, default=0.0)
    # {"retrieval_ms": …, "ttft_ms": …, "total_ms": …} and the usage counts, as the answer reported them.
    timings: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    usage: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[datetime] = created_at_column()

    conversation: Mapped[ConversationRow] = relationship(back_populates="turns")


class ApiKeyRow(Base):
    """A collection key made by the admin: only the SHA-256 of its secret is stored, never the secret."""

    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    name: Mapped[str] = mapped_column(String(128))
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    collections: Mapped[list[str]] = mapped_column(JSON, default=list)
    can_ingest: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = created_at_column()
    last_used_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


class FolderSyncRow(Base):
    """A folder `blendrag sync` keeps a collection equal to (one folder per collection): where it is and what
    the last sync changed, for the admin page."""

    __tablename__ = "folder_syncs"

    collection: Mapped[str] = mapped_column(String(64), primary_key=True)
    folder: Mapped[str] = mapped_column(String(4096))
    # {"added": n, "changed": n, "removed": n, "unchanged": n, "failed": n, "skipped": n}
    changes: Mapped[dict[str, int]] = mapped_column(JSON, default=dict)
    synced_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    created_at: Mapped[datetime] = created_at_column()
