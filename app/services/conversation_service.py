"""ConversationService: the stored conversations of /ask (and of /v1 with a `conversation_id`).

A question asked in a conversation gets the conversation's earlier turns as its history (the prompt
holds them, retrieval reads their questions); when its answer is done, the turn is appended. Every
conversation has an owner — the hash of the API key that created it, None for requests without a
key — and the collections its turns searched. It is invisible (404, like an unknown id) to any other
owner and to a caller that may not read all of those collections, so a narrowed or revoked grant
narrows what a key sees. Conversations without an owner are never listed: their random id is what
reaches them (the chat page remembers the ones it started).
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
    Scope,
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
    searched: Scope = None  # the collections this turn searches (the conversation's widen by them)
    source_ids: tuple[tuple[int, ...], ...] = ()  # each earlier turn's source chunk ids, as `history`


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

    def open(
        self, conversation_id: str | None, owner: str | None, readable: Scope, searched: Scope
    ) -> ConversationContext:
        """The context of a question searching `searched`, asked by a caller who may read `readable`: None
        or "new" starts a conversation, an id continues one (its turns become the history). Raises
        ConversationNotFound for an id this caller may not open."""
        if conversation_id is None or conversation_id == NEW_CONVERSATION:
            return ConversationContext(conversation_id=str(uuid.uuid4()), owner=owner, is_new=True, searched=searched)
        record = self._store.get(conversation_id, owner, readable)
        if record is None:
            raise ConversationNotFound(f"no conversation {conversation_id!r}")
        turns = self._store.turns(record.id)
        return ConversationContext(
            conversation_id=record.id,
            owner=owner,
            history=tuple(Turn(t.question, t.answer) for t in turns),
            searched=searched,
            source_ids=tuple(tuple(t.source_chunk_ids) for t in turns),
        )

    def record(self, context: ConversationContext, turn: NewTurn) -> bool:
        """Append a finished turn; False (logged) when the conversation was deleted meanwhile."""
        if context.conversation_id is None:
            return False
        if context.is_new and self._store.get(context.conversation_id, context.owner, None) is None:
            self._store.create(context.owner, turn.question, context.searched, conversation_id=context.conversation_id)
        if self._store.add_turn(context.conversation_id, turn, context.searched) is None:
            logger.info("conversation %s was deleted before its turn finished", context.conversation_id)
            return False
        return True

    def page(self, owner: str | None, readable: Scope, offset: int, limit: int) -> ConversationPage:
        return self._store.page(owner, readable, offset=offset, limit=limit)

    def of_ids(self, conversation_ids: list[str], owner: str | None, readable: Scope) -> list[ConversationRecord]:
        return self._store.of_ids(conversation_ids, owner, readable)

    def detail(self, conversation_id: str, owner: str | None, readable: Scope) -> ConversationDetail:
        record = self._store.get(conversation_id, owner, readable)
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

    def delete(self, conversation_id: str, owner: str | None, readable: Scope) -> None:
        if not self._store.delete(conversation_id, owner, readable):
            raise ConversationNotFound(f"no conversation {conversation_id!r}")

    def counts(self) -> ConversationCounts:
        return self._store.counts()
