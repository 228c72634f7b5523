"""What a question is and what answering it yields: `AskRequest` (with the `ConversationRef` it names), the
plan of its prompt (`AskPlan`), the events of its stream (sources, token deltas, done or error) with their
usage and timings, and the errors refused up front."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from retrieval.types import SearchFilters

if TYPE_CHECKING:
    from app.catalog.records import ChunkRecord
    from app.services.attribution import Citation, UnsupportedIdentifier
    from app.services.conversation_service import ConversationContext
    from engine.prompt import Turn
    from engine.types import Mode, PromptLayout, RepeatedLine, SelectorName
    from retrieval.config import FollowupMode
    from retrieval.followup import FollowupQuery

MAX_QUESTION_CHARS = 8000  # /ask, /v1 and the CLI alike (enforced at the edge)
MAX_SEED = 2**53 - 1  # exact as a JSON double (torch.Generator.manual_seed takes more)


class AskValidationError(ValueError):
    """A question that cannot be asked although its fields are valid (its prompt is longer than the model's
    context): HTTP 422 / 400, CLI exit 2."""


class AskBusy(RuntimeError):
    """The engine refuses the question (its queue is full, or the wait would be too long): HTTP 503 with
    Retry-After (checked before any response starts). `retry_after_s`: the engine's estimate of when a retry
    may be admitted (engine/admission.py)."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


@dataclass(frozen=True)
class ConversationRef:
    """The conversation a question is asked in, as its caller names it: "new" starts one, an id continues
    one. The service opens it after the busy check (`ConversationNotFound` for an id this caller may not
    open: another owner's, or one over collections it may not read)."""

    conversation_id: str
    owner: str | None = None  # the hash of the caller's key (`owner_of`); None without a key
    readable: frozenset[str] | None = None  # the collections the caller may read; None: every collection


@dataclass(frozen=True)
class AskRequest:
    """One question. Its values are validated where it comes in (the HTTP bodies, the CLI's arguments);
    the service trusts them."""

    question: str
    top_k: int | None = None
    filters: SearchFilters = field(default_factory=SearchFilters)
    mode: Mode | None = None
    recompute_ratio: float | None = None
    selector: SelectorName | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    # A conversation: the earlier turns (oldest first) go into the prompt and the retrieval query (a /v1
    # client's own; else the stored turns of `conversation`); the finished turn is recorded in
    # `conversation` when there is one (/ask with a conversation_id, /v1 on request).
    history: tuple[Turn, ...] = ()
    conversation: ConversationRef | None = None
    system_prompt: str | None = None  # a client's own (/v1 `system` message); None: the server's
    followup: FollowupMode | None = None  # how retrieval reads the history (default: settings)


@dataclass(frozen=True)
class Source:
    rank: int  # 1-based, best first: the [n] a reader cites
    chunk_id: int
    document_id: str
    title: str
    page: int | None
    score: float
    snippet: str
    text: str
    section: str | None = None  # the heading the passage sits under (app/services/sections.py), if any


NOTHING_INGESTED = "nothing ingested yet"
NO_MATCH = "no documents match"
# The best match scored below the relevance floor (retrieval/relevance.py): the chunks stay out of the prompt.
NOT_COVERED = "the documents do not cover this question"
# What the model reads after such a question, so that it says so instead of inventing an answer that reads as
# if it came from the documents. The exact sentence to begin with is what a small model follows: asked only to
# "say so in your first sentence", Qwen2.5-Coder-0.5B answered 3 of 3 such questions as if nothing were said.
NOT_COVERED_NOTE = (
    "Note: the user's documents do not cover this question. Begin your answer with exactly this sentence: "
    '"Your documents do not cover this question."'
)


@dataclass(frozen=True)
class SourcesEvent:
    sources: list[Source]
    retrieval_ms: float
    # Why there are no sources, when there are none: NOTHING_INGESTED, NO_MATCH or NOT_COVERED (the answer
    # then comes from the model alone, and the client should say so).
    notice: str | None = None


@dataclass(frozen=True)
class TokenDelta:
    text: str


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    context_tokens: int
    recomputed_tokens: int
    history_tokens: int = 0  # tokens of earlier turns in the prompt
    history_reused_tokens: int = 0  # of those, served from stored KV

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class Timings:
    retrieval_ms: float
    kv_load_ms: float
    ttft_ms: float
    total_ms: float
    full_prefill_estimate_ms: float | None  # what a plain (no-reuse) prefill of this prompt would take
    decode_tokens_per_s: float | None  # the answer's tokens after the first ÷ their time; None below two tokens


@dataclass(frozen=True)
class DoneEvent:
    answer: str
    mode: str
    selector: str | None  # the blend's token selector; None when the mode recomputes by rule (full, reuse…)
    recompute_ratio: float
    finish_reason: str
    usage: Usage
    timings: Timings
    kv_hits: int
    kv_misses: int
    # What the answer's reader is told beside it, joined by "; ": SourcesEvent's (no sources), that most of the
    # answer's code names are in no source (attribution.invention_notice), that the turn was not stored.
    notice: str | None = None
    # Which source each answer sentence draws on (app/services/attribution.py), for [n] marks.
    citations: list[Citation] = field(default_factory=list)
    # Code identifiers the answer names that no source contains (app/services/attribution.py).
    unsupported_identifiers: list[UnsupportedIdentifier] = field(default_factory=list)
    conversation_id: str | None = None
    history_turns: int = 0
    history_dropped_turns: int = 0
    retrieval_query: str | None = None  # what retrieval searched when it was not the question alone
    # finish_reason "repetition": the repeat the stop withheld and where what it repeats begins in `answer`.
    repeated_line: RepeatedLine | None = None


@dataclass(frozen=True)
class ErrorEvent:
    message: str
    code: Literal["busy", "internal", "cancelled"] = "internal"


AskEvent = SourcesEvent | TokenDelta | DoneEvent | ErrorEvent


@dataclass(frozen=True)
class AskPlan:
    """A question's conversation, retrieval and prompt, before any KV is opened (`AskService.plan`; bench
    reads it)."""

    layout: PromptLayout
    ordered: list[ChunkRecord]  # the retrieved chunks in prompt order
    sources: list[Source]  # best first
    retrieval_ms: float
    query: FollowupQuery  # what retrieval searched
    num_history_turns: int
    num_dropped_turns: int
    history_keys: list[str]  # the store key of each earlier turn in the layout
    history: tuple[Turn, ...] = ()  # the earlier turns the prompt was laid out from (oldest first)
    conversation: ConversationContext | None = None  # the opened conversation the turn is recorded in
    # Retrieval's best cosine similarity (None: nothing retrieved; a follow-up's: the best of its query's, its
    # question's and the earlier questions' it read, retrieval/relevance.py) and whether it reached the
    # relevance floor; below it `sources` is empty and the prompt carries NOT_COVERED_NOTE.
    best_score: float | None = None
    covered: bool = True
