"""Request and response bodies of the HTTP API (pydantic; they document themselves at /docs)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field


class DocumentIn(BaseModel):
    title: str = Field(min_length=1, max_length=512)
    text: str = Field(min_length=1)
    metadata: dict[str, Any] = Field(default_factory=dict)
    tags: list[str] = Field(default_factory=list)
    source: str | None = Field(default=None, description="Stable identity; re-ingesting it replaces the old")


class IngestIn(BaseModel):
    documents: list[DocumentIn] = Field(min_length=1)


class IngestAccepted(BaseModel):
    job_id: str
    document_ids: list[str]


class StageProgress(BaseModel):
    done: int
    total: int


class JobOut(BaseModel):
    job_id: str
    status: Literal["queued", "running", "succeeded", "failed", "cancelled"]
    stage: str | None
    progress: dict[str, StageProgress]
    errors: list[dict[str, Any]]
    document_ids: list[str]
    duplicate_ids: list[str]
    created_at: str
    updated_at: str


class FiltersIn(BaseModel):
    document_ids: list[str] | None = None
    tags: list[str] | None = None


class AskIn(BaseModel):
    question: str
    top_k: int | None = None
    filters: FiltersIn = Field(default_factory=FiltersIn)
    mode: str | None = Field(default=None, description="blend | full | prefix | reuse")
    recompute_ratio: float | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stream: bool = True
