"""The parameters of a question, validated at the edge: shared by /ask, /v1/chat/completions and the CLI
(which validates through `AskIn` too, so a bad value reads the same everywhere).

Numbers are JSON numbers: a string ("6") or a boolean is refused, as the OpenAPI spec's type says.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator

from app.services.ask.types import MAX_QUESTION_CHARS, MAX_SEED
from app.services.key_service import COLLECTION_PATTERN
from app.services.text_checks import NOT_BLANK, is_blank
from engine.types import Mode, SelectorName  # defined once, by the engine (plain data, no torch)
from retrieval.types import SearchFilters

if TYPE_CHECKING:
    from app.services.ask.types import AskRequest


def _not_bool(value: Any) -> Any:
    # pydantic's lax mode reads true/false as 1/0 and "6" as 6; the spec says number, so both are a 422.
    # (53.0 stays an integer, as in JSON Schema.)
    if isinstance(value, bool):
        raise ValueError("expected a number, not true/false")
    if isinstance(value, str):
        raise ValueError("expected a number, not a string")
    return value


NotBool = BeforeValidator(_not_bool)

# Request limits, defined once for /ask, /v1/chat/completions and the CLI.
TopK = Annotated[int, Field(ge=1, le=64), NotBool]
MaxTokens = Annotated[int, Field(ge=1, le=4096), NotBool]
Temperature = Annotated[float, Field(ge=0.0, le=2.0, description="0 (or below 1e-4): greedy"), NotBool]
TopP = Annotated[float, Field(gt=0.0, le=1.0), NotBool]
RecomputeRatio = Annotated[float, Field(ge=0.0, le=1.0), NotBool]
Seed = Annotated[int, Field(ge=0, le=MAX_SEED), NotBool]
CollectionName = Annotated[
    str,
    Field(
        pattern=COLLECTION_PATTERN,
        description="A collection: 1-64 letters, digits, '_', '.' or '-', starting with a letter or digit",
        examples=["default"],
    ),
]
ConversationId = Annotated[
    str,
    Field(
        min_length=1,
        max_length=64,
        pattern=r"^[A-Za-z0-9-]+$",
        description="A conversation's id, as an earlier answer's `conversation_id` gave it",
    ),
]


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
        "(exact prefix reuse only), reuse (stored KV unchanged, r=0); default: settings",
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
        from app.services.ask.types import AskRequest

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
