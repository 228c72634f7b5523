"""The stages run one by one in the test's thread, on the fast stack of tests/app/conftest.py."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from app.build import Services, new_scheduler
from app.services.ingest import IngestSource
from app.services.ingest.context import IngestEnv, JobContext
from app.services.ingest.submission import create_job
from app.services.ingest.worker import job_context


@pytest.fixture
def env(services: Services) -> IngestEnv:
    assert services.catalog is not None and services.engine is not None and services.retriever is not None
    assert services.kv_space is not None and services.documents is not None
    return IngestEnv(
        settings=services.settings,
        catalog=services.catalog,
        engine=services.engine,
        retriever=services.retriever,
        kv_space=services.kv_space,
        scheduler=new_scheduler(services.settings, services.engine),
        documents=services.documents,
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
