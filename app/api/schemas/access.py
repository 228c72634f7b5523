"""Bodies of the collection and key routes."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from app.api.schemas.common import RecordOut, Timestamp
from app.ask_params import CollectionName


class CollectionOut(RecordOut):
    name: str
    num_documents: int = Field(description="Documents of every status")
    num_ready_documents: int
    num_chunks: int
    chunks_fresh: int = Field(description="Chunks of ready documents whose stored KV is usable now")
    coverage: float = Field(description="fresh / chunks of ready documents (1.0 when there are none)")


class CollectionListOut(BaseModel):
    collections: list[CollectionOut] = Field(description="The collections the caller may read, by name")


class CollectionDeletedOut(BaseModel):
    name: str
    deleted: int = Field(description="Documents deleted")


class KeyIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=128, pattern=r"\S", description="Who the key is for")
    collections: list[CollectionName] = Field(min_length=1, max_length=100, description="Collections it may read")
    can_ingest: bool = Field(
        default=False, strict=True, description="It may also ingest into and delete from them (true or false only)"
    )


class KeyCreatedOut(BaseModel):
    key_id: str
    key: str = Field(description="The secret: shown this once, stored only as a hash")


class KeyOut(RecordOut):
    # Read from a `KeyRecord` (never its hash).
    key_id: str = Field(validation_alias="id")
    name: str
    collections: list[str]
    can_ingest: bool
    created_at: Timestamp
    last_used_at: Timestamp | None = Field(description="Within 30 s; null: never used")


class KeyListOut(BaseModel):
    keys: list[KeyOut] = Field(description="Oldest first; never the secrets")
