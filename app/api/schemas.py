"""Request and response bodies of the HTTP API (pydantic; they document themselves at /docs)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, computed_field, field_validator, model_validator

from app.services.ask_types import MAX_QUESTION_CHARS, MAX_SEED
from app.services.text_checks import NOT_BLANK, invalid_strings, is_blank, nesting_depth
from engine.types import Mode, SelectorName  # defined once, by the engine (plain data, no torch)
from retrieval.types import SearchFilters

if TYPE_CHECKING:
    from app.services.ask_types import AskRequest


def _not_bool(value: Any) -> Any:
    # pydantic's lax mode reads true/false as 1/0 and "6" as 6; the spec says number, so both are a 422.
    # (53.0 stays an integer, as in JSON Schema.)
    if isinstance(value, bool):
        raise ValueError("expected a number, not true/false")
    if isinstance(value, str):
        raise ValueError("expected a number, not a string")
    return value


NotBool = BeforeValidator(_not_bool)

# Request limits, defined once for /ask, /v1/chat/completions and the CLI (which validates through AskIn).
# Numbers are JSON numbers: a string ("6") is a 422 like a boolean, as the spec's type says.
TopK = Annotated[int, Field(ge=1, le=64), NotBool]
MaxTokens = Annotated[int, Field(ge=1, le=4096), NotBool]
Temperature = Annotated[float, Field(ge=0.0, le=2.0, description="0 (or below 1e-4): greedy"), NotBool]
TopP = Annotated[float, Field(gt=0.0, le=1.0), NotBool]
RecomputeRatio = Annotated[float, Field(ge=0.0, le=1.0), NotBool]
Seed = Annotated[int, Field(ge=0, le=MAX_SEED), NotBool]
JobStatusName = Literal["queued", "running", "succeeded", "failed", "cancelled"]
DocumentStatusName = Literal["pending", "ready", "failed"]
KVState = Literal["fresh", "stale", "missing"]
CollectionName = Annotated[
    str,
    Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$",
        description="A collection: 1-64 letters, digits, '_', '.' or '-', starting with a letter or digit",
        examples=["default"],
    ),
]


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


MAX_METADATA_DEPTH = 16


class DocumentIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    title: str = Field(min_length=1, max_length=512, json_schema_extra={"pattern": NOT_BLANK})
    # The pattern documents the rule; the service checks it with a message naming the document.
    text: str = Field(min_length=1, json_schema_extra={"pattern": NOT_BLANK})
    metadata: dict[str, Any] = Field(
        default_factory=dict, description=f"JSON object, nested at most {MAX_METADATA_DEPTH} levels"
    )
    tags: list[str] = Field(default_factory=list)
    source: str | None = Field(default=None, description="Stable identity; re-ingesting it replaces the old")

    @model_validator(mode="after")
    def _storable(self) -> DocumentIn:
        if invalid_strings([self.title, self.text, self.tags, self.source, self.metadata]):
            raise ValueError("text must be valid Unicode (a lone surrogate such as \\ud800 is not)")
        if is_blank(self.title):
            raise ValueError(f"document title {self.title!r} is blank (only white space or invisible characters)")
        if nesting_depth(self.metadata, MAX_METADATA_DEPTH) > MAX_METADATA_DEPTH:
            raise ValueError(f"metadata is nested deeper than {MAX_METADATA_DEPTH} levels")
        return self


class IngestIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    documents: list[DocumentIn] = Field(min_length=1)
    collection: CollectionName | None = Field(
        default=None,
        description="The collection the documents join (default: the key's collection when it has exactly one, "
        "else `default`)",
    )


class IngestAccepted(BaseModel):
    job_id: str
    document_ids: list[str] = Field(
        description="One per submitted document or file, in order (a JSON/JSONL "
        "file with many records adds more to the job's document_ids once parsed)"
    )


class StageProgress(BaseModel):
    """done/total; the kv stage also has `bytes` (of the KV entries the job added, as stored) and `tokens`
    (the tokens those entries hold): what the job adds to the KV store's bill."""

    model_config = ConfigDict(extra="allow")

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
    collection: str = Field(description="The collection the job ingests into")
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
    collection: str
    created_at: str
    updated_at: str


class DocumentPage(BaseModel):
    total: int = Field(description="Documents matching the filter, over all pages")
    offset: int
    limit: int
    documents: list[DocumentOut]


class PurgeOut(BaseModel):
    deleted: int = Field(description="Documents deleted")


