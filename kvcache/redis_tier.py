"""Optional remote tier in Redis, shared by replicas: one string value per entry (its safetensors bytes).

Redis key = `key_prefix + entry key`, written with `SET ... EX ttl` and read with `GETEX ... EX ttl`, so
entries in use never expire while unused ones age out; the memory budget is Redis's own (`maxmemory`,
`allkeys-lru`). Values larger than `max_entry_bytes` are refused (`num_rejected`).

Never raises for Redis trouble: a connection error or timeout counts a fault ("unavailable"), logs one
warning per outage, and makes the tier answer "not here" / "not stored" without trying Redis again for
`retry_after_s` (so a dead Redis costs one timeout, not one per request). The client is created lazily
by redis-py and reconnects by itself once Redis is back.

`RedisTier(url, *, key_prefix, ttl_s, timeout_s, retry_after_s, max_entry_bytes)`:
`get_bytes(key) -> bytes | None`, `get_many_bytes(keys) -> dict[str, bytes]` (one round trip),
`put_bytes(key, data, *, overwrite=False) -> bool`, `contains(key)`, `nbytes_many(keys) -> dict[str,
int]`, `delete(key) -> bool`, `remove_corrupt(key, exc)`, `keys()`, `ping() -> bool`, `available`,
`stats()`, `close()`. Thread-safe (redis-py's connection pool).
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import redis
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from kvcache.errors import KVEntryCorrupt
from kvcache.keys import check_key, is_valid_key
from kvcache.stats import TierCounters, TierStats

logger = logging.getLogger(__name__)

T = TypeVar("T")
_OUTAGE_ERRORS = (RedisConnectionError, RedisTimeoutError, OSError)


class RedisTier:
    name = "redis"

    def __init__(
        self,
        url: str,
        *,
        key_prefix: str = "blendrag:kv:",
        ttl_s: int | None = 7 * 24 * 3600,
        timeout_s: float = 1.0,
        retry_after_s: float = 5.0,
        max_entry_bytes: int = 256 * 1024 * 1024,
    ) -> None:
        self.url = url
        self.key_prefix = key_prefix
        self.ttl_s = ttl_s
        self.retry_after_s = retry_after_s
        self.max_entry_bytes = max_entry_bytes
        self.counters = TierCounters()
        # No retries inside redis-py: a dead server must cost one timeout, then the back-off below.
        self._client = redis.Redis.from_url(
            url,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), 0),
            retry_on_timeout=False,
            health_check_interval=0,
        )
        self._lock = threading.Lock()
        self._down_until = 0.0
        self._in_outage = False

    # -- failure handling ----------------------------------------------------------------------------

    @property
    def available(self) -> bool:
        """False while backing off after a failure (no call to Redis is made then)."""
        with self._lock:
            return time.monotonic() >= self._down_until

    def _call(self, what: str, fn: Callable[[], T], default: T, *, count_fault: bool = True) -> T:
        if not self.available:
            return default
        try:
            result = fn()
        except _OUTAGE_ERRORS as exc:
            if count_fault:  # stats() probes without inflating the fault count
                self.counters.fault("unavailable")
            with self._lock:
                self._down_until = time.monotonic() + self.retry_after_s
                first, self._in_outage = not self._in_outage, True
            log = logger.warning if first else logger.debug
            log("redis tier: %s failed, skipping Redis for %.1f s: %s", what, self.retry_after_s, exc)
            return default
        except RedisError as exc:  # e.g. OOM refusal: Redis is up, this one command failed
            self.counters.fault("error")
            logger.warning("redis tier: %s failed: %s", what, exc)
            return default
        with self._lock:
            recovered, self._in_outage = self._in_outage, False
        if recovered:
            logger.info("redis tier: Redis at %s is reachable again", self.url)
        return result

    def _rkey(self, key: str) -> str:
        return self.key_prefix + check_key(key)

    # -- operations ----------------------------------------------------------------------------------

    def ping(self, *, count_fault: bool = True) -> bool:
        return bool(self._call("PING", lambda: self._client.ping(), False, count_fault=count_fault))

    def _get_cmd(self, pipe: redis.client.Pipeline, key: str) -> None:
        if self.ttl_s is None:
            pipe.get(self._rkey(key))
        else:
            pipe.getex(self._rkey(key), ex=self.ttl_s)  # refresh the TTL of entries in use

    def _per_key(
        self, what: str, keys: Sequence[str], command: Callable[[redis.client.Pipeline, str], object]
    ) -> tuple[list[str], list[Any] | None]:
        """`command` for each distinct key in one pipelined round trip: (the keys, their replies in order;
        None while Redis is down)."""
        unique = list(dict.fromkeys(keys))
        if not unique:
            return unique, []

        def run() -> list[Any]:
            pipe = self._client.pipeline(transaction=False)
            for key in unique:
                command(pipe, key)
            return pipe.execute()

        return unique, self._call(what, run, None)

    def get_many_bytes(self, keys: Sequence[str]) -> dict[str, bytes]:
        """Values of the keys that are present, in one round trip; {} while Redis is down."""
        unique, values = self._per_key("GET", keys, self._get_cmd)
        found: dict[str, bytes] = {}
        if values is not None:
            found = {k: v for k, v in zip(unique, values, strict=True) if isinstance(v, bytes)}
        for key in unique:
            (self.counters.hit if key in found else self.counters.miss)()
        return found

    def get_bytes(self, key: str) -> bytes | None:
        return self.get_many_bytes([key]).get(key)

    def put_bytes(self, key: str, data: bytes, *, overwrite: bool = False) -> bool:
        rkey = self._rkey(key)
        if len(data) > self.max_entry_bytes:
            self.counters.rejected()
            logger.warning("redis tier: entry %s (%d B) exceeds max_entry_bytes", key[:12], len(data))
            return False

        def run() -> bool:
            pipe = self._client.pipeline(transaction=False)
            pipe.set(rkey, data, ex=self.ttl_s, nx=not overwrite)
            if self.ttl_s is not None and not overwrite:
                pipe.expire(rkey, self.ttl_s)  # already there (NX refused): keep it alive
            pipe.execute()
            return True

        return self._call("SET", run, False)

    def nbytes_many(self, keys: Sequence[str]) -> dict[str, int]:
        """Sizes of the keys that are present (STRLEN; one round trip)."""
        unique, sizes = self._per_key("STRLEN", keys, lambda pipe, key: pipe.strlen(self._rkey(key)))
        if sizes is None:
            return {}
        return {k: int(n) for k, n in zip(unique, sizes, strict=True) if int(n) > 0}

    def contains(self, key: str) -> bool:
        return bool(self._call("EXISTS", lambda: self._client.exists(self._rkey(key)), 0))

    def delete(self, key: str) -> bool:
        return bool(self._call("DEL", lambda: self._client.delete(self._rkey(key)), 0))

    def remove_corrupt(self, key: str, exc: KVEntryCorrupt) -> None:
        self.delete(key)
        self.counters.fault(exc.kind)
        logger.warning("redis tier: removed corrupt entry %s: %s", key[:12], exc.reason)

    def keys(self) -> list[str]:
        pattern = re.sub(r"([*?\[\]\\])", r"\\\1", self.key_prefix) + "*"
        n = len(self.key_prefix)

        def run() -> list[str]:
            raw = self._client.scan_iter(match=pattern, count=1000)
            names = (r.decode("utf-8", "replace") if isinstance(r, bytes) else str(r) for r in raw)
            return [name[n:] for name in names if is_valid_key(name[n:])]

        return sorted(self._call("SCAN", run, []))

    def stats(self) -> TierStats:
        keys = self.keys() if self.ping(count_fault=False) else []
        num_bytes = sum(self.nbytes_many(keys).values()) if keys else 0
        return self.counters.snapshot(
            name=self.name, available=self.available, num_entries=len(keys), num_bytes=num_bytes, budget_bytes=None
        )

    def close(self) -> None:
        with contextlib.suppress(RedisError):  # closing a dead connection must not matter
            self._client.close()
