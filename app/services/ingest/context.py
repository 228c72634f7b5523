"""What the stages of a job work with: the environment (`IngestEnv`) and one job's state (`JobContext`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from app.catalog import DocumentStatus
from app.catalog.models import DEFAULT_COLLECTION
from app.services.ingest.progress import Progress
from app.services.ingest.types import IngestSource, JobError, WorkItem

if TYPE_CHECKING:
    from app.catalog import Catalog
    from app.services.document_service import DocumentService
    from app.services.estimates import FullPassRate
    from app.settings import Settings
    from engine.engine import Engine
    from engine.scheduler import Scheduler
    from kvcache.space import KVSpace
    from retrieval.retriever import Retriever


@dataclass(frozen=True)
class IngestEnv:
    """What a job's stages use: the engine's tokenizer (chunk), the retriever (embed, index), the served
    model's KV space (keys and the KV writer), `scheduler` to compute the chunks' KV (questions go first; unstarted, it
    computes in the ingest thread) and `documents`, which deletes what a re-ingest replaces and knows which
    KV entries a running job holds."""

    settings: Settings
    catalog: Catalog
    engine: Engine
    retriever: Retriever
    kv_space: KVSpace
    scheduler: Scheduler
    documents: DocumentService
    full_pass_rate: FullPassRate | None = None
    on_storage_fault: Callable[[str], None] | None = None

    def storage_fault(self, message: str) -> None:
        if self.on_storage_fault is not None:
            self.on_storage_fault(message)


@dataclass
class JobContext:
    """One job on its way through the stages. `errors` are what the job row reports (duplicates included);
    `duplicates` the ids its `duplicate_ids` lists; `seen_hashes` content hash → document id in this job.
    `collection`: where the job's documents go; duplicates and replaced sources are looked for there only."""

    env: IngestEnv
    job_id: str
    items: list[WorkItem]
    progress: Progress
    collection: str = DEFAULT_COLLECTION
    errors: list[JobError] = field(default_factory=list)
    duplicates: list[str] = field(default_factory=list)
    seen_hashes: dict[str, str] = field(default_factory=dict)

    def live(self) -> list[WorkItem]:
        """The items no stage has failed (or found to be a duplicate) so far."""
        return [i for i in self.items if i.failed is None]

    def fail(self, item: WorkItem, message: str) -> None:
        """Mark one document failed (the job goes on with the others)."""
        item.failed = message
        catalog = self.env.catalog
        if catalog.get_document(item.document_id) is not None:
            catalog.set_document_status(item.document_id, DocumentStatus.FAILED, error=message)

    def reject(self, item: WorkItem, message: str, code: str) -> None:
        """Fail one document and report it in the job's errors."""
        self.fail(item, message)
        self.errors.append(JobError(source=item.source.label, error=message, code=code))

    def add_duplicate(self, source: IngestSource, of: str) -> None:
        """Report `source` as a duplicate of the stored document `of`."""
        self.errors.append(JobError.duplicate(source.label, of))
