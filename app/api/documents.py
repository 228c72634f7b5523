"""Ingest, job and document routes: thin, the IngestService and CoverageService do the work.

With `server.api_key` set every route here needs a key: the admin key sees everything, a collection key
only its collections (another collection's document or job is a 404, like an unknown id) and may ingest
or delete only with `can_ingest`.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

from fastapi import Depends, HTTPException, Query, Request, Response

from app.api.deps import Access, get_documents, get_ingest, get_state, guarded_router, require_reader
from app.api.ingest_body import INGEST_OPENAPI, ingest_sources
from app.api.schemas import (
    ChunkOut,
    DocumentDetail,
    DocumentOut,
    DocumentPage,
    DocumentStatusName,
    ErrorOut,
    IngestAccepted,
    JobErrorEventOut,
    JobList,
    JobOut,
    KVCounts,
    PurgeOut,
)
from app.api.schemas.common import API_KEY_REQUIRED, MODELS_LOADING, error_responses
from app.api.sse import sse_comment, sse_event, sse_openapi, sse_response
from app.api.uploads import drop_unqueued
from app.catalog import DocumentStatus
from app.catalog.records import JobRecord
from app.services.document_service import DocumentBusy, DocumentService
from app.services.ingest import IngestError, IngestService, IngestTooLarge
from app.state import AppState

router = guarded_router(
    "documents",
    require_reader,
    {
        401: API_KEY_REQUIRED,
        403: "The key may not ingest, delete, or use this collection",
        422: "Invalid request",
        503: MODELS_LOADING,
    },
)

JOB_POLL_S = 0.25
KEEPALIVE_S = 10.0
MAX_OFFSET = 2**62  # SQLite integers are 64-bit signed: a larger offset would be a 500, not a page


# ---- ingest ---------------------------------------------------------------------------------------


@router.post(
    "/ingest",
    status_code=202,
    response_model=IngestAccepted,
    openapi_extra=INGEST_OPENAPI,
    responses=error_responses(
        {
            400: "A multipart body that cannot be parsed",
            413: "A file or the body over its size limit",
            415: "Unsupported content type or file extension",
        }
    ),
)
async def ingest(
    request: Request,
    service: IngestService = Depends(get_ingest),
    state: AppState = Depends(get_state),
    access: Access = Depends(require_reader),
) -> IngestAccepted:
    """Queue documents for ingest; returns at once with the job to watch.

    Send JSON `{"documents": [{"title", "text", "metadata", "tags", "source"}]}`, or a multipart form
    with one or more `files` (txt, md, html, pdf, docx, json, jsonl), optional `tags` (comma-separated)
    and optional `documents` (the same JSON list, inline). Unsupported file types answer 415 and files
    over `ingest.max_file_bytes` 413, before anything is queued. `collection` (a JSON field, or a form
    field) names the collection the documents join; a key not allowed to ingest there is a 403, before
    anything is stored.
    """
    sources, batch_dir, collection = await ingest_sources(request, state.settings, access)
    try:
        result = await asyncio.to_thread(service.submit, sources, collection=collection)
    except BaseException as exc:
        if batch_dir is not None:  # nothing was queued: the stored uploads must not linger
            shutil.rmtree(batch_dir, ignore_errors=True)
        if isinstance(exc, IngestTooLarge):
            raise HTTPException(413, str(exc)) from exc
        if isinstance(exc, IngestError):
            raise HTTPException(422, str(exc)) from exc
        raise
    if batch_dir is not None:
        job = service.get_job(result.job_id)
        queued = {str(src["path"]) for src in (job.spec.get("sources", []) if job else []) if src.get("path")}
        await asyncio.to_thread(drop_unqueued, batch_dir, queued)
    return IngestAccepted(job_id=result.job_id, document_ids=result.document_ids)


# ---- jobs -----------------------------------------------------------------------------------------


def _job_or_404(service: IngestService, job_id: str, access: Access) -> JobRecord:
    job = service.get_job(job_id)
    if job is None or not access.sees(job.collection):  # another collection's job: as if unknown
        raise HTTPException(404, f"no ingest job {job_id}")
    return job


@router.get("/ingest/jobs", response_model=JobList)
def list_jobs(
    limit: Annotated[int, Query(ge=1, le=100)] = 10,
    service: IngestService = Depends(get_ingest),
    access: Access = Depends(require_reader),
) -> JobList:
    """Recent ingest jobs of your collections, newest first, whoever started them (web UI, API or CLI)."""
    return JobList(jobs=[JobOut.model_validate(j) for j in service.recent_jobs(limit, access.collections)])


@router.get("/ingest/jobs/{job_id}", response_model=JobOut, responses={404: {"model": ErrorOut}})
def get_job(
    job_id: str, service: IngestService = Depends(get_ingest), access: Access = Depends(require_reader)
) -> JobOut:
    """Status, current stage, per-stage progress and per-source errors of one ingest job."""
    return JobOut.model_validate(_job_or_404(service, job_id, access))


@router.post(
    "/ingest/jobs/{job_id}/cancel",
    response_model=JobOut,
    responses={404: {"model": ErrorOut}, 409: {"model": ErrorOut}},
)
def cancel_job(
    job_id: str, service: IngestService = Depends(get_ingest), access: Access = Depends(require_reader)
) -> JobOut:
    """Cancel a queued or running job (a running one stops at its next step and rolls back its documents).

    Answers the job as it is now: `cancelled` at once for a queued job, `running` with
    `cancel_requested: true` for a running one until it stops. Cancelling a cancelled job is a no-op;
    a job that already succeeded or failed answers 409.
    """
    job = _job_or_404(service, job_id, access)
    access.check_ingest(job.collection)
    if job.status.finished and job.status.value != "cancelled":
        raise HTTPException(409, f"ingest job {job_id} already {job.status.value}")
    return JobOut.model_validate(service.cancel(job_id))


@router.get(
    "/ingest/jobs/{job_id}/events",
    responses={
        **sse_openapi(
            "`progress` events (a JobOut each time the job changes), then one `done` event (the final JobOut); "
            "`: keepalive` comment lines while nothing changes",
            {"progress": JobOut, "done": JobOut, "error": JobErrorEventOut},
        ),
        404: {"model": ErrorOut},
    },
)
async def job_events(
    job_id: str,
    request: Request,
    service: IngestService = Depends(get_ingest),
    access: Access = Depends(require_reader),
) -> Any:
    """Server-Sent Events of one job's progress until it finishes (then the stream ends)."""
    first = await asyncio.to_thread(_job_or_404, service, job_id, access)

    async def stream() -> AsyncIterator[str]:
        job: JobRecord | None = first
        last: dict[str, Any] | None = None
        idle_s = 0.0
        while job is not None:
            body = JobOut.model_validate(job).model_dump()
            if job.status.finished:
                yield sse_event("done", body)
                return
            if body != last:
                yield sse_event("progress", body)
                last, idle_s = body, 0.0
            elif idle_s >= KEEPALIVE_S:
                yield sse_comment("keepalive")
                idle_s = 0.0
            await asyncio.sleep(JOB_POLL_S)
            idle_s += JOB_POLL_S
            if await request.is_disconnected():
                return
            job = await asyncio.to_thread(service.get_job, job_id)
        yield sse_event("error", {"message": f"ingest job {job_id} disappeared"})

    return sse_response(stream())