class ChunkOut(BaseModel):
    id: int
    index: int
    page: int | None
    num_tokens: int
    char_start: int
    char_end: int
    text: str
    kv_state: KVState = Field(
        description="fresh: stored KV usable now; stale: stored for an older "
        "model/prompt; missing: none stored (recomputed when asked)"
    )


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

    document_ids: list[str] | None = Field(
        default=None, description="Only retrieve from these documents; null or [] (nothing selected): no filter"
    )
    tags: list[str] | None = Field(
        default=None, description="Only retrieve from documents with any of these tags; null or []: no filter"
    )

    def to_filters(self) -> SearchFilters:
        # An empty list is "nothing selected" (a UI with no box ticked), not "match nothing": no filter.
        return SearchFilters(document_ids=self.document_ids or None, tags=self.tags or None)


class JobList(BaseModel):
    jobs: list[JobOut] = Field(description="Most recent first")


class AskDefaultsOut(BaseModel):
    """What /ask uses for a field a request leaves out (the chat page starts from these)."""

    top_k: int
    mode: str
    recompute_ratio: float
    selector: str
    max_tokens: int


class AskParams(BaseModel):
    """Retrieval and generation parameters shared by /ask and /v1/chat/completions."""

    top_k: TopK | None = Field(default=None, description="Chunks to retrieve (default: settings)")
    filters: FiltersIn = Field(default_factory=FiltersIn)
    collections: list[CollectionName] | None = Field(
        default=None,
        min_length=1,
        description="Only retrieve from these collections (each must be one the caller's key may read); "
        "null: every collection it may read",
    )
    mode: Mode | None = Field(
        default=None,
        description="blend (CacheBlend), full (no reuse), prefix "
        "(exact prefix reuse only), reuse (stale KV, r=0); default: settings",
    )
    recompute_ratio: RecomputeRatio | None = Field(default=None, description="Share of context tokens blend recomputes")
    selector: SelectorName | None = Field(
        default=None,
        description="Which context tokens blend recomputes: query (the question's attention, "
        "chosen before the pass), deviation (CacheBlend), first_k, random; default: settings",
    )
    max_tokens: MaxTokens | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    seed: Seed | None = None

    def to_request(self, question: str, max_tokens: int | None = None, stop: tuple[str, ...] = ()) -> AskRequest:
        """The service request (already validated here, at the edge)."""
        from app.services.ask_types import AskRequest

        return AskRequest(
            question=question,
            top_k=self.top_k,
            filters=self.filters.to_filters(),
            mode=self.mode,
            recompute_ratio=self.recompute_ratio,
            selector=self.selector,
            max_tokens=max_tokens or self.max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            seed=self.seed,
            stop=stop,
        )


ConversationId = Annotated[
    str,
    Field(
        min_length=1,
        max_length=64,
        pattern=r"^[A-Za-z0-9-]+$",
        description="A conversation's id, as an earlier answer's `conversation_id` gave it",
    ),
]


class AskIn(AskParams):
    model_config = ConfigDict(extra="forbid")

    conversation_id: ConversationId | None = Field(
        default=None,
        description='Store this turn in a conversation: "new" starts one (the answer names it), an id '
        "continues one (its earlier turns are in the prompt and retrieval reads their questions). Without "
        "one the question is a one-off and nothing is stored.",
    )

    # min_length and pattern document the rule; the validator below checks it with a readable message.
    question: str = Field(max_length=MAX_QUESTION_CHARS, json_schema_extra={"minLength": 1, "pattern": NOT_BLANK})
    stream: bool = Field(default=True, strict=True, description="Server-Sent Events (default) or one JSON body")

    @field_validator("question")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if is_blank(value):
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
    history_tokens: int = Field(default=0, description="Tokens of the conversation's earlier turns in the prompt")
    history_reused_tokens: int = Field(default=0, description="Of those, the ones served from stored KV")
    total_tokens: int


class TimingsOut(BaseModel):
    retrieval_ms: float
    kv_load_ms: float
    ttft_ms: float = Field(description="Request arrival to first token, retrieval and KV load included")
    total_ms: float
    full_prefill_estimate_ms: float | None = Field(
        description="What a plain prefill of this prompt would take here (learned online); null until known"
    )


class SourcesEventOut(BaseModel):
    """Data of the `sources` SSE event (first)."""

    sources: list[SourceOut]
    retrieval_ms: float
    notice: str | None = Field(
        default=None,
        description='Set when there are no sources: "nothing ingested yet" or "no documents match" '
        "(the answer then comes from the model alone)",
    )


class TokenEventOut(BaseModel):
    """Data of each `token` SSE event: the next piece of the answer."""

    text: str


class ErrorEventOut(BaseModel):
    """Data of an `error` SSE event (last): the answer stopped."""

    message: str
    code: Literal["busy", "internal", "cancelled"]


class CitationOut(BaseModel):
    start: int = Field(description="First character of the sentence in `answer`")
    end: int = Field(description="One past its last character")
    rank: int = Field(description="The source's rank (its [n])")
    score: float = Field(description="Weighted share of the sentence's distinctive words found in that source")


