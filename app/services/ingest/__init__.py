"""Ingest as background jobs: `IngestService` and the values its callers pass and get back."""

from app.services.ingest.service import IngestService
from app.services.ingest.types import IngestError, IngestSource, IngestTooLarge, JobError, SubmitResult

__all__ = ["IngestError", "IngestService", "IngestSource", "IngestTooLarge", "JobError", "SubmitResult"]
