"""The stages run one by one in the test's thread, on the fast stack of tests/app/conftest.py."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from app.components import Components, build_scheduler
from app.services.document_service import DocumentService
from app.services.ingest import IngestSource
from app.services.ingest.context import IngestEnv, JobContext
from app.services.ingest.submission import create_job
from app.services.ingest.worker import job_context


@pytest.fixture
def env(components: Components) -> IngestEnv:
    return IngestEnv(
        components=components, scheduler=build_scheduler(components), documents=DocumentService(components)
    )


@pytest.fixture
def make_ctx(env: IngestEnv) -> Callable[[list[IngestSource]], JobContext]:
    """A submitted job's context, before its first stage (the caps are not checked: stages see what they get)."""

    def make(sources: list[IngestSource]) -> JobContext:
        submitted = create_job(env.catalog, env.documents, sources)
        job = env.catalog.get_job(submitted.job_id)
        assert job is not None
        return job_context(env, job)

    return make
