"""Bodies of /ask: the answer, its SSE events and the defaults a request leaves out."""

from __future__ import annotations

from typing import Literal

from pydantic import AliasChoices, AliasPath, BaseModel, Field

from app.api.schemas.common import RecordOut
from app.api.schemas.conversations import TurnSourceOut


class AskDefaultsOut(BaseModel):
    """What /ask uses for a field a request leaves out (the chat page starts from these)."""

    top_k: int
    mode: str
    recompute_ratio: float
    selector: str
    max_tokens: int


class SourceOut(TurnSourceOut):
    """A passage the answer was given: the turn's source, with how it scored and what the model read."""

    score: float
    snippet: str
    text: str = Field(description="The whole passage the model read")
    section: str | None = Field(
        default=None,
        description="The Markdown heading the passage sits under (the nearest at or before its start); null "
        "for a document without headings",
    )


class UsageOut(RecordOut):
    prompt_tokens: int
    completion_tokens: int
    context_tokens: int
    recomputed_tokens: int
    history_tokens: int = Field(default=0, description="Tokens of the conversation's earlier turns in the prompt")
    history_reused_tokens: int = Field(default=0, description="Of those, the ones served from stored KV")
    total_tokens: int


class TimingsOut(RecordOut):
    retrieval_ms: float
    kv_load_ms: float
    ttft_ms: float = Field(description="Request arrival to first token, retrieval and KV load included")
    total_ms: float
    full_prefill_estimate_ms: float | None = Field(
        description="What a plain prefill of this prompt would take here (learned online); null until known"
    )
    decode_tokens_per_s: float | None = Field(
        description="The answer's decode rate: completion tokens after the first ÷ the time from the first token "
        "to the last (total - TTFT, without retrieval and KV load); null for an answer of one token",
    )


class SourcesEventOut(RecordOut):
    """Data of the `sources` SSE event (first)."""

    sources: list[SourceOut]
    retrieval_ms: float
    notice: str | None = Field(
        default=None,
        description='Set when there are no sources: "nothing ingested yet", "no documents match" or "the '
        'documents do not cover this question" (the best match scored below retrieval.relevance_floor: the '
        "chunks were left out and the model was told so); the answer then comes from the model alone",
    )


class TokenEventOut(BaseModel):
    """Data of each `token` SSE event: the next piece of the answer."""

    text: str


class ErrorEventOut(BaseModel):
    """Data of an `error` SSE event (last): the answer stopped."""

    message: str
    code: Literal["busy", "internal", "cancelled"]


class CitationOut(RecordOut):
    start: int = Field(description="First character of the sentence in `answer`")
    end: int = Field(description="One past its last character")
    rank: int = Field(description="The source's rank (its [n])")
    score: float = Field(description="Weighted share of the sentence's distinctive words found in that source")


class UnsupportedIdentifierOut(RecordOut):
    start: int = Field(description="First character of the identifier in `answer`")
    end: int = Field(description="One past its last character")
    identifier: str = Field(description="The code identifier as the answer writes it")


class RepeatedLineOut(RecordOut):
    text: str = Field(description="The repeat the stop withheld (a sentence, line(s) or in-line unit), never sent")
    earlier_start: int = Field(description="Where what it repeats begins in `answer` (a character index)")


class AskDoneOut(RecordOut):
    """Data of the `done` SSE event (last): the AskOut fields except `sources`."""

    answer: str
    mode: str
    selector: str | None = Field(description="blend's token selector; null for modes that need none")
    recompute_ratio: float
    finish_reason: str = Field(
        description='"stop" (end of answer or a stop string), "length" (max_tokens: the answer was cut off), '
        '"repetition" (the model began to loop: a sentence said again, the same lines back to back until the '
        "copies hold three more lines, or a loop inside a line; the answer ends before the last copy, which "
        '`repeated_line` holds; /v1 reports it as "stop") or "cancelled" (the server stopped before the answer '
        "was done)"
    )
    repeated_line: RepeatedLineOut | None = Field(
        default=None,
        description='With finish_reason "repetition": what the stop withheld and where what it repeats begins; '
        "the chat page and `blendrag ask` show it",
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
    # Flat copies of the headline timings, for clients that do not want to dig.
    retrieval_ms: float = Field(validation_alias=AliasChoices("retrieval_ms", AliasPath("timings", "retrieval_ms")))
    ttft_ms: float = Field(validation_alias=AliasChoices("ttft_ms", AliasPath("timings", "ttft_ms")))
    total_ms: float = Field(validation_alias=AliasChoices("total_ms", AliasPath("timings", "total_ms")))
    notice: str | None = Field(
        default=None,
        description='What the reader of the answer is told beside it, notices joined by "; ": the `sources` '
        "event's (why there are no sources); that most code names the answer writes are in none of its sources "
        '("N of the M code names in this answer are in none of its sources: it is likely invented, …": at least '
        "2 such names and over half of those it writes); that the turn was not stored",
    )
    citations: list[CitationOut] = Field(
        default_factory=list,
        description="Answer sentences and the source each draws on most (shared distinctive words, and every "
        "code identifier the sentence names is in that source); the chat page shows them as [n] marks",
    )
    unsupported_identifiers: list[UnsupportedIdentifierOut] = Field(
        default_factory=list,
        description="Code identifiers the answer names (backticked spans, snake_case, dotted and called names, "
        "outside fenced code) that none of the sources contains: possibly invented; the chat page marks them "
        "as unsupported",
    )


class AskOut(AskDoneOut):
    """The non-streaming answer."""

    sources: list[SourceOut]
