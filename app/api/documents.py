"""Ingest and job routes: thin, the IngestService does the work."""

from __future__ import annotations

import json
import tempfile
import uuid
from pathlib import Path

from fastapi import APIRouter, Depends, HTTPException, Request
from pydantic import ValidationError

from app.api.deps import get_ingest, get_state
from app.api.schemas import IngestAccepted, IngestIn, JobOut
from app.catalog.repository import JobRecord
from app.services.ingest_service import IngestError, IngestService, IngestSource, save_upload
from app.state import AppState

router = APIRouter(tags=["documents"])


def job_out(job: JobRecord) -> JobOut:
    return JobOut(
        job_id=job.id, status=job.status.value, stage=job.stage, progress=job.progress, errors=job.errors,
        document_ids=job.document_ids, duplicate_ids=job.duplicate_ids, created_at=job.created_at.isoformat(),
        updated_at=job.updated_at.isoformat(),
    )


@router.post("/ingest", status_code=202, response_model=IngestAccepted)
async def ingest(request: Request, service: IngestService = Depends(get_ingest),
                 state: AppState = Depends(get_state)) -> IngestAccepted:
    """Queue documents for ingest: JSON `{"documents": [...]}` or multipart `files` (+ optional `tags`)."""
    content_type = request.headers.get("content-type", "")
    sources: list[IngestSource] = []
    if content_type.startswith("multipart/form-data"):
        form = await request.form()
        tags = [t.strip() for t in str(form.get("tags") or "").split(",") if t.strip()]
        batch = uuid.uuid4().hex
        for upload in form.getlist("files"):
            if isinstance(upload, str) or not upload.filename:
                continue
            with tempfile.NamedTemporaryFile(delete=False) as tmp:
                while block := await upload.read(1 << 20):
                    tmp.write(block)
            stored = save_upload(state.settings.uploads_dir, batch, upload.filename, Path(tmp.name))
            sources.append(IngestSource(kind="file", title=Path(upload.filename).name, path=str(stored),
                                        source_path=f"upload:{Path(upload.filename).name}", tags=tags))
        if not sources:
            raise HTTPException(422, "multipart ingest needs at least one file in the 'files' field")
    else:
        try:
            body = IngestIn.model_validate(json.loads(await request.body() or b"null"))
        except (ValueError, ValidationError) as exc:
            raise HTTPException(422, f"invalid ingest body: {exc}") from exc
        sources = [IngestSource(kind="text", title=d.title, text=d.text, tags=d.tags, metadata=d.metadata,
                                source_path=d.source) for d in body.documents]
    try:
        result = service.submit(sources)
    except IngestError as exc:
        raise HTTPException(422, str(exc)) from exc
    return IngestAccepted(job_id=result.job_id, document_ids=result.document_ids)


@router.get("/ingest/jobs/{job_id}", response_model=JobOut)
async def get_job(job_id: str, service: IngestService = Depends(get_ingest)) -> JobOut:
    job = service.get_job(job_id)
    if job is None:
        raise HTTPException(404, f"no ingest job {job_id}")
    return job_out(job)
