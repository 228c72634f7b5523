"""The values that move through an ingest job: what to ingest, the work item per document, a job's errors."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from app.catalog import DocumentStatus
from ingest.errors import Interrupted

if TYPE_CHECKING:
    import numpy as np

    from ingest.chunker import Chunk
    from ingest.types import LoadedDocument

STAGES = ("parse", "chunk", "embed", "kv", "commit")
ACTIVE_DOCUMENT_STATUSES = (DocumentStatus.READY, DocumentStatus.PENDING)
FILE_HASH_KEY = "file_sha256"  # document metadata: SHA-256 of the ingested file's bytes


class IngestError(ValueError):
    """A request to ingest that cannot be accepted at all (nothing to ingest, unknown job …)."""


class IngestTooLarge(IngestError):
    """A request over an ingest cap (documents per job, tokens per document or job): HTTP 413."""


class JobCancelled(Interrupted):
    """Raised at a stage boundary (or a check inside a stage, a loader's or the chunker's included) once a
    cancel was requested."""


class JobInterrupted(Interrupted):
    """Raised at the same checks when the process shuts down: the job stays `running` in the catalog, and the
    next start's recovery (`IngestWorker.recover`) undoes what it half-wrote and runs it again."""


@dataclass(frozen=True)
class IngestSource:
    """One thing to ingest: inline text, or a file on this machine (an upload saved under the data dir)."""

    kind: Literal["text", "file"]
    title: str
    text: str | None = None
    path: str | None = None
    source_path: str | None = None  # identity for re-ingest: same source + new content replaces the old
    tags: list[str] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        """How a job's errors name this source."""
        return self.source_path or self.title

    def to_spec(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "title": self.title,
            "text": self.text,
            "path": self.path,
            "source_path": self.source_path,
            "tags": self.tags,
            "metadata": self.metadata,
        }

    @classmethod
    def from_spec(cls, spec: dict[str, Any]) -> IngestSource:
        return cls(**spec)


@dataclass(frozen=True)
class SubmitResult:
    job_id: str
    document_ids: list[str]


@dataclass(frozen=True)
class JobError:
    """One entry of a job's `errors`: a source that failed or was a duplicate, or the job itself (source None)."""

    source: str | None
    error: str
    code: str
    # Duplicates (and a duplicate that failed with its original, originals.py): the document it duplicates.
    document_id: str | None = None

    @classmethod
    def duplicate(cls, source: str | None, of: str) -> JobError:
        return cls(source=source, error=f"duplicate of document {of}", code="duplicate", document_id=of)

    @property
    def is_duplicate(self) -> bool:
        return self.code == "duplicate"

    def to_row(self) -> dict[str, Any]:
        """The job row's (and the API's) form: `document_id` only on duplicates (failed ones too), keys in
        this order."""
        row: dict[str, Any] = {"source": self.source, "error": self.error, "code": self.code}
        if self.document_id is not None:
            row["document_id"] = self.document_id
        return row

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> JobError:
        return cls(source=row.get("source"), error=row["error"], code=row["code"], document_id=row.get("document_id"))


def error_rows(errors: list[JobError]) -> list[dict[str, Any]]:
    return [e.to_row() for e in errors]


@dataclass
class WorkItem:
    """One document moving through the stages of a job."""

    document_id: str
    source: IngestSource
    loaded: LoadedDocument | None = None
    chunks: list[Chunk] = field(default_factory=list)
    vectors: np.ndarray | None = None
    kv_keys: list[str] = field(default_factory=list)
    failed: str | None = None
