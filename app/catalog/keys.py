"""`KeyStore`: the catalog's collection keys (`api_keys`), as typed records.

Reached as `Catalog.keys`. A key is stored as the SHA-256 of its secret; the secret itself is never
written anywhere (the admin is shown it once, when it is made).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import delete, func, select, update

from app.catalog.models import ApiKeyRow, utcnow
from app.catalog.records import from_row
from app.catalog.sessions import SessionStore


@dataclass(frozen=True)
class KeyRecord:
    id: str
    name: str
    key_hash: str  # hex SHA-256 of the secret
    collections: tuple[str, ...]
    can_ingest: bool
    created_at: datetime
    last_used_at: datetime | None


def _key(row: ApiKeyRow) -> KeyRecord:
    return from_row(KeyRecord, row, collections=tuple(row.collections or ()), can_ingest=bool(row.can_ingest))


class KeyStore(SessionStore):
    def create(self, name: str, key_hash: str, collections: list[str], can_ingest: bool) -> KeyRecord:
        with self._session() as s:
            row = ApiKeyRow(
                id=str(uuid.uuid4()),
                name=name,
                key_hash=key_hash,
                collections=sorted(set(collections)),
                can_ingest=can_ingest,
                created_at=utcnow(),
            )
            s.add(row)
            s.flush()
            return _key(row)

    def by_hash(self, key_hash: str) -> KeyRecord | None:
        with self._session() as s:
            row = s.scalars(select(ApiKeyRow).where(ApiKeyRow.key_hash == key_hash)).first()
            return _key(row) if row is not None else None

    def get(self, key_id: str) -> KeyRecord | None:
        with self._session() as s:
            row = s.get(ApiKeyRow, key_id)
            return _key(row) if row is not None else None

    def all(self) -> list[KeyRecord]:
        with self._session() as s:
            return [_key(r) for r in s.scalars(select(ApiKeyRow).order_by(ApiKeyRow.created_at, ApiKeyRow.id))]

    def count(self) -> int:
        with self._session() as s:
            return int(s.scalar(select(func.count()).select_from(ApiKeyRow)) or 0)

    def delete(self, key_id: str) -> bool:
        with self._session() as s:
            return bool(s.execute(delete(ApiKeyRow).where(ApiKeyRow.id == key_id)).rowcount)  # type: ignore[attr-defined]

    def touch(self, key_id: str, at: datetime) -> None:
        with self._session() as s:
            s.execute(update(ApiKeyRow).where(ApiKeyRow.id == key_id).values(last_used_at=at))
