"""Bodies of the admin routes: coverage and stats."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, computed_field

from app.api.schemas.common import RecordOut
from app.metrics import RecentAsk


class DocumentCoverageOut(RecordOut):
    document_id: str
    title: str
    status: str
    collection: str
    chunks_total: int
    chunks_fresh: int
    chunks_stale: int
    chunks_missing: int
    coverage: float


class CoverageOut(RecordOut):
    # Read from a `CoverageView`.
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
    num_evictions: int
    num_faults: int

    @computed_field(description="hits / (hits + misses); null before the first read")  # type: ignore[prop-decorator]
    @property
    def hit_rate(self) -> float | None:
        from app.services.stats_service import hit_rate

        return hit_rate(self.num_hits, self.num_misses)


class ModeStatsOut(BaseModel):
    count: int
    ttft_ms_mean: float
    ttft_ms_p50: float
    ttft_ms_p95: float


class StorageOut(BaseModel):
    ok: bool = Field(description="false after a storage fault in the last 10 minutes or with < 64 MiB free")
    free_bytes: int | None = Field(description="Free space on the data dir's file system")
    last_fault: str | None = Field(description="The last disk-full / database-full / KV write failure")
    last_fault_at: float | None = Field(description="Unix time of last_fault")


class KVFootprintOut(BaseModel):
    storage_dtype: str = Field(description="The format new KV entries are stored in")
    bytes_per_token: float | None = Field(description="Bytes per token of that format for the model, scales included")
    bytes_per_million_tokens: float | None
    eviction: str = Field(description="Disk tier eviction policy: frequency or lru")
    disk_budget_bytes: int | None = Field(description="Disk tier budget; null without a disk tier")
    disk_bytes: int | None = Field(description="What the disk tier holds (null for a collection key)")
    disk_entries: int | None


class ComputeOut(BaseModel):
    dtype: str = Field(description="float32, bfloat16 or float16")
    reason: str = Field(description="Why: the setting, the device, or what torch reports about the CPU")
    requested: str = Field(description="The setting (engine.dtype / retrieval.embed_dtype), e.g. auto")


class ServedModelOut(BaseModel):
    name: str = Field(description="What engine.model names: a catalogue name, a GGUF file or a checkpoint dir")
    display_name: str
    source: Literal["catalog", "gguf", "checkpoint"]
    architecture: str
    num_parameters: int = Field(description="Weights loaded (tied embeddings once)")
    parameters_label: str = Field(description="The count as a person reads it: 135M, 630M, 1.8B")
    num_layers: int
    origin_quantisation: str | None = Field(description="Of the GGUF it was converted from, e.g. Q4_K_M")
    compute_dtype: str = Field(description="What the engine computes in: bfloat16, float32 or float16")
    decode_weights: str = Field(
        description="What decode reads: same (the model's own weights), int8 or int4 (engine.decode_weights)"
    )


class CheckPartOut(BaseModel):
    name: str = Field(
        description="The record's measured key: similar_check, similar_several_check, followups_check, heldout_check, "
        "long_answers_check"
    )
    title: str = Field(description="What the part asks, in words")
    state: Literal["met", "other settings", "below target", "not recorded"] = Field(
        description="met: checked on the settings in force and its figures meet the part's target as it is today; "
        "other settings: a setting in force differs from what it ran on (differs_in); below target: checked on the "
        "settings in force, its figures miss today's target (misses: a target tightened after it was written); not "
        "recorded: the record has no such entry (never run on it, or run and missed)"
    )
    summary: str | None = Field(description="Its figures in words (right answers, KL and benefit, or finish reasons)")
    differs_in: list[str] = Field(description="The settings in force that differ from those it ran on")
    misses: list[str] = Field(description="What its figures miss today's target by, in words (state below target)")


class BlendSettingsOut(BaseModel):
    source: str = Field(description="operator, calibrated, shipped or safe (not calibrated yet)")
    label: str = Field(description="Where they came from, in words: 'calibrated on …', 'shipped for <model> …'")
    operator_fields: list[str] = Field(description="Blend settings the operator set; these win over any record")
    values: dict[str, Any] = Field(description="Every blend setting in force (engine.* names)")
    measured: dict[str, Any] | None = Field(description="What the calibration measured at these settings")
    check_parts: list[CheckPartOut] = Field(
        default_factory=list,
        description="The record's check parts (bench ship) and whether they speak for these settings",
    )


class CalibrationStatusOut(BaseModel):
    state: str = Field(description="pending, running, done, failed or stopped")
    detail: str = Field(description="Progress or the reason it failed")
    candidates_done: int
    record_path: str | None = Field(default=None, description="Where its result was kept (the data dir)")


class StatsOut(BaseModel):
    model: str | None = Field(description="The served model's name (null before start-up)")
    served_model: ServedModelOut | None = Field(description="What the served model is; null before start-up")
    fingerprint: str | None
    compute: ComputeOut | None = Field(description="The engine's compute dtype and why; null before start-up")
    embedder_compute: ComputeOut | None = Field(description="The embedder's compute dtype and why")
    default_mode: str = Field(description="The mode a question without `mode` is answered in")
    default_selector: str = Field(description="The blend token selector a question without `selector` gets")
    default_recompute_ratio: float
    blend_settings: BlendSettingsOut | None = Field(
        default=None, description="The blend settings in force and where they came from; null before start-up"
    )
    calibration: CalibrationStatusOut | None = Field(
        default=None, description="The background calibration of the served model; null when none runs or ran"
    )
    queue_depth: int | None
    prefill_tokens_per_s: float | None
    documents_by_status: dict[str, int]
    kv_tiers: list[TierStatsOut]
    kv_hit_rate: float | None = Field(description="Store reads found in some tier / all store reads")
    kv_footprint: KVFootprintOut = Field(description="What the KV store costs and holds")
    ask_kv_hits: int | None = Field(description="Chunk KV found at ask time (since start; null for a collection key)")
    ask_kv_misses: int | None = Field(description="Chunk KV recomputed at ask time (since start)")
    conversations: int | None = Field(default=None, description="Stored conversations (all owners)")
    conversation_turns: int | None = Field(default=None, description="Their turns")
    ingest_chunks: int | None = Field(description="Chunks ingested since start (every collection: null for a key)")
    ingest_seconds: float | None
    ingest_chunks_per_s: float | None
    ttft_by_mode: dict[str, ModeStatsOut] = Field(
        description="Over the recent asks below that had context (answers without documents are left out: "
        "their prompt is the question alone, which says nothing about a mode's speed)"
    )
    recent: list[RecentAsk] = Field(description="Last answers, oldest first (bounded ring buffer)")
    storage: StorageOut
