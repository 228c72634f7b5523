"""A job says how many documents it added, apart from its duplicates (issue 62, item 7c: a re-ingest of 19
duplicates read "done: -19 document(s)" on the admin page)."""

from __future__ import annotations

from app.build import Services, new_ingest
from app.catalog import JobStatus
from app.services.ingest import IngestSource

TEXTS = {
    "zorblat": "Quintaro is the capital of Zorblat. It has purple rivers.",
    "bread": "Sourdough needs flour, water, salt and a starter.",
    "moon": "The Moon orbits the Earth every 27.3 days.",
}


def _sources(*titles: str) -> list[IngestSource]:
    return [IngestSource(kind="text", title=t, text=TEXTS[t]) for t in titles]


def test_the_commit_counts_the_documents_it_made_ready_and_duplicates_are_not_among_them(services: Services) -> None:
    service = new_ingest(services)
    first = service.submit(_sources("zorblat", "bread"), enqueue=False)
    service.run_job(first.job_id)
    job = services.catalog.get_job(first.job_id)
    assert (job.status, job.progress["commit"]) == (JobStatus.SUCCEEDED, {"done": 2, "total": 2, "ready": 2})

    again = service.submit(_sources("zorblat", "moon", "bread"), enqueue=False)
    service.run_job(again.job_id)
    job = services.catalog.get_job(again.job_id)
    assert job.status == JobStatus.SUCCEEDED
    assert job.progress["commit"] == {"done": 1, "total": 1, "ready": 1}
    assert [(e["source"], e["code"], e["document_id"]) for e in job.errors] == [
        ("zorblat", "duplicate", first.document_ids[0]),
        ("bread", "duplicate", first.document_ids[1]),
    ]
    # The ids of the duplicates are their originals' (what the 202 answered), not documents of this job.
    assert (len(job.document_ids), job.duplicate_ids) == (1, first.document_ids)

    only_copies = service.submit(_sources("bread", "zorblat"), enqueue=False)
    service.run_job(only_copies.job_id)
    job = services.catalog.get_job(only_copies.job_id)
    assert (job.status, job.progress["commit"]["ready"]) == (JobStatus.SUCCEEDED, 0)
    assert (job.document_ids, [e["code"] for e in job.errors]) == ([], ["duplicate", "duplicate"])
