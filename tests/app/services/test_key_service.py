"""KeyService on a real SQLite catalog: secrets shown once and stored hashed, cached lookups that expire
within `key_cache_s`, `last_used_at` written at most every 30 s."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text

from app.catalog import Catalog
from app.services.key_service import LAST_USED_EVERY_S, KeyRequestError, KeyService


@pytest.fixture
def catalog(tmp_path: Path) -> Iterator[Catalog]:
    c = Catalog(f"sqlite:///{tmp_path / 'catalog.db'}")
    yield c
    c.close()


def test_the_secret_is_stored_only_as_its_hash(catalog: Catalog) -> None:
    service = KeyService(catalog.keys)
    created = service.create("  team A ", ["b", "a", "a"], can_ingest=True)
    assert created.secret.startswith("brk_") and len(created.secret) == 4 + 43
    record = created.record
    assert (record.name, record.collections, record.can_ingest) == ("team A", ("a", "b"), True)
    assert record.key_hash == hashlib.sha256(created.secret.encode()).hexdigest()
    with catalog.engine.connect() as conn:
        dumped = " ".join(str(v) for row in conn.execute(text("SELECT * FROM api_keys")) for v in row)
    assert created.secret not in dumped
    assert service.authenticate(created.secret).id == record.id
    assert service.authenticate(created.secret + "x") is None
    assert service.authenticate("not-a-key") is None


def test_a_revoked_key_is_refused_once_the_cache_expires(catalog: Catalog) -> None:
    now = [100.0]
    replica_a = KeyService(catalog.keys, cache_s=0.5, clock=lambda: now[0])
    replica_b = KeyService(catalog.keys, cache_s=0.5, clock=lambda: now[0])
    secret = replica_a.create("t", ["c"], can_ingest=False).secret
    assert replica_b.authenticate(secret) is not None and replica_b.any_keys()
    assert replica_a.revoke(replica_a.list()[0].id)
    assert replica_a.authenticate(secret) is None  # at once where it was revoked
    now[0] += 0.4
    assert replica_b.authenticate(secret) is not None  # B's lookup is still fresh
    now[0] += 0.2
    assert replica_b.authenticate(secret) is None and not replica_b.any_keys()
    assert not replica_a.revoke("no-such-id")


def test_last_used_is_written_at_most_every_30_seconds(catalog: Catalog) -> None:
    now = [0.0]
    service = KeyService(catalog.keys, cache_s=0, clock=lambda: now[0])
    created = service.create("t", ["c"], can_ingest=False)
    assert created.record.last_used_at is None
    service.authenticate(created.secret)
    first = catalog.keys.get(created.record.id).last_used_at
    assert first is not None
    now[0] += LAST_USED_EVERY_S - 1
    service.authenticate(created.secret)
    assert catalog.keys.get(created.record.id).last_used_at == first
    now[0] += 2
    service.authenticate(created.secret)
    assert catalog.keys.get(created.record.id).last_used_at > first


@pytest.mark.parametrize(
    ("name", "collections", "message"),
    [
        ("", ["a"], "name: 1-128 characters"),
        ("x", [], "collections: a key needs at least one collection"),
        ("x", ["has space"], "collection 'has space': use 1-64 letters"),
        ("x", ["-lead"], "collection '-lead': use 1-64 letters"),
    ],
)
def test_bad_keys_are_refused(catalog: Catalog, name: str, collections: list[str], message: str) -> None:
    with pytest.raises(KeyRequestError, match=message):
        KeyService(catalog.keys).create(name, collections, can_ingest=False)
    assert catalog.keys.count() == 0
