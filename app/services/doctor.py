"""`blendrag doctor`: check that the catalog, the FAISS index and the KV store agree, and repair them.

The catalog is the source of truth. Run it with the server stopped (it rewrites the index file).
"""

from __future__ import annotations

import contextlib
import logging
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from app.catalog import DocumentStatus, JobStatus

if TYPE_CHECKING:
    from app.catalog import Catalog
    from engine.engine import Engine
    from kvcache.space import KVSpace
    from retrieval.retriever import Retriever

logger = logging.getLogger(__name__)

DOCTOR_KV_CHECKS = 512  # disk entries doctor reads whole per run (all of them in a smaller store)


@dataclass
class DoctorReport:
    num_documents: int = 0
    num_chunks: int = 0
    # pending documents no live job will finish (a crash mid-ingest): made failed, their rows dropped
    stranded_document_ids: list[str] = field(default_factory=list)
    # index entries whose chunk is gone or not committed: removed from the index
    orphan_index_ids: list[int] = field(default_factory=list)
    # committed chunks the index lacks: embedded and added again
    unindexed_chunk_ids: list[int] = field(default_factory=list)
    # committed chunks without a fresh KV entry: precomputed and stored again
    kv_missing_chunk_ids: list[int] = field(default_factory=list)
    # KV entries on disk that committed chunks use and that fail their checksum (DOCTOR_KV_CHECKS of them at
    # most, sampled): counted in kv_missing_chunk_ids too; --repair deletes them and recomputes the chunks
    kv_corrupt_keys: list[str] = field(default_factory=list)
    num_kv_checked: int = 0
    # KV entries neither a chunk nor a stored conversation's turn refers to (left by failed or deleted
    # documents, deleted conversations): removed by --repair
    num_unreferenced_kv_entries: int = 0
    # of kv_missing_chunk_ids, those a repair computed but the store could not keep (disk full?)
    kv_unwritten_chunk_ids: list[int] = field(default_factory=list)
    # files under uploads/ no queued or running job will read (a finished job's, a duplicate's): removed
    unreferenced_upload_paths: list[str] = field(default_factory=list)
    num_unreferenced_upload_bytes: int = 0
    # what opening the index had to fix (an unreadable snapshot rebuilt from the catalog …); None: nothing
    index_repair_note: str | None = None
    repaired: bool = False

    @property
    def problems(self) -> int:
        return (
            len(self.stranded_document_ids)
            + len(self.orphan_index_ids)
            + len(self.unindexed_chunk_ids)
            + len(self.kv_missing_chunk_ids)
        )


@dataclass(frozen=True)
class DoctorParts:
    """What doctor checks against the catalog: the index, the served model's KV space (its store, keys under
    the served model), and the engine that recomputes missing KV on --repair; the uploads dir for leftover
    files."""

    catalog: Catalog
    retriever: Retriever
    kv_space: KVSpace
    engine: Engine
    uploads_dir: Path


