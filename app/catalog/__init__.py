"""The SQL catalog: documents, chunks, ingest jobs, the index change log and conversations (`conversations.py`).
The source of truth for what is answerable; schema changes are Alembic migrations (`migrate.py`)."""

from app.catalog.models import ChunkRow, DocumentRow, DocumentStatus, JobRow, JobStatus
from app.catalog.repository import Catalog

__all__ = ["Catalog", "ChunkRow", "DocumentRow", "DocumentStatus", "JobRow", "JobStatus"]
