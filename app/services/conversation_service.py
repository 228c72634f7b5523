"""ConversationService: the stored conversations of /ask (and of /v1 with a `conversation_id`).

A question asked in a conversation gets the conversation's earlier turns as its history (the prompt
holds them, retrieval reads their questions); when its answer is done, the turn is appended. Every
conversation has an owner — the hash of the API key that created it, None for requests without a
key — and is invisible to any other owner (404, like an unknown id).
"""

from __future__ import annotations

import hashlib
import logging
import uuid
from dataclasses import dataclass

from app.catalog.conversations import (
    ConversationCounts,
    ConversationPage,
    ConversationRecord,
    NewTurn,
    TurnRecord,
)
from app.catalog.repository import Catalog
from engine.prompt import Turn

logger = logging.getLogger(__name__)

NEW_CONVERSATION = "new"  # /v1's `conversation_id: "new"` starts a stored conversation


class ConversationNotFound(LookupError):
    """No conversation with this id for this owner (never made, deleted, or someone else's): HTTP 404."""


def owner_of(api_key: str | None) -> str | None:
    """The owner a request's key stands for: a hash (the key itself is never stored)."""
    if not api_key:
        return None
    return "key:" + hashlib.sha256(api_key.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class ConversationContext:
    """Where a question stands: its conversation (None: a stateless /v1 request) and the earlier turns."""

    conversation_id: str | None
    owner: str | None
    history: tuple[Turn, ...] = ()
    is_new: bool = False  # the conversation row is made when its first turn is recorded


@dataclass(frozen=True)
class TurnSource:
    """A stored turn's source, resolved against the catalog now (a deleted chunk is left out)."""

    rank: int
    chunk_id: int
    document_id: str
    title: str
    page: int | None


@dataclass(frozen=True)
class TurnView:
    turn: TurnRecord
    sources: list[TurnSource]


@dataclass(frozen=True)
class ConversationDetail:
    conversation: ConversationRecord
    turns: list[TurnView]


class ConversationService:
    def __init__(self, catalog: Catalog) -> None:
        self._catalog = catalog
        self._store = catalog.conversations

    def open(self, conversation_id: str | None, owner: str | None) -> ConversationContext:
        """The context of a question: None or "new" starts a conversation, an id continues one (its turns
        become the history). Raises ConversationNotFound for an id this owner does not have."""
        if conversation_id is None or conversation_id == NEW_CONVERSATION:
            return ConversationContext(conversation_id=str(uuid.uuid4()), owner=owner, is_new=True)
        record = self._store.get(conversation_id, owner)
        if record is None:
            raise ConversationNotFound(f"no conversation {conversation_id!r}")
        history = tuple(Turn(t.question, t.answer) for t in self._store.turns(record.id))
        return ConversationContext(conversation_id=record.id, owner=owner, history=history)

    def record(self, context: ConversationContext, turn: NewTurn) -> bool:
        """Append a finished turn; False (logged) when the conversation was deleted meanwhile."""
        if context.conversation_id is None:
            return False
        if context.is_new and self._store.get(context.conversation_id, context.owner) is None:
            self._store.create(context.owner, turn.question, conversation_id=context.conversation_id)
        if self._store.add_turn(context.conversation_id, turn) is None:
            logger.info("conversation %s was deleted before its turn finished", context.conversation_id)
            return False
        return True

    def page(self, owner: str | None, offset: int, limit: int) -> ConversationPage:
        return self._store.page(owner, offset=offset, limit=limit)

    def detail(self, conversation_id: str, owner: str | None) -> ConversationDetail:
        record = self._store.get(conversation_id, owner)
        if record is None:
            raise ConversationNotFound(f"no conversation {conversation_id!r}")
        turns = self._store.turns(record.id)
        chunk_ids = sorted({i for t in turns for i in t.source_chunk_ids})
        chunks = self._catalog.chunks_by_ids(chunk_ids) if chunk_ids else {}
        views = []
        for t in turns:
            sources = [
                TurnSource(rank=rank, chunk_id=c.id, document_id=c.document_id, title=c.title, page=c.page)
                for rank, c in ((r, chunks.get(i)) for r, i in enumerate(t.source_chunk_ids, start=1))
                if c is not None
            ]
            views.append(TurnView(turn=t, sources=sources))
        return ConversationDetail(conversation=record, turns=views)

    def delete(self, conversation_id: str, owner: str | None) -> None:
        if not self._store.delete(conversation_id, owner):
            raise ConversationNotFound(f"no conversation {conversation_id!r}")

    def counts(self) -> ConversationCounts:
        return self._store.counts()
