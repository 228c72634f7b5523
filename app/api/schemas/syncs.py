"""Bodies of the folder sync routes (`blendrag sync` plans and finishes through them; the admin page lists)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from app.api.schemas.common import RecordOut, Timestamp
from app.ask_params import CollectionName

MAX_SOURCE_CHARS = 2048  # documents.source_path
MAX_FILES = 1_000_000  # files of one folder (the body's size caps it first: server.max_body_bytes)
Source = Annotated[str, StringConstraints(min_length=1, max_length=MAX_SOURCE_CHARS)]
Sha256 = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]


class SyncIn(BaseModel):
    """A folder as the client's scan found it, and the collection it is to equal."""

    model_config = ConfigDict(extra="forbid")

    collection: CollectionName
    folder: str = Field(min_length=1, max_length=4096, description="The folder's absolute path on the client")
    files: dict[Source, Sha256] = Field(
        max_length=MAX_FILES,
        description="Each ingestible file's path relative to the folder (its documents' source) -> SHA-256 (hex)",
    )
    held: list[Source] = Field(
        default_factory=list,
        max_length=MAX_FILES,
        description="Files (or folders, ending in '/') that could not be read now: their documents are kept",
    )
    replace: bool = Field(
        default=False,
        description="Let the collection follow this folder in place of another, or delete what it holds that "
        "the folder lacks on a first sync",
    )


class SyncPlanOut(BaseModel):
    new: list[str] = Field(description="Files no document of the collection came from")
    changed: list[str] = Field(description="Files stored with other bytes")
    upload: list[str] = Field(description="The files to ingest (content already stored once is not)")
    num_unchanged: int
    remove: dict[str, list[str]] = Field(description="Sources the folder no longer has -> their document ids")
    busy_jobs: list[str] = Field(description="Jobs still ingesting documents of these sources: wait for them")


class SyncFinishIn(SyncIn):
    plan: SyncPlanOut = Field(description="The plan, as the client carried it out")
    num_skipped: int = Field(ge=0, description="Files the client left out (unreadable, changing, too large)")
    removed: list[str] = Field(default_factory=list, description="The sources POST /syncs/remove removed")


class SyncRemovalOut(BaseModel):
    removed: list[str] = Field(description="Sources the folder no longer has, whose documents were deleted")
    busy: list[str] = Field(description="Sources another job is still ingesting: the next sync removes them")


class FolderSyncOut(RecordOut):
    collection: str
    folder: str
    synced_at: Timestamp
    created_at: Timestamp
    changes: dict[str, int] = Field(description="added, changed, removed, unchanged, failed, skipped (files)")


class SyncChangesOut(BaseModel):
    added: int
    changed: int
    removed: int
    unchanged: int
    failed: int
    skipped: int


class SyncFinishOut(BaseModel):
    changes: SyncChangesOut
    record: FolderSyncOut
    failed: list[str] = Field(description="Files whose new version is not ready (the old one is still served)")
    busy: list[str] = Field(description="Sources another job is still ingesting: the next sync removes them")


class FolderSyncList(BaseModel):
    syncs: list[FolderSyncOut] = Field(description="Most recently synced first")
