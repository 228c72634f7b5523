"""What the stages of a job work with: the environment (`IngestEnv`) and one job's state (`JobContext`, built
from its row by `job_context`)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from app.catalog import DocumentStatus
from app.catalog.models import DEFAULT_COLLECTION
from app.services.ingest.progress import Progress, ProgressCallback
from app.services.ingest.types import IngestSource, JobError, WorkItem

if TYPE_CHECKING:
    from app.catalog import Catalog
    from app.catalog.records import JobRecord
    from app.services.document_service import DocumentService
    from app.services.estimates import FullPassRate
    from app.services.ingest.parse_process import ParseServer
    from app.settings import Settings
    from engine.engine import Engine
    from engine.scheduler import Scheduler
    from kvcache.space import KVSpace
    from retrieval.retriever import Retriever

logger = logging.getLogger(__name__)


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
    `collection`: where the job's documents go; duplicates and replaced sources are looked for there only.
    `parse_server`: the parse lane's own parse process (None: the shared one); `accept_lock`: held while a
    parsed document is checked for a duplicate and kept, shared by the jobs parsed at once (so two parses of
    the same content cannot both keep it)."""

    env: IngestEnv
    job_id: str
    items: list[WorkItem]
    progress: Progress
    collection: str = DEFAULT_COLLECTION
    errors: list[JobError] = field(default_factory=list)
    duplicates: list[str] = field(default_factory=list)
    seen_hashes: dict[str, str] = field(default_factory=dict)
    parse_server: ParseServer | None = None
    accept_lock: threading.Lock = field(default_factory=threading.Lock)

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
        """Fail one document and report it in the job's errors (and the log: a refused document is the
        operator's business too, e.g. a file that ran into the parse time limit)."""
        logger.warning("ingest job %s: %s failed (%s): %s", self.job_id, item.source.label, code, message)
        self.fail(item, message)
        self.errors.append(JobError(source=item.source.label, error=message, code=code))

    def add_duplicate(self, source: IngestSource, of: str) -> None:
        """Report `source` as a duplicate of the stored document `of`."""
        self.errors.append(JobError.duplicate(source.label, of))


def job_context(
    env: IngestEnv,
    job: JobRecord,
    on_progress: ProgressCallback | None = None,
    stopping: threading.Event | None = None,
    accept_lock: threading.Lock | None = None,
) -> JobContext:
    """A job's context before its first stage: an item per source, the duplicates submit answered.
    `accept_lock`: shared by the jobs parsed at once (JobContext); none: the job's own."""
    sources = [IngestSource.from_spec(s) for s in job.spec.get("sources", [])]
    # document_ids may be longer than sources: records of a json/jsonl file fan out at parse time.
    items = [WorkItem(doc_id, src) for doc_id, src in zip(job.document_ids, sources, strict=False)]
    # Duplicates of stored documents were answered at submit; they stay reported.
    errors = [JobError.from_row(d) for d in job.spec.get("duplicates", [])]
    return JobContext(
        env=env,
        job_id=job.id,
        items=items,
        progress=Progress(env.catalog, job.id, on_progress, stopping),
        collection=job.collection,
        errors=errors,
        duplicates=[e.document_id for e in errors if e.document_id is not None],
        accept_lock=accept_lock or threading.Lock(),
    )
