"""The SQL catalog: documents, chunks and ingest jobs. The source of truth for what is answerable."""

from app.catalog.models import ChunkRow, DocumentRow, DocumentStatus, JobRow, JobStatus
from app.catalog.repository import Catalog

__all__ = ["Catalog", "ChunkRow", "DocumentRow", "DocumentStatus", "JobRow", "JobStatus"]
