"""Bodies of the ingest, job and document routes."""

from __future__ import annotations

from typing import Any

from pydantic import AliasPath, BaseModel, ConfigDict, Field, model_validator

from app.api.schemas.common import DocumentStatusName, JobStatusName, KVState, RecordOut, Timestamp
from app.ask_params import CollectionName
from app.services.text_checks import NOT_BLANK, invalid_strings, is_blank, nesting_depth

MAX_METADATA_DEPTH = 16


class DocumentIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    title: str = Field(min_length=1, max_length=512, json_schema_extra={"pattern": NOT_BLANK})
    # The pattern documents the rule; the service checks it with a message naming the document.
    text: str = Field(min_length=1, json_schema_extra={"pattern": NOT_BLANK})
    metadata: dict[str, Any] = Field(
        default_factory=dict, description=f"JSON object, nested at most {MAX_METADATA_DEPTH} levels"
    )
    tags: list[str] = Field(default_factory=list)
    source: str | None = Field(default=None, description="Stable identity; re-ingesting it replaces the old")

    @model_validator(mode="after")
    def _storable(self) -> DocumentIn:
        if invalid_strings([self.title, self.text, self.tags, self.source, self.metadata]):
            raise ValueError("text must be valid Unicode (a lone surrogate such as \\ud800 is not)")
        if is_blank(self.title):
            raise ValueError(f"document title {self.title!r} is blank (only white space or invisible characters)")
        if nesting_depth(self.metadata, MAX_METADATA_DEPTH) > MAX_METADATA_DEPTH:
            raise ValueError(f"metadata is nested deeper than {MAX_METADATA_DEPTH} levels")
        return self


class IngestIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    documents: list[DocumentIn] = Field(min_length=1)
    collection: CollectionName | None = Field(
        default=None,
        description="The collection the documents join (default: the key's collection when it has exactly one, "
        "else `default`)",
    )


class IngestAccepted(BaseModel):
    job_id: str
    document_ids: list[str] = Field(
        description="One per submitted document or file, in order (a JSON/JSONL "
        "file with many records adds more to the job's document_ids once parsed)"
    )


class StageProgress(BaseModel):
    """done/total; the kv stage also has `bytes` (of the KV entries the job added, as stored) and `tokens`
    (the chunk tokens those entries hold: the text's, and the overlap each chunk repeats of the one before, so
    more than the text's own): what the job adds to the KV store's bill; the commit stage has `ready`
    once it is done (the documents it made ready: what the job added, its duplicates and failures aside)."""

    model_config = ConfigDict(extra="allow")

    done: int
    total: int


class JobOut(RecordOut):
    # Read from a `JobRecord`.
    job_id: str = Field(validation_alias="id")
    status: JobStatusName
    stage: str | None = Field(
        description="parse | chunk | embed | kv | commit while running; waiting: its stages are done and it waits "
        "for the outcome of the documents its duplicates are copies of (other jobs are ingesting them); else null"
    )
    progress: dict[str, StageProgress] = Field(description="done/total per stage")
    errors: list[dict[str, Any]] = Field(
        description="Per-source failures and duplicates: source, error, code, and for a duplicate document_id, the "
        "document it is a copy of (a duplicate of a document that failed fails with its error and code)"
    )
    document_ids: list[str]
    duplicate_ids: list[str] = Field(description="Submitted documents dropped as duplicates of stored ones")
    cancel_requested: bool = False
    collection: str = Field(description="The collection the job ingests into")
    created_at: Timestamp
    updated_at: Timestamp


class JobList(BaseModel):
    jobs: list[JobOut] = Field(description="Most recent first")


class JobErrorEventOut(BaseModel):
    """Data of an `error` event on a job's stream."""

    message: str


class DocumentOut(RecordOut):
    # Read from a `DocumentRecord`.
    id: str
    title: str
    status: DocumentStatusName
    error: str | None
    source: str | None = Field(validation_alias="source_path")
    tags: list[str]
    metadata: dict[str, Any]
    num_chunks: int
    num_tokens: int
    job_id: str | None
    collection: str
    created_at: Timestamp
    updated_at: Timestamp


class DocumentPage(BaseModel):
    total: int = Field(description="Documents matching the filter, over all pages")
    offset: int
    limit: int
    documents: list[DocumentOut]


class PurgeOut(BaseModel):
    deleted: int = Field(description="Documents deleted")


class ChunkOut(RecordOut):
    # Read from a `ChunkView` (its `ChunkRecord` and the KV state).
    id: int = Field(validation_alias=AliasPath("record", "id"))
    index: int = Field(validation_alias=AliasPath("record", "index"))
    page: int | None = Field(validation_alias=AliasPath("record", "page"))
    num_tokens: int = Field(validation_alias=AliasPath("record", "num_tokens"))
    char_start: int = Field(validation_alias=AliasPath("record", "char_start"))
    char_end: int = Field(validation_alias=AliasPath("record", "char_end"))
    text: str = Field(validation_alias=AliasPath("record", "text"))
    kv_state: KVState = Field(
        description="fresh: stored KV usable now; stale: stored for an older "
        "model/prompt; missing: none stored (recomputed when asked)"
    )


class KVCounts(BaseModel):
    fresh: int
    stale: int
    missing: int


class DocumentDetail(DocumentOut):
    kv: KVCounts
    chunks: list[ChunkOut]