# ---- documents ------------------------------------------------------------------------------------


@router.get("/documents", response_model=DocumentPage)
def list_documents(
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    status: Annotated[DocumentStatusName | None, Query(description="pending | ready | failed")] = None,
    service: DocumentService = Depends(get_documents),
    access: Access = Depends(require_reader),
) -> DocumentPage:
    """Documents of your collections, newest first, with the total count matching the filter."""
    docs, total = service.list(offset, limit, DocumentStatus(status) if status else None, access.collections)
    return DocumentPage(
        total=total, offset=offset, limit=limit, documents=[DocumentOut.model_validate(d) for d in docs]
    )


@router.get("/documents/{document_id}", response_model=DocumentDetail, responses={404: {"model": ErrorOut}})
def get_document(
    document_id: str, service: DocumentService = Depends(get_documents), access: Access = Depends(require_reader)
) -> DocumentDetail:
    """One document with its chunks and each chunk's KV state (fresh / stale / missing)."""
    view = service.get(document_id, access.collections)
    if view is None:
        raise HTTPException(404, f"no document {document_id}")
    return DocumentDetail(
        **DocumentOut.model_validate(view.document).model_dump(),
        kv=KVCounts(**view.kv_counts()),
        chunks=[ChunkOut.model_validate(c) for c in view.chunks],
    )


@router.delete("/documents", response_model=PurgeOut, responses={422: {"model": ErrorOut}})
def purge_documents(
    status: Annotated[Literal["failed"], Query(description="only `failed` documents can be purged in bulk")],
    service: DocumentService = Depends(get_documents),
    access: Access = Depends(require_reader),
) -> PurgeOut:
    """Delete every failed document at once (`?status=failed`: what failed ingests left). The spec admits
    `failed` only, so any other status is a 422 from validation, as the schema says. Works on a full
    disk (it frees space). A collection key purges its own collections only."""
    if not access.can_ingest:
        raise HTTPException(403, "this key may not ingest or delete documents")
    return PurgeOut(deleted=service.purge_failed(access.collections))


@router.delete(
    "/documents/{document_id}", status_code=204, response_class=Response, responses={409: {"model": ErrorOut}}
)
def delete_document(
    document_id: str, service: DocumentService = Depends(get_documents), access: Access = Depends(require_reader)
) -> Response:
    """Delete a document with its chunks, index entries and unshared KV entries.

    Idempotent: 204 whether the document existed or not (a retried DELETE must not look like a failure,
    and an id that never existed is indistinguishable from one already deleted). 409 while the document
    is still being ingested (`pending`): cancel its job first. Another collection's document answers 204
    too and is left alone (an answer that differed would tell a key which ids exist elsewhere).
    """
    if not access.can_ingest:
        raise HTTPException(403, "this key may not ingest or delete documents")
    try:
        service.delete(document_id, access.collections)
    except DocumentBusy as exc:
        raise HTTPException(409, str(exc)) from exc
    return Response(status_code=204)
