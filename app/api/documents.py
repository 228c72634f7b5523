"""Ingest, job and document routes: thin, the IngestService and CoverageService do the work.

With `server.api_key` set every route here needs a key: the admin key sees everything, a collection key
only its collections (another collection's document or job is a 404, like an unknown id) and may ingest
or delete only with `can_ingest`.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, HTTPException, Query, Request, Response
from pydantic import ValidationError
from starlette.datastructures import UploadFile

from app.api.deps import Access, get_documents, get_ingest, get_state, require_reader
from app.api.schemas import (
    ChunkOut,
    DocumentDetail,
    DocumentIn,
    DocumentOut,
    DocumentPage,
    DocumentStatusName,
    ErrorOut,
    IngestAccepted,
    IngestIn,
    JobErrorEventOut,
    JobList,
    JobOut,
    KVCounts,
    PurgeOut,
    ValidationErrorOut,
)
from app.api.sse import sse_comment, sse_event, sse_openapi, sse_response
from app.api.uploads import UploadNameError, check_upload_name, drop_unqueued, save_upload, upload_source_path
from app.catalog import DocumentStatus
from app.catalog.repository import DocumentRecord, JobRecord
from app.services.document_service import DocumentBusy, DocumentService
from app.services.ingest import IngestError, IngestService, IngestSource, IngestTooLarge
from app.services.key_service import COLLECTION_PATTERN
from app.state import AppState
from ingest.config import KNOWN_EXTENSIONS

router = APIRouter(
    tags=["documents"],
    dependencies=[Depends(require_reader)],
    responses={
        401: {"model": ErrorOut, "description": "API key required"},
        403: {"model": ErrorOut, "description": "The key may not ingest, delete, or use this collection"},
        422: {"model": ValidationErrorOut, "description": "Invalid request"},
        503: {"model": ErrorOut, "description": "Models still loading"},
    },
)

JOB_POLL_S = 0.25
KEEPALIVE_S = 10.0
UPLOAD_BLOCK = 1 << 20
MAX_OFFSET = 2**62  # SQLite integers are 64-bit signed: a larger offset would be a 500, not a page


def job_out(job: JobRecord) -> JobOut:
    return JobOut(
        job_id=job.id,
        status=job.status.value,
        stage=job.stage,
        progress=job.progress,
        errors=job.errors,
        document_ids=job.document_ids,
        duplicate_ids=job.duplicate_ids,
        cancel_requested=job.cancel_requested,
        collection=job.collection,
        created_at=job.created_at.isoformat(),
        updated_at=job.updated_at.isoformat(),
    )


def document_out(doc: DocumentRecord) -> DocumentOut:
    return DocumentOut(
        id=doc.id,
        title=doc.title,
        status=doc.status.value,
        error=doc.error,
        source=doc.source_path,
        tags=doc.tags,
        metadata=doc.metadata,
        num_chunks=doc.num_chunks,
        num_tokens=doc.num_tokens,
        job_id=doc.job_id,
        collection=doc.collection,
        created_at=doc.created_at.isoformat(),
        updated_at=doc.updated_at.isoformat(),
    )


# ---- ingest ---------------------------------------------------------------------------------------

# The file names the default `ingest.allowed_extensions` accepts, as the spec's Content-Disposition pattern.
_FILENAME_PATTERN = r'filename="[^"]*\.(' + "|".join(sorted(KNOWN_EXTENSIONS)) + ')"'
_COLLECTION_SCHEMA = {
    "type": "string",
    "pattern": COLLECTION_PATTERN,
    "description": "The collection the documents join (default: the key's collection when it has exactly one, "
    "else `default`); the key must be allowed to ingest there",
}
_INGEST_BODY = {
    "requestBody": {
        "content": {
            # Inline (DocumentIn has no nested models) so the schema needs no components entry.
            "application/json": {
                "schema": {
                    "type": "object",
                    "required": ["documents"],
                    "additionalProperties": False,
                    "properties": {
                        "documents": {"type": "array", "minItems": 1, "items": DocumentIn.model_json_schema()},
                        "collection": _COLLECTION_SCHEMA,
                    },
                }
            },
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "minProperties": 1,
                    "properties": {
                        "files": {
                            "type": "array",
                            "minItems": 1,
                            "items": {"type": "string", "format": "binary"},
                            "description": "Files whose names end in .txt, .md, .html, .pdf, .docx, .json or .jsonl "
                            "(by default: `ingest.allowed_extensions`; the part's Content-Disposition `filename`); "
                            "another extension answers 415",
                        },
                        "tags": {
                            "type": "string",
                            "pattern": r"^$|^[^\[{]",
                            "description": "comma-separated tags for every file (plain text: a value starting "
                            "with [ or { is refused; inline documents carry their own `tags` list)",
                        },
                        "collection": _COLLECTION_SCHEMA,
                        "documents": {
                            "type": "array",
                            "minItems": 1,
                            "items": DocumentIn.model_json_schema(),
                            "description": "inline documents, as in the JSON body: one part holding the JSON "
                            "list (or one part per document, each a JSON object)",
                        },
                    },
                    "anyOf": [{"required": ["files"]}, {"required": ["documents"]}],
                },
                "encoding": {
                    "files": {
                        "headers": {
                            "Content-Disposition": {
                                "description": "each file part names its file; the extension picks the loader",
                                "schema": {
                                    "type": "string",
                                    "pattern": _FILENAME_PATTERN,
                                    "example": 'form-data; name="files"; filename="notes.txt"',
                                },
                            }
                        }
                    },
                    "documents": {"contentType": "application/json"},
                },
            },
        },
        "required": True,
    },
}


@router.post(
    "/ingest",
    status_code=202,
    response_model=IngestAccepted,
    openapi_extra=_INGEST_BODY,
    responses={
        400: {"model": ErrorOut, "description": "A multipart body that cannot be parsed"},
        413: {"model": ErrorOut, "description": "A file or the body over its size limit"},
        415: {"model": ErrorOut, "description": "Unsupported content type or file extension"},
    },
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
    content_type = request.headers.get("content-type", "")
    batch_dir: Path | None = None
    if content_type.startswith("multipart/form-data"):
        sources, batch_dir, collection = await _multipart_sources(request, state, access)
    elif content_type.startswith("application/json") or not content_type:
        body = _ingest_body(await request.body())
        collection = body.collection or access.default_collection
        access.check_ingest(collection)
        sources = [_text_source(d) for d in body.documents]
    else:
        raise HTTPException(415, f"send application/json or multipart/form-data, not {content_type!r}")
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


def _ingest_body(raw: bytes) -> IngestIn:
    try:
        return IngestIn.model_validate(json.loads(raw or b"null"))
    except ValueError as exc:  # json.JSONDecodeError, UnicodeDecodeError and pydantic's ValidationError all are
        raise HTTPException(422, f"invalid ingest body: {_brief(exc)}") from exc
    except RecursionError as exc:  # json.loads of arrays/objects nested thousands deep
        raise HTTPException(422, "invalid ingest body: JSON nested too deeply") from exc


def _text_source(d: DocumentIn) -> IngestSource:
    return IngestSource(kind="text", title=d.title, text=d.text, tags=d.tags, metadata=d.metadata, source_path=d.source)


def _brief(exc: ValueError) -> str:
    if isinstance(exc, ValidationError):
        return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in exc.errors())
    return str(exc)


async def _multipart_sources(
    request: Request, state: AppState, access: Access
) -> tuple[list[IngestSource], Path | None, str]:
    """The sources of a multipart form, the directory its files were stored in (None without files) and the
    collection they join (checked against the key before any file is stored)."""
    from ingest.errors import UnsupportedFormat
    from ingest.loaders import detect_format

    settings = state.settings
    form = await request.form()
    try:
        tag_parts = form.getlist("tags")
        if len(tag_parts) > 1 or any(not isinstance(t, str) or t.startswith(("[", "{")) for t in tag_parts):
            raise HTTPException(422, "'tags' is one text field of comma-separated tags (not JSON)")
        tags = [t.strip() for t in str(tag_parts[0] if tag_parts else "").split(",") if t.strip()]
        collection = _form_collection(form.getlist("collection"), access.default_collection)
        access.check_ingest(collection)
        sources: list[IngestSource] = []
        for part in form.getlist("documents"):
            sources.extend(_text_source(d) for d in await _inline_documents(part, settings.server.max_body_bytes))
        uploads = form.getlist("files")
        if any(not isinstance(u, UploadFile) or not u.filename for u in uploads):
            raise HTTPException(422, "each 'files' part must be a file (with a filename)")
        names = []
        for upload in uploads:  # check every name before storing any file
            try:
                names.append(check_upload_name(upload.filename or ""))
                detect_format(names[-1], settings.ingest)
            except UploadNameError as exc:
                raise HTTPException(422, str(exc)) from exc
            except UnsupportedFormat as exc:
                raise HTTPException(415, f"{upload.filename}: {exc.message}") from exc
        batch_dir = settings.uploads_dir / uuid.uuid4().hex if uploads else None
        try:
            seen: dict[str, int] = {}
            for index, (upload, name) in enumerate(zip(uploads, names, strict=True)):
                spooled = await _spool(upload, settings.uploads_dir, settings.ingest.max_file_bytes)
                stored = save_upload(settings.uploads_dir, batch_dir.name, index, name, spooled)  # type: ignore[union-attr]
                # The source is the path the client sent (relative to the folder it ingests: `advanced/x.md`).
                # The second `same.txt` of one request is its own source (re-uploading it replaces it alone).
                relative = upload_source_path(upload.filename or name)
                seen[relative] = seen.get(relative, 0) + 1
                source = relative if seen[relative] == 1 else f"{relative} ({seen[relative]})"
                sources.append(IngestSource(kind="file", title=name, path=str(stored), source_path=source, tags=tags))
        except BaseException:
            if batch_dir is not None:
                shutil.rmtree(batch_dir, ignore_errors=True)
            raise
    finally:
        await form.close()
    if not sources:
        raise HTTPException(
            422, "multipart ingest needs at least one file in the 'files' field (or inline 'documents')"
        )
    return sources, batch_dir, collection


def _form_collection(parts: list[Any], default: str) -> str:
    if not parts:
        return default
    if len(parts) > 1 or not isinstance(parts[0], str) or not re.match(COLLECTION_PATTERN, parts[0]):
        raise HTTPException(
            422,
            "'collection' is one text field: 1-64 letters, digits, '_', '.' or '-', starting with a letter or digit",
        )
    return parts[0]


async def _inline_documents(part: str | UploadFile, max_bytes: int) -> list[DocumentIn]:
    """The documents of one `documents` part: a JSON list of documents, {"documents": [...]}, or one document.
    A part sent as a file is read up to `max_bytes` (`server.max_body_bytes`, as for a JSON body)."""
    if isinstance(part, UploadFile):
        data = await part.read(max_bytes + 1)
        if len(data) > max_bytes:
            raise HTTPException(413, f"a 'documents' part is larger than {max_bytes} bytes (server.max_body_bytes)")
    try:
        raw = json.loads(part if isinstance(part, str) else data.decode("utf-8"))
        if isinstance(raw, dict) and "documents" not in raw:
            raw = [raw]  # one document per part
        return IngestIn.model_validate(raw if isinstance(raw, dict) else {"documents": raw}).documents
    except ValueError as exc:  # not JSON (an empty part included), not UTF-8, or not documents
        raise HTTPException(422, f"invalid 'documents' field: {_brief(exc)}") from exc
    except RecursionError as exc:
        raise HTTPException(422, "invalid 'documents' field: JSON nested too deeply") from exc


async def _spool(upload: UploadFile, directory: Path, max_bytes: int) -> Path:
    """Copy an upload to a temp file next to its final place; 413 past `max_bytes`."""
    directory.mkdir(parents=True, exist_ok=True)
    num_bytes = 0
    tmp = tempfile.NamedTemporaryFile(dir=directory, prefix=".upload-", delete=False)  # noqa: SIM115 - closed below
    path = Path(tmp.name)
    try:
        # The close is inside: on a full disk the buffered tail fails there (that left a 0-byte temp file).
        with tmp:
            while block := await upload.read(UPLOAD_BLOCK):
                num_bytes += len(block)
                if num_bytes > max_bytes:
                    raise HTTPException(
                        413, f"{upload.filename}: larger than the {max_bytes}-byte limit (ingest.max_file_bytes)"
                    )
                tmp.write(block)
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return path


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
    return JobList(jobs=[job_out(j) for j in service.recent_jobs(limit, access.collections)])


@router.get("/ingest/jobs/{job_id}", response_model=JobOut, responses={404: {"model": ErrorOut}})
def get_job(
    job_id: str, service: IngestService = Depends(get_ingest), access: Access = Depends(require_reader)
) -> JobOut:
    """Status, current stage, per-stage progress and per-source errors of one ingest job."""
    return job_out(_job_or_404(service, job_id, access))


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
    return job_out(service.cancel(job_id))


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
            body = job_out(job).model_dump()
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
    return DocumentPage(total=total, offset=offset, limit=limit, documents=[document_out(d) for d in docs])


@router.get("/documents/{document_id}", response_model=DocumentDetail, responses={404: {"model": ErrorOut}})
def get_document(
    document_id: str, service: DocumentService = Depends(get_documents), access: Access = Depends(require_reader)
) -> DocumentDetail:
    """One document with its chunks and each chunk's KV state (fresh / stale / missing)."""
    view = service.get(document_id, access.collections)
    if view is None:
        raise HTTPException(404, f"no document {document_id}")
    out = [
        ChunkOut(
            id=c.record.id,
            index=c.record.index,
            page=c.record.page,
            num_tokens=len(c.record.token_ids),
            char_start=c.record.char_start,
            char_end=c.record.char_end,
            text=c.record.text,
            kv_state=c.kv_state,
        )
        for c in view.chunks
    ]  # type: ignore[arg-type]
    return DocumentDetail(**document_out(view.document).model_dump(), kv=KVCounts(**view.kv_counts()), chunks=out)


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