class AskDoneOut(BaseModel):
    """Data of the `done` SSE event (last): the AskOut fields except `sources`."""

    answer: str
    mode: str
    selector: str | None = Field(description="blend's token selector; null for modes that need none")
    recompute_ratio: float
    finish_reason: str = Field(
        description='"stop" (end of answer or a stop string), "length" (max_tokens: the answer was cut off), '
        '"repetition" (the model began to repeat a sentence or looped inside a line: the answer ends before '
        'it; /v1 reports it as "stop") or "cancelled"'
    )
    usage: UsageOut
    timings: TimingsOut
    kv_hits: int
    kv_misses: int
    conversation_id: str | None = Field(
        default=None, description="The conversation this turn belongs to (send it back to continue)"
    )
    history_turns: int = Field(default=0, description="Earlier turns placed in the prompt")
    history_dropped_turns: int = Field(
        default=0, description="Oldest earlier turns left out to fit `engine.history_max_tokens`"
    )
    retrieval_query: str | None = Field(
        default=None, description="What retrieval searched with when it was not the question alone"
    )
    retrieval_ms: float
    ttft_ms: float
    total_ms: float
    notice: str | None = Field(default=None, description="As in the `sources` event: why there are no sources")
    citations: list[CitationOut] = Field(
        default_factory=list,
        description="Answer sentences and the source each draws on most (shared distinctive words); "
        "the chat page shows them as [n] marks",
    )


class AskOut(AskDoneOut):
    """The non-streaming answer."""

    sources: list[SourceOut]


class JobErrorEventOut(BaseModel):
    """Data of an `error` event on a job's stream."""

    message: str


# ---- conversations --------------------------------------------------------------------------------


class ConversationOut(BaseModel):
    id: str
    title: str = Field(description="The first question")
    num_turns: int
    created_at: str
    updated_at: str = Field(description="When the last turn was added")


class ConversationPageOut(BaseModel):
    total: int = Field(description="Your conversations, over all pages")
    offset: int
    limit: int
    conversations: list[ConversationOut] = Field(description="The most recently continued first")


class TurnSourceOut(BaseModel):
    rank: int
    chunk_id: int
    document_id: str
    title: str
    page: int | None


class TurnOut(BaseModel):
    index: int = Field(description="0-based, in the order asked")
    question: str
    answer: str
    sources: list[TurnSourceOut] = Field(description="The passages it was answered from (deleted ones left out)")
    mode: str
    selector: str | None
    recompute_ratio: float
    timings: dict[str, Any]
    usage: dict[str, Any]
    created_at: str


class ConversationDetailOut(ConversationOut):
    turns: list[TurnOut]


# ---- admin ----------------------------------------------------------------------------------------


class DocumentCoverageOut(BaseModel):
    document_id: str
    title: str
    status: str
    collection: str
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
    num_context_tokens: int = Field(description="Context tokens in the prompt; 0 for an answer without documents")


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


class BlendSettingsOut(BaseModel):
    source: str = Field(description="operator, calibrated, shipped or safe (not calibrated yet)")
    label: str = Field(description="Where they came from, in words: 'calibrated on …', 'shipped for <model> …'")
    operator_fields: list[str] = Field(description="Blend settings the operator set; these win over any record")
    values: dict[str, Any] = Field(description="Every blend setting in force (engine.* names)")
    measured: dict[str, Any] | None = Field(description="What the calibration measured at these settings")


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
    recent: list[RecentAskOut] = Field(description="Last answers, oldest first (bounded ring buffer)")
    storage: StorageOut


# ---- collections and keys ---------------------------------------------------------------------------


class CollectionOut(BaseModel):
    name: str
    num_documents: int = Field(description="Documents of every status")
    num_ready_documents: int
    num_chunks: int
    chunks_fresh: int = Field(description="Chunks of ready documents whose stored KV is usable now")
    coverage: float = Field(description="fresh / chunks of ready documents (1.0 when there are none)")


class CollectionListOut(BaseModel):
    collections: list[CollectionOut] = Field(description="The collections the caller may read, by name")


class CollectionDeletedOut(BaseModel):
    name: str
    deleted: int = Field(description="Documents deleted")


class KeyIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=128, pattern=r"\S", description="Who the key is for")
    collections: list[CollectionName] = Field(min_length=1, max_length=100, description="Collections it may read")
    can_ingest: bool = Field(
        default=False, strict=True, description="It may also ingest into and delete from them (true or false only)"
    )


class KeyCreatedOut(BaseModel):
    key_id: str
    key: str = Field(description="The secret: shown this once, stored only as a hash")


class KeyOut(BaseModel):
    key_id: str
    name: str
    collections: list[str]
    can_ingest: bool
    created_at: str
    last_used_at: str | None = Field(description="Within 30 s; null: never used")


class KeyListOut(BaseModel):
    keys: list[KeyOut] = Field(description="Oldest first; never the secrets")
