"""Progress: the counts a job row shows per stage, written when a stage starts and ends."""

from __future__ import annotations

import pytest

from app.build import Services
from app.catalog.records import JobRecord, JobUpdate
from app.services.ingest.progress import Progress
from app.services.ingest.types import JobCancelled


def test_a_stage_start_and_end_are_written_and_heard(services: Services) -> None:
    job = services.catalog.create_job({})
    heard: list[JobRecord] = []
    progress = Progress(services.catalog, job.id, heard.append)
    progress.stage("parse", 2)
    assert services.catalog.get_job(job.id).progress["parse"] == {"done": 0, "total": 2}
    progress.grow(1)  # a records file: one more document than announced
    progress.advance(3)  # done == total: written now, however soon after the last write
    progress.stage("kv", 4)
    progress.add_kv(1000, 12, 2, 0.5)
    progress.add_kv(24, 3, 1, 0.25)
    progress.advance(4)
    row = services.catalog.get_job(job.id)
    assert row.stage == "kv"
    assert row.progress == {
        "parse": {"done": 3, "total": 3},
        "chunk": {"done": 0, "total": 0},
        "embed": {"done": 0, "total": 0},
        "kv": {"done": 4, "total": 4, "bytes": 1024, "tokens": 15, "computed": 3, "seconds": 0.75},
        "commit": {"done": 0, "total": 0},
    }
    assert [(j.stage, j.progress[j.stage]["done"]) for j in heard] == [("parse", 0), ("parse", 3), ("kv", 0), ("kv", 4)]


def test_check_cancel_raises_once_a_cancel_is_requested(services: Services) -> None:
    job = services.catalog.create_job({})
    progress = Progress(services.catalog, job.id)
    progress.check_cancel()
    services.catalog.update_job(job.id, JobUpdate(cancel_requested=True))
    with pytest.raises(JobCancelled):
        progress.check_cancel(force=True)
