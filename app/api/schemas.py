"""Request and response bodies of the HTTP API (pydantic; they document themselves at /docs)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from engine.types import SelectorName

ModeName = Literal["blend", "full", "prefix", "reuse"]
JobStatusName = Literal["queued", "running", "succeeded", "failed", "cancelled"]
DocumentStatusName = Literal["pending", "ready", "failed"]
KVState = Literal["fresh", "stale", "missing"]


class ErrorOut(BaseModel):
    detail: str = Field(description="What went wrong, for a human")


class ValidationErrorOut(ErrorOut):
    """422: `detail` is one readable line; `errors` the per-field list (absent for checks made by services)."""

    errors: list[dict[str, Any]] = Field(default_factory=list, description="loc, msg, type per problem")


class OpenAIErrorBody(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class OpenAIErrorOut(BaseModel):
    error: OpenAIErrorBody


# ---- ingest and documents ---------------------------------------------------------------------------


class DocumentIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    title: str = Field(min_length=1, max_length=512)
    text: str = Field(min_length=1)
    metadata: dict[str, Any] = Field(default_factory=dict)
    tags: list[str] = Field(default_factory=list)
    source: str | None = Field(default=None, description="Stable identity; re-ingesting it replaces the old")


class IngestIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    documents: list[DocumentIn] = Field(min_length=1)


class IngestAccepted(BaseModel):
    job_id: str
    document_ids: list[str] = Field(description="One per submitted document or file, in order (a JSON/JSONL "
                                    "file with many records adds more to the job's document_ids once parsed)")


class StageProgress(BaseModel):
    done: int
    total: int


class JobOut(BaseModel):
    job_id: str
    status: JobStatusName
    stage: str | None = Field(description="parse | chunk | embed | kv | commit while running, else null")
    progress: dict[str, StageProgress] = Field(description="done/total per stage")
    errors: list[dict[str, Any]] = Field(description="Per-source failures: source, error, code")
    document_ids: list[str]
    duplicate_ids: list[str] = Field(description="Submitted documents dropped as duplicates of stored ones")
    cancel_requested: bool = False
    created_at: str
    updated_at: str


class DocumentOut(BaseModel):
    id: str
    title: str
    status: DocumentStatusName
    error: str | None
    source: str | None
    tags: list[str]
    metadata: dict[str, Any]
    num_chunks: int
    num_tokens: int
    job_id: str | None
    created_at: str
    updated_at: str


class DocumentPage(BaseModel):
    total: int = Field(description="Documents matching the filter, over all pages")
    offset: int
    limit: int
    documents: list[DocumentOut]


class ChunkOut(BaseModel):
    id: int
    index: int
    page: int | None
    num_tokens: int
    char_start: int
    char_end: int
    text: str
    kv_state: KVState = Field(description="fresh: stored KV usable now; stale: stored for an older "
                              "model/prompt; missing: none stored (recomputed when asked)")


class KVCounts(BaseModel):
    fresh: int
    stale: int
    missing: int


class DocumentDetail(DocumentOut):
    kv: KVCounts
    chunks: list[ChunkOut]


# ---- ask ------------------------------------------------------------------------------------------


class FiltersIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    document_ids: list[str] | None = Field(default=None, description="Only retrieve from these documents")
    tags: list[str] | None = Field(default=None, description="Only retrieve from documents with any tag")


class AskIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    question: str = Field(max_length=8000)
    top_k: int | None = Field(default=None, ge=1, le=64, description="Chunks to retrieve (default: settings)")
    filters: FiltersIn = Field(default_factory=FiltersIn)
    mode: ModeName | None = Field(default=None, description="blend (CacheBlend), full (no reuse), prefix "
                                  "(exact prefix reuse only), reuse (stale KV, r=0); default: settings")
    recompute_ratio: float | None = Field(default=None, ge=0.0, le=1.0,
                                          description="Share of context tokens blend recomputes")
    selector: SelectorName | None = Field(
        default=None, description="Which context tokens blend recomputes: query (the question's attention, "
        "chosen before the pass), deviation (CacheBlend), first_k, random; default: settings")
    max_tokens: int | None = Field(default=None, ge=1, le=4096)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    seed: int | None = None
    stream: bool = Field(default=True, description="Server-Sent Events (default) or one JSON body")

    @field_validator("question")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("question must not be empty")
        return value


class SourceOut(BaseModel):
    rank: int = Field(description="1-based; the [n] an answer cites")
    chunk_id: int
    document_id: str
    title: str
    page: int | None
    score: float
    snippet: str
    text: str = Field(description="The whole passage the model read")


class UsageOut(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    context_tokens: int
    recomputed_tokens: int
    total_tokens: int


class TimingsOut(BaseModel):
    retrieval_ms: float
    kv_load_ms: float
    ttft_ms: float = Field(description="Request arrival to first token, retrieval and KV load included")
    total_ms: float
    full_prefill_estimate_ms: float | None = Field(
        description="What a plain prefill of this prompt would take here (learned online); null until known")


class AskOut(BaseModel):
    """The non-streaming answer; the `done` SSE event carries the same fields except `sources`."""

    answer: str
    sources: list[SourceOut]
    mode: str
    selector: str | None = Field(description="blend's token selector; null for modes that need none")
    recompute_ratio: float
    finish_reason: str
    usage: UsageOut
    timings: TimingsOut
    kv_hits: int
    kv_misses: int
    retrieval_ms: float
    ttft_ms: float
    total_ms: float


# ---- admin ----------------------------------------------------------------------------------------


class DocumentCoverageOut(BaseModel):
    document_id: str
    title: str
    status: str
    chunks_total: int
    chunks_fresh: int
    chunks_stale: int
    chunks_missing: int
    coverage: float


class CoverageOut(BaseModel):
    chunks_total: int
    chunks_fresh: int
    chunks_stale: int
    chunks_missing: int
    coverage: float = Field(description="fresh / total (1.0 for an empty library)")
    bytes_by_tier: dict[str, int] = Field(description="Bytes of fresh entries per tier holding them")
    fresh_by_tier: dict[str, int]
    documents: list[DocumentCoverageOut]


class TierStatsOut(BaseModel):
    name: str
    available: bool
    num_entries: int
    num_bytes: int
    budget_bytes: int | None
    num_hits: int
    num_misses: int
    hit_rate: float | None = Field(description="hits / (hits + misses); null before the first read")
    num_evictions: int
    num_faults: int


class ModeStatsOut(BaseModel):
    count: int
    ttft_ms_mean: float
    ttft_ms_p50: float
    ttft_ms_p95: float


class RecentAskOut(BaseModel):
    at: float
    mode: str
    selector: str | None
    ttft_ms: float
    total_ms: float
    recompute_ratio: float
    kv_hits: int
    kv_misses: int
    num_prompt_tokens: int
    num_completion_tokens: int
    full_prefill_estimate_ms: float | None


class StatsOut(BaseModel):
    model: str | None
    fingerprint: str | None
    default_mode: str = Field(description="The mode a question without `mode` is answered in")
    default_selector: str = Field(description="The blend token selector a question without `selector` gets")
    default_recompute_ratio: float
    queue_depth: int | None
    prefill_tokens_per_s: float | None
    documents_by_status: dict[str, int]
    kv_tiers: list[TierStatsOut]
    kv_hit_rate: float | None = Field(description="Store reads found in some tier / all store reads")
    ask_kv_hits: int = Field(description="Chunk KV found at ask time (since start)")
    ask_kv_misses: int = Field(description="Chunk KV recomputed at ask time (since start)")
    ingest_chunks: int
    ingest_seconds: float
    ingest_chunks_per_s: float | None
    ttft_by_mode: dict[str, ModeStatsOut] = Field(description="Over the recent asks below")
    recent: list[RecentAskOut] = Field(description="Last answers, oldest first (bounded ring buffer)")
