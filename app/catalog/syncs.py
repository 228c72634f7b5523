"""`SyncStore`: the folders `blendrag sync` keeps collections equal to (`folder_syncs`), as typed records.

Reached as `Catalog.syncs`. One row per collection: a collection follows one folder, so two folders never
remove each other's documents.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import delete, select

from app.catalog.models import FolderSyncRow, utcnow
from app.catalog.records import from_row
from app.catalog.sessions import SessionStore


@dataclass(frozen=True)
class FolderSyncRecord:
    collection: str
    folder: str  # the synced folder's absolute path on the machine that ran the sync
    synced_at: datetime
    created_at: datetime
    changes: dict[str, int] = field(default_factory=dict)  # added, changed, removed, unchanged, failed, skipped


def _sync(row: FolderSyncRow) -> FolderSyncRecord:
    return from_row(FolderSyncRecord, row, changes=dict(row.changes or {}))


class SyncStore(SessionStore):
    def get(self, collection: str) -> FolderSyncRecord | None:
        with self._session() as s:
            row = s.get(FolderSyncRow, collection)
            return _sync(row) if row is not None else None

    def record(self, collection: str, folder: str, changes: dict[str, int]) -> FolderSyncRecord:
        """The sync of `folder` into `collection` that just finished (the folder a collection follows is
        replaced only when the caller chose to)."""
        with self._session() as s:
            row = s.get(FolderSyncRow, collection)
            if row is None:
                row = FolderSyncRow(collection=collection, created_at=utcnow())
                s.add(row)
            row.folder = folder
            row.changes = dict(changes)
            row.synced_at = utcnow()
            s.flush()
            return _sync(row)

    def all(self, collections: Collection[str] | None = None) -> list[FolderSyncRecord]:
        """The synced folders (of `collections`; None: all), most recently synced first."""
        with self._session() as s:
            q = select(FolderSyncRow).order_by(FolderSyncRow.synced_at.desc(), FolderSyncRow.collection)
            if collections is not None:
                q = q.where(FolderSyncRow.collection.in_(list(collections)))
            return [_sync(r) for r in s.scalars(q)]

    def forget(self, collection: str) -> bool:
        """The collection follows no folder any more (it was deleted)."""
        with self._session() as s:
            result = s.execute(delete(FolderSyncRow).where(FolderSyncRow.collection == collection))
            return bool(result.rowcount)  # type: ignore[attr-defined]