def run_doctor(parts: DoctorParts, *, repair: bool) -> DoctorReport:
    from kvcache.admin import check_disk_entries

    catalog, retriever, space = parts.catalog, parts.retriever, parts.kv_space
    store = space.store
    report = DoctorReport(repaired=repair, index_repair_note=getattr(retriever, "repair_note", None))
    live_jobs = {j.id for j in catalog.jobs_with_status([JobStatus.QUEUED, JobStatus.RUNNING])}

    documents = catalog.all_documents()
    report.num_documents = len(documents)
    for doc in documents:
        if doc.status == DocumentStatus.PENDING and doc.job_id not in live_jobs:
            report.stranded_document_ids.append(doc.id)
            if repair:
                catalog.replace_chunks(doc.id, [])
                catalog.set_document_status(
                    doc.id, DocumentStatus.FAILED, error="ingest was interrupted; ingest the document again"
                )

    ready_chunks = catalog.iter_chunks([DocumentStatus.READY])
    report.num_chunks = len(ready_chunks)
    ready_ids = {c.id for c in ready_chunks}
    indexed = set(retriever.chunk_ids())
    report.orphan_index_ids = sorted(indexed - ready_ids)
    missing_from_index = [c for c in ready_chunks if c.id not in indexed]
    report.unindexed_chunk_ids = [c.id for c in missing_from_index]

    expected = {c.id: space.key(c.token_ids) for c in ready_chunks}
    present = store.locate_many(list(set(expected.values())))
    # Reading entries whole is what finds corrupt ones (`cache verify` reads them all); doctor reads a bounded
    # sample of the disk entries chunks use, so a large store is checked in seconds and a bad run is seen.
    on_disk = sorted(k for k, loc in present.items() if "disk" in loc.num_bytes_by_tier)
    sample = on_disk if len(on_disk) <= DOCTOR_KV_CHECKS else random.sample(on_disk, DOCTOR_KV_CHECKS)
    corrupt = check_disk_entries(store, sample, remove=repair)
    report.num_kv_checked = len(sample)
    report.kv_corrupt_keys = sorted(p.key for p in corrupt)
    bad = set(report.kv_corrupt_keys)
    kv_missing = [c for c in ready_chunks if expected[c.id] not in present or expected[c.id] in bad]
    report.kv_missing_chunk_ids = [c.id for c in kv_missing]
    # Leftovers: not inconsistencies (no exit code), only space; --repair removes them.
    referenced = set(expected.values()) | {c.kv_key for c in catalog.iter_chunks() if c.kv_key}
    referenced |= _turn_keys(parts)
    unreferenced_keys = [k for k in store.keys() if k not in referenced]  # noqa: SIM118 (a store, not a dict)
    report.num_unreferenced_kv_entries = len(unreferenced_keys)
    uploads = _unreferenced_uploads(parts.uploads_dir, catalog)
    report.unreferenced_upload_paths = [str(p) for p in uploads]
    report.num_unreferenced_upload_bytes = sum(p.stat().st_size for p in uploads)

    if repair:
        _repair_index(retriever, catalog, report, missing_from_index)
        written = space.ensure(
            [c.token_ids for c in kv_missing],
            keys=[expected[c.id] for c in kv_missing],
            compute=parts.engine.precompute_chunks,
        )
        # Chunks whose KV the store could not keep stay reported as missing (the writer logged why).
        report.kv_unwritten_chunk_ids = [c.id for c in kv_missing if expected[c.id] in written.unwritten]
        catalog.set_kv_keys({c.id: expected[c.id] for c in kv_missing})
        for key in unreferenced_keys:
            store.delete(key)
        _remove_uploads(parts.uploads_dir, uploads)
    return report


def _turn_keys(parts: DoctorParts) -> set[str]:
    """The KV keys of the stored conversations' turns (a turn's entry is keyed by its token ids, as
    `TurnKV` writes it). A stateless client's turns are never on disk (memory only), so nothing else names
    a turn entry there."""
    from engine.prompt import Turn

    prompt = parts.engine.prompt
    return {parts.kv_space.key(prompt.turn_ids(Turn(q, a))) for q, a in parts.catalog.conversations.all_turn_texts()}


def _unreferenced_uploads(uploads_dir: Path, catalog: Catalog) -> list[Path]:
    """Files under uploads/ that no queued or running job names as a source (spool files included)."""
    if not uploads_dir.is_dir():
        return []
    needed = {
        str(Path(source["path"]).resolve())
        for job in catalog.jobs_with_status([JobStatus.QUEUED, JobStatus.RUNNING])
        for source in job.spec.get("sources", [])
        if source.get("kind") == "file" and source.get("path")
    }
    return sorted(p for p in uploads_dir.rglob("*") if p.is_file() and str(p.resolve()) not in needed)


def _remove_uploads(uploads_dir: Path, paths: list[Path]) -> None:
    for path in paths:
        path.unlink(missing_ok=True)
    # Empty batch directories (uploads/<batch>/<n>/) go too, deepest first; uploads/ itself stays.
    for directory in sorted((d for d in uploads_dir.rglob("*") if d.is_dir()), key=lambda d: -len(d.parts)):
        with contextlib.suppress(OSError):
            directory.rmdir()


def _repair_index(retriever: Retriever, catalog: Catalog, report: DoctorReport, missing: list) -> None:
    from retrieval.types import IndexedChunk

    if report.orphan_index_ids:
        retriever.remove(report.orphan_index_ids)
    if missing:
        docs = {d.id: d for d in catalog.all_documents()}
        retriever.add(
            [
                IndexedChunk(
                    chunk_id=c.id,
                    document_id=c.document_id,
                    text=c.text,
                    title=c.title,
                    page=c.page,
                    tags=tuple(docs[c.document_id].tags),
                    collection=docs[c.document_id].collection,
                )
                for c in missing
            ]
        )
    retriever.save()
