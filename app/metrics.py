"""Prometheus metrics, one registry per app instance (no process-global state, so tests can build many).

Three kinds of numbers live here:
- counters and histograms the app updates as things happen (requests, TTFT, asks, ingest);
- gauges copied from other components when Prometheus scrapes (`refresh`): KV store per-tier counters,
  which the store keeps itself, and the engine queue depth;
- `RecentAsks`, a bounded ring buffer of the last answers that the admin page plots (TTFT by mode).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Annotated, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from pydantic import Field

if TYPE_CHECKING:
    from kvcache.stats import StoreStats

TTFT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 8.0, 13.0, 20.0, 30.0, 60.0)
RECENT_ASKS = 200


@dataclass(frozen=True)
class RecentAsk:
    """One answered question, as the admin page plots it."""

    at: float  # unix time the answer finished
    mode: str
    selector: str | None  # blend's token selector, None for other modes
    ttft_ms: float
    total_ms: float
    recompute_ratio: float
    kv_hits: int
    kv_misses: int
    num_prompt_tokens: int
    num_completion_tokens: int
    full_prefill_estimate_ms: float | None
    # 0: nothing was retrieved (an answer from the model alone). /api/stats serves this type as it is, so
    # the description is its schema's.
    num_context_tokens: Annotated[
        int, Field(description="Context tokens in the prompt; 0 for an answer without documents")
    ]


class RecentAsks:
    """Thread-safe ring buffer of the last `maxlen` answers (oldest dropped first)."""

    def __init__(self, maxlen: int = RECENT_ASKS) -> None:
        self._items: deque[RecentAsk] = deque(maxlen=maxlen)
        self._lock = threading.Lock()

    def add(self, item: RecentAsk) -> None:
        with self._lock:
            self._items.append(item)

    def snapshot(self) -> list[RecentAsk]:
        with self._lock:
            return list(self._items)

    def to_dicts(self) -> list[dict[str, Any]]:
        return [asdict(i) for i in self.snapshot()]


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.recent = RecentAsks()
        r = self.registry
        self.requests = Counter(
            "blendrag_http_requests_total",
            "HTTP requests by route template and status",
            ["route", "method", "status"],
            registry=r,
        )
        self.request_seconds = Histogram(
            "blendrag_http_request_seconds",
            "HTTP handling time (streams: until the last byte)",
            ["route", "method"],
            registry=r,
        )
        self.ttft = Histogram(
            "blendrag_ttft_seconds", "Time to first token by mode", ["mode"], buckets=TTFT_BUCKETS, registry=r
        )
        self.total = Histogram(
            "blendrag_request_seconds", "Whole answer time by mode", ["mode"], buckets=TTFT_BUCKETS, registry=r
        )
        self.recompute_ratio = Histogram(
            "blendrag_recompute_ratio",
            "Share of context tokens recomputed",
            buckets=(0.0, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0),
            registry=r,
        )
        self.asks = Counter(
            "blendrag_asks_total", "Answered questions by mode and outcome", ["mode", "outcome"], registry=r
        )
        self.history_tokens = Counter(
            "blendrag_history_tokens_total", "Tokens of conversations' earlier turns placed in prompts", registry=r
        )
        self.history_reused_tokens = Counter(
            "blendrag_history_reused_tokens_total",
            "Of those, the tokens whose KV came from the store (the rest were computed at question time)",
            registry=r,
        )
        self.kv_lookups = Counter(
            "blendrag_ask_kv_lookups_total", "Chunk KV lookups at ask time", ["result"], registry=r
        )
        self.kv_tier_hits = Gauge("blendrag_kv_hits", "KV store hits per tier (since start)", ["tier"], registry=r)
        self.kv_tier_misses = Gauge(
            "blendrag_kv_misses", "KV store misses per tier (since start)", ["tier"], registry=r
        )
        self.kv_tier_bytes = Gauge("blendrag_kv_bytes", "Bytes held per KV tier", ["tier"], registry=r)
        self.kv_tier_entries = Gauge("blendrag_kv_entries", "Entries held per KV tier", ["tier"], registry=r)
        self.kv_faults = Gauge("blendrag_kv_faults", "KV store faults per tier", ["tier"], registry=r)
        self.ingest_chunks = Counter("blendrag_ingest_chunks_total", "Chunks committed by ingest", registry=r)
        self.ingest_seconds = Counter("blendrag_ingest_seconds_total", "Seconds spent in ingest jobs", registry=r)
        self.queue_depth = Gauge("blendrag_engine_queue_depth", "Requests waiting or running in the engine", registry=r)
        self.process_rss = Gauge("blendrag_process_rss_bytes", "Resident memory of the server process", registry=r)

    def refresh(self, store_stats: StoreStats | None, queue_depth: int | None) -> None:
        """Copy numbers other components own into gauges; called at scrape time."""
        if store_stats is not None:
            for tier in store_stats.tiers:
                self.kv_tier_hits.labels(tier.name).set(tier.num_hits)
                self.kv_tier_misses.labels(tier.name).set(tier.num_misses)
                self.kv_tier_bytes.labels(tier.name).set(tier.num_bytes)
                self.kv_tier_entries.labels(tier.name).set(tier.num_entries)
                self.kv_faults.labels(tier.name).set(tier.num_faults)
        if queue_depth is not None:
            self.queue_depth.set(queue_depth)
        from app.memory import rss_bytes

        rss = rss_bytes()
        if rss is not None:
            self.process_rss.set(rss)

    def render(self) -> bytes:
        return generate_latest(self.registry)


Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

UNMATCHED_ROUTE = "<unmatched>"


class RequestMetricsMiddleware:
    """Counts every HTTP request by route *template* (`/documents/{document_id}`, never the raw path, so
    ids cannot blow up the label set) and status. Pure ASGI so streamed responses pass through untouched."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500  # what the client sees if the app raises before answering
        started = time.perf_counter()

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            # The router writes the matched route into this same scope dict.
            route = scope.get("route")
            template = getattr(route, "path", None) or UNMATCHED_ROUTE
            method = scope.get("method", "")
            self.metrics.requests.labels(template, method, str(status)).inc()
            self.metrics.request_seconds.labels(template, method).observe(time.perf_counter() - started)
