"""KeyService: collection keys made by the admin, and who a presented key is.

A key's secret is `brk_` + 32 random bytes (URL-safe base64), shown once when it is made; the catalog
keeps only its SHA-256, compared in constant time. Lookups are cached for at most `server.key_cache_s`
(a revoked key is refused by every replica within that, since each re-reads the shared catalog), and a
key's `last_used_at` is written at most every `LAST_USED_EVERY_S`, so asking does not write the catalog
on every request.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from app.catalog.keys import KeyRecord, KeyStore
from app.catalog.models import utcnow

logger = logging.getLogger(__name__)

SECRET_PREFIX = "brk_"
SECRET_BYTES = 32
LAST_USED_EVERY_S = 30.0
COLLECTION_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
_COLLECTION = re.compile(COLLECTION_PATTERN)


class KeyRequestError(ValueError):
    """A key that cannot be made as asked (HTTP 422 / CLI exit 2)."""


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def check_collection(name: str) -> str:
    """A collection name: 1–64 letters, digits, `_`, `.` or `-`, starting with a letter or digit."""
    if not _COLLECTION.match(name):
        raise KeyRequestError(
            f"collection {name[:80]!r}: use 1-64 letters, digits, '_', '.' or '-', starting with a letter or digit"
        )
    return name


@dataclass(frozen=True)
class CreatedKey:
    record: KeyRecord
    secret: str  # shown once, never stored


@dataclass
class _Cached:
    record: KeyRecord | None
    fetched_at: float


class KeyService:
    def __init__(self, store: KeyStore, cache_s: float = 0.5, clock: Callable[[], float] = time.monotonic) -> None:
        self._store = store
        self._cache_s = cache_s
        self._clock = clock
        self._lock = threading.Lock()
        self._by_hash: dict[str, _Cached] = {}
        self._count: tuple[int, float] | None = None
        self._touched: dict[str, float] = {}

    # ---- admin -------------------------------------------------------------------------------------

    def create(self, name: str, collections: Sequence[str], can_ingest: bool) -> CreatedKey:
        name = name.strip()
        if not name or len(name) > 128:
            raise KeyRequestError("name: 1-128 characters")
        if not collections:
            raise KeyRequestError("collections: a key needs at least one collection")
        for collection in collections:
            check_collection(collection)
        secret = SECRET_PREFIX + secrets.token_urlsafe(SECRET_BYTES)
        record = self._store.create(name, hash_secret(secret), list(collections), can_ingest)
        self._forget()
        logger.info("key %s (%s) made for collections %s", record.id, record.name, ", ".join(record.collections))
        return CreatedKey(record=record, secret=secret)

    def list(self) -> list[KeyRecord]:
        return self._store.all()

    def revoke(self, key_id: str) -> bool:
        """Delete a key: refused at once here, by other replicas within `key_cache_s`."""
        removed = self._store.delete(key_id)
        self._forget()
        if removed:
            logger.info("key %s revoked", key_id)
        return removed

    # ---- requests ----------------------------------------------------------------------------------

    def authenticate(self, secret: str) -> KeyRecord | None:
        """The key whose secret this is (None: no such key, or revoked)."""
        if not secret.startswith(SECRET_PREFIX):
            return None
        digest = hash_secret(secret)
        now = self._clock()
        with self._lock:
            cached = self._by_hash.get(digest)
        if cached is None or now - cached.fetched_at > self._cache_s:
            record = self._store.by_hash(digest)
            cached = _Cached(record, now)
            with self._lock:
                if len(self._by_hash) > 10_000:
                    self._by_hash.clear()
                self._by_hash[digest] = cached
        record = cached.record
        # The lookup is by hash; compare again in constant time so timing never depends on the digest.
        if record is None or not hmac.compare_digest(record.key_hash, digest):
            return None
        self._note_use(record, now)
        return record

    def any_keys(self) -> bool:
        """Whether any collection key exists (then anonymous questions need `server.public_collections`)."""
        now = self._clock()
        with self._lock:
            cached = self._count
        if cached is None or now - cached[1] > self._cache_s:
            cached = (self._store.count(), now)
            with self._lock:
                self._count = cached
        return cached[0] > 0

    def _note_use(self, record: KeyRecord, now: float) -> None:
        with self._lock:
            last = self._touched.get(record.id)
            if last is not None and now - last < LAST_USED_EVERY_S:
                return
            self._touched[record.id] = now
        try:
            self._store.touch(record.id, utcnow())
        except Exception:  # a catalog hiccup must not refuse a valid key
            logger.warning("could not record the use of key %s", record.id, exc_info=True)

    def _forget(self) -> None:
        with self._lock:
            self._by_hash.clear()
            self._count = None
