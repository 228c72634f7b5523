"""Per-client rate limits: a token bucket per client.

The question routes (/ask, /v1/chat/completions): a client is its API key when it presents the *valid*
one, else its IP address (a made-up key per request must not buy a fresh bucket). Each bucket holds
`server.ask_burst` requests and refills at `server.ask_rate_per_minute`; an empty bucket answers 429 with
Retry-After (seconds until one refills). A wrong key is a 401 on every route, and wrong keys are limited
per IP address too (`server.wrong_key_per_minute`, `server.wrong_key_burst`): past that, 429.

The IP address is the TCP peer's, or the one named by X-Forwarded-For when the peer is listed in
`server.forwarded_allow_ips` (loopback by default; see app/main.py).
"""

from __future__ import annotations

import hashlib
import math
import threading
import time
from dataclasses import dataclass

MAX_BUCKETS = 10_000  # past this many clients, full (idle) buckets are forgotten


@dataclass
class _Bucket:
    tokens: float
    updated: float


class RateLimiter:
    def __init__(self, per_minute: float, burst: int, clock=time.monotonic) -> None:  # type: ignore[no-untyped-def]
        self.rate_per_s = per_minute / 60.0
        self.burst = burst
        self._clock = clock
        self._buckets: dict[str, _Bucket] = {}
        self._lock = threading.Lock()

    def acquire(self, client: str) -> float | None:
        """Take one request from `client`'s bucket: None if allowed, else seconds until one is available."""
        now = self._clock()
        with self._lock:
            bucket = self._buckets.get(client)
            if bucket is None:
                if len(self._buckets) >= MAX_BUCKETS:
                    self._forget_full(now)
                bucket = self._buckets[client] = _Bucket(float(self.burst), now)
            bucket.tokens = min(float(self.burst), bucket.tokens + (now - bucket.updated) * self.rate_per_s)
            bucket.updated = now
            if bucket.tokens >= 1.0:
                bucket.tokens -= 1.0
                return None
            return (1.0 - bucket.tokens) / self.rate_per_s if self.rate_per_s > 0 else math.inf

    def _forget_full(self, now: float) -> None:
        for client in [
            c for c, b in self._buckets.items() if b.tokens + (now - b.updated) * self.rate_per_s >= self.burst
        ]:
            del self._buckets[client]


def client_id(api_key: str | None, host: str | None) -> str:
    """The bucket of a request: a hash of its (valid) key (never the key itself), else its IP address."""
    if api_key:
        return "key:" + hashlib.sha256(api_key.encode()).hexdigest()[:16]
    return f"ip:{host or 'unknown'}"
