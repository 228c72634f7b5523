"""`ConversationStore`: the catalog's conversations and their turns, as typed records.

Reached as `Catalog.conversations`. A conversation belongs to an owner (the hash of the API key that
created it, or None for requests without a key) and records the collections its turns searched; every
read and delete is scoped to the owner and to the collections the caller may read (`Scope`), so another
owner's conversation, or one over a collection the caller may no longer read, is "not found", like an
unknown id. Conversations without an owner are never listed: only their (random) id reaches them.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import delete, func, select, update

from app.catalog.models import ConversationRow, TurnRow, utcnow
from app.catalog.records import from_row
from app.catalog.sessions import SessionStore

TITLE_CHARS = 512

Scope = frozenset[str] | None  # collections a caller may read, or a turn searched; None: every collection


def within(collections: Scope, scope: Scope) -> bool:
    """True when a conversation over `collections` may be shown to a caller reading `scope`."""
    if scope is None:
        return True
    return collections is not None and collections <= scope


def widened(collections: Scope, more: Scope) -> Scope:
    """The collections of a conversation after a turn over `more`."""
    if collections is None or more is None:
        return None
    return collections | more


@dataclass(frozen=True)
class ConversationRecord:
    id: str
    owner: str | None
    title: str  # the first question (cut to TITLE_CHARS)
    num_turns: int
    collections: Scope  # what its turns searched; None: every collection
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True)
class NewTurn:
    question: str
    answer: str
    source_chunk_ids: list[int]
    mode: str
    selector: str | None
    recompute_ratio: float
    timings: dict[str, Any] = field(default_factory=dict)
    usage: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class TurnRecord(NewTurn):
    """A stored turn: what was recorded, where it stands in its conversation and when."""

    index: int  # 0-based, in the order asked
    created_at: datetime


@dataclass(frozen=True)
class ConversationPage:
    total: int  # the owner's conversations, over all pages
    conversations: list[ConversationRecord]


@dataclass(frozen=True)
class ConversationCounts:
    num_conversations: int
    num_turns: int


def _conversation(row: ConversationRow) -> ConversationRecord:
    return from_row(
        ConversationRecord, row, collections=None if row.collections is None else frozenset(row.collections)
    )


def _stored(collections: Scope) -> list[str] | None:
    return None if collections is None else sorted(collections)


def _turn(row: TurnRow) -> TurnRecord:
    return from_row(
        TurnRecord,
        row,
        source_chunk_ids=[int(i) for i in row.source_chunk_ids or []],
        recompute_ratio=float(row.recompute_ratio),
        timings=dict(row.timings or {}),
        usage=dict(row.usage or {}),
    )


def _owned(owner: str | None):  # type: ignore[no-untyped-def]
    return ConversationRow.owner.is_(None) if owner is None else ConversationRow.owner == owner


class ConversationStore(SessionStore):
    """Thread-safe (one short session per call), like `Catalog`."""

    def create(
        self, owner: str | None, title: str, collections: Scope, conversation_id: str | None = None
    ) -> ConversationRecord:
        now = utcnow()
        row = ConversationRow(
            id=conversation_id or str(uuid.uuid4()),
            owner=owner,
            title=" ".join(title.split())[:TITLE_CHARS] or "(untitled)",
            num_turns=0,
            collections=_stored(collections),
            created_at=now,
            updated_at=now,
        )
        with self._session() as s:
            s.add(row)
            s.flush()
            return _conversation(row)

    def get(self, conversation_id: str, owner: str | None, scope: Scope) -> ConversationRecord | None:
        """The owner's conversation, if the caller may read every collection it was asked over."""
        with self._session() as s:
            row = s.scalar(select(ConversationRow).where(ConversationRow.id == conversation_id, _owned(owner)))
            record = None if row is None else _conversation(row)
            return record if record is not None and within(record.collections, scope) else None

    def turns(self, conversation_id: str) -> list[TurnRecord]:
        """The turns in the order they were asked."""
        with self._session() as s:
            rows = s.scalars(
                select(TurnRow).where(TurnRow.conversation_id == conversation_id).order_by(TurnRow.index)
            ).all()
            return [_turn(r) for r in rows]

    def all_turn_texts(self) -> list[tuple[str, str]]:
        """(question, answer) of every stored turn, of every owner: what names the turn KV entries on disk
        (`blendrag doctor` keeps those)."""
        with self._session() as s:
            return [(q, a) for q, a in s.execute(select(TurnRow.question, TurnRow.answer)).all()]

    def add_turn(self, conversation_id: str, turn: NewTurn, searched: Scope) -> TurnRecord | None:
        """Append a turn that searched `searched` (the conversation's collections widen by it); None when
        the conversation is gone (deleted while the answer was generated)."""
        with self._session() as s:
            # The row lock orders two turns finishing at once on PostgreSQL; SQLite has one writer anyway.
            row = s.scalar(select(ConversationRow).where(ConversationRow.id == conversation_id).with_for_update())
            if row is None:
                return None
            now = utcnow()
            turn_row = TurnRow(
                conversation_id=conversation_id,
                index=row.num_turns,
                question=turn.question,
                answer=turn.answer,
                source_chunk_ids=list(turn.source_chunk_ids),
                mode=turn.mode,
                selector=turn.selector,
                recompute_ratio=float(turn.recompute_ratio),
                timings=dict(turn.timings),
                usage=dict(turn.usage),
                created_at=now,
            )
            s.add(turn_row)
            s.execute(
                update(ConversationRow)
                .where(ConversationRow.id == conversation_id)
                .values(
                    num_turns=row.num_turns + 1,
                    updated_at=now,
                    collections=_stored(widened(_conversation(row).collections, searched)),
                )
            )
            s.flush()
            return _turn(turn_row)

    def page(self, owner: str | None, scope: Scope, offset: int = 0, limit: int = 20) -> ConversationPage:
        """The owner's conversations the caller may read, the most recently continued first. Conversations
        without an owner are listed to nobody (every caller without a key is that "owner")."""
        if owner is None:
            return ConversationPage(total=0, conversations=[])
        with self._session() as s:
            rows = s.scalars(
                select(ConversationRow)
                .where(_owned(owner))
                .order_by(ConversationRow.updated_at.desc(), ConversationRow.created_at.desc(), ConversationRow.id)
            ).all()
            # Filtered here, not in SQL: "a subset of the caller's collections" over a JSON list differs per
            # backend, and one owner's conversations are few.
            visible = [c for c in map(_conversation, rows) if within(c.collections, scope)]
            return ConversationPage(total=len(visible), conversations=visible[offset : offset + limit])

    def of_ids(self, conversation_ids: list[str], owner: str | None, scope: Scope) -> list[ConversationRecord]:
        """Those of `conversation_ids` the caller may open (how a client without a key lists the ones it
        started, by their ids), the most recently continued first."""
        if not conversation_ids:
            return []
        with self._session() as s:
            rows = s.scalars(
                select(ConversationRow)
                .where(ConversationRow.id.in_(conversation_ids), _owned(owner))
                .order_by(ConversationRow.updated_at.desc(), ConversationRow.created_at.desc(), ConversationRow.id)
            ).all()
            return [c for c in map(_conversation, rows) if within(c.collections, scope)]

    def delete(self, conversation_id: str, owner: str | None, scope: Scope) -> bool:
        """Delete a conversation and its turns; False when the caller may not see it (see `get`)."""
        with self._session() as s:
            row = s.scalar(select(ConversationRow).where(ConversationRow.id == conversation_id, _owned(owner)))
            if row is None or not within(_conversation(row).collections, scope):
                return False
            s.execute(delete(TurnRow).where(TurnRow.conversation_id == conversation_id))
            s.execute(delete(ConversationRow).where(ConversationRow.id == conversation_id))
            return True

    def counts(self) -> ConversationCounts:
        """Over every owner (the admin page)."""
        with self._session() as s:
            num_conversations = s.scalar(select(func.count()).select_from(ConversationRow)) or 0
            num_turns = s.scalar(select(func.count()).select_from(TurnRow)) or 0
            return ConversationCounts(num_conversations=int(num_conversations), num_turns=int(num_turns))
