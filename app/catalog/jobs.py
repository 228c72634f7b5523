"""`JobStore`: the catalog's ingest jobs (part of `Catalog`)."""

from __future__ import annotations

import uuid
from collections.abc import Collection, Sequence
from typing import Any

from sqlalchemy import select, update

from app.catalog.models import DEFAULT_COLLECTION, JobRow, JobStatus
from app.catalog.records import JobRecord, JobUpdate, in_collections, job_record
from app.catalog.sessions import SessionStore


class JobStore(SessionStore):
    def create_job(self, spec: dict[str, Any], collection: str = DEFAULT_COLLECTION) -> JobRecord:
        with self._session() as s:
            row = JobRow(
                id=str(uuid.uuid4()),
                status=JobStatus.QUEUED,
                spec=spec,
                progress={},
                errors=[],
                collection=collection,
            )
            s.add(row)
            s.flush()
            return job_record(row)

    def get_job(self, job_id: str) -> JobRecord | None:
        with self._session() as s:
            row = s.get(JobRow, job_id)
            return job_record(row) if row else None

    def update_job(self, job_id: str, change: JobUpdate) -> None:
        with self._session() as s:
            s.execute(update(JobRow).where(JobRow.id == job_id).values(**change.values()))

    def jobs_with_status(self, statuses: Sequence[JobStatus]) -> list[JobRecord]:
        with self._session() as s:
            rows = s.scalars(select(JobRow).where(JobRow.status.in_(list(statuses))).order_by(JobRow.created_at))
            return [job_record(r) for r in rows]

    def list_jobs(self, limit: int = 50, collections: Collection[str] | None = None) -> list[JobRecord]:
        with self._session() as s:
            q = select(JobRow).where(*in_collections(collections, JobRow.collection))
            return [job_record(r) for r in s.scalars(q.order_by(JobRow.created_at.desc()).limit(limit))]
