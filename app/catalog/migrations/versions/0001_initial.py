"""The catalog as it was before migrations: documents, chunks, ingest jobs.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "documents",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("title", sa.String(512), nullable=False),
        sa.Column("source_path", sa.String(2048), nullable=True),
        sa.Column("content_hash", sa.String(64), nullable=True),
        sa.Column("status", sa.Enum("PENDING", "READY", "FAILED", name="documentstatus"), nullable=False),
        sa.Column("error", sa.Text, nullable=True),
        sa.Column("tags", sa.JSON, nullable=False),
        sa.Column("metadata", sa.JSON, nullable=False),
        sa.Column("num_chunks", sa.Integer, nullable=False),
        sa.Column("num_tokens", sa.Integer, nullable=False),
        sa.Column("job_id", sa.String(36), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )
    for column in ("job_id", "status", "source_path", "content_hash"):
        op.create_index(f"ix_documents_{column}", "documents", [column])
    op.create_table(
        "chunks",
        # AUTOINCREMENT on SQLite, a sequence (SERIAL) on PostgreSQL: neither ever hands out an id again,
        # so a FAISS id can never come to mean a different chunk.
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("document_id", sa.String(36), sa.ForeignKey("documents.id", ondelete="CASCADE"), nullable=False),
        sa.Column("index", sa.Integer, nullable=False),
        sa.Column("text", sa.Text, nullable=False),
        sa.Column("token_ids_blob", sa.LargeBinary, nullable=False),
        sa.Column("num_tokens", sa.Integer, nullable=False),
        sa.Column("page", sa.Integer, nullable=True),
        sa.Column("char_start", sa.Integer, nullable=False),
        sa.Column("char_end", sa.Integer, nullable=False),
        sa.Column("kv_key", sa.String(128), nullable=True),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_chunks_document_id", "chunks", ["document_id"])
    op.create_index("ix_chunks_kv_key", "chunks", ["kv_key"])
    op.create_table(
        "ingest_jobs",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column(
            "status", sa.Enum("QUEUED", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED", name="jobstatus"), nullable=False
        ),
        sa.Column("stage", sa.String(32), nullable=True),
        sa.Column("progress", sa.JSON, nullable=False),
        sa.Column("errors", sa.JSON, nullable=False),
        sa.Column("spec", sa.JSON, nullable=False),
        sa.Column("document_ids", sa.JSON, nullable=False),
        sa.Column("duplicate_ids", sa.JSON, nullable=False),
        sa.Column("cancel_requested", sa.Boolean, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_ingest_jobs_status", "ingest_jobs", ["status"])


def downgrade() -> None:
    op.drop_table("ingest_jobs")
    op.drop_table("chunks")
    op.drop_table("documents")
    sa.Enum(name="jobstatus").drop(op.get_bind(), checkfirst=True)
    sa.Enum(name="documentstatus").drop(op.get_bind(), checkfirst=True)
