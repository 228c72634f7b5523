"""Bodies of the conversation routes."""

from __future__ import annotations

from typing import Any

from pydantic import AliasPath, BaseModel, Field

from app.api.schemas.common import RecordOut, Timestamp


class ConversationOut(RecordOut):
    # Read from a `ConversationRecord`.
    id: str
    title: str = Field(description="The first question")
    num_turns: int
    created_at: Timestamp
    updated_at: Timestamp = Field(description="When the last turn was added")


class ConversationPageOut(BaseModel):
    total: int = Field(description="Your conversations, over all pages")
    offset: int
    limit: int
    conversations: list[ConversationOut] = Field(description="The most recently continued first")


class TurnSourceOut(RecordOut):
    rank: int = Field(description="1-based; the [n] an answer cites")
    chunk_id: int
    document_id: str
    title: str
    page: int | None


class TurnOut(RecordOut):
    # Read from a `TurnView` (its `TurnRecord` and the sources resolved now).
    index: int = Field(validation_alias=AliasPath("turn", "index"), description="0-based, in the order asked")
    question: str = Field(validation_alias=AliasPath("turn", "question"))
    answer: str = Field(validation_alias=AliasPath("turn", "answer"))
    sources: list[TurnSourceOut] = Field(description="The passages it was answered from (deleted ones left out)")
    mode: str = Field(validation_alias=AliasPath("turn", "mode"))
    selector: str | None = Field(validation_alias=AliasPath("turn", "selector"))
    recompute_ratio: float = Field(validation_alias=AliasPath("turn", "recompute_ratio"))
    timings: dict[str, Any] = Field(validation_alias=AliasPath("turn", "timings"))
    usage: dict[str, Any] = Field(validation_alias=AliasPath("turn", "usage"))
    created_at: Timestamp = Field(validation_alias=AliasPath("turn", "created_at"))


class ConversationDetailOut(ConversationOut):
    turns: list[TurnOut]
