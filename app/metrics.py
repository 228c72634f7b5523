"""Prometheus metrics, one registry per app instance (no process-global state, so tests can build many)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

TTFT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 8.0, 13.0, 20.0, 30.0, 60.0)


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("blendrag_http_requests_total", "HTTP requests by route and status",
                                ["route", "method", "status"], registry=r)
        self.ttft = Histogram("blendrag_ttft_seconds", "Time to first token by mode", ["mode"],
                              buckets=TTFT_BUCKETS, registry=r)
        self.total = Histogram("blendrag_request_seconds", "Whole answer time by mode", ["mode"],
                               buckets=TTFT_BUCKETS, registry=r)
        self.recompute_ratio = Histogram("blendrag_recompute_ratio", "Share of context tokens recomputed",
                                         buckets=(0.0, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0), registry=r)
        self.asks = Counter("blendrag_asks_total", "Answered questions by mode and outcome",
                            ["mode", "outcome"], registry=r)
        self.kv_lookups = Counter("blendrag_ask_kv_lookups_total", "Chunk KV lookups at ask time",
                                  ["result"], registry=r)
        self.kv_tier_hits = Gauge("blendrag_kv_hits", "KV store hits per tier (since start)", ["tier"],
                                  registry=r)
        self.kv_tier_misses = Gauge("blendrag_kv_misses", "KV store misses per tier (since start)", ["tier"],
                                    registry=r)
        self.kv_tier_bytes = Gauge("blendrag_kv_bytes", "Bytes held per KV tier", ["tier"], registry=r)
        self.kv_tier_entries = Gauge("blendrag_kv_entries", "Entries held per KV tier", ["tier"], registry=r)
        self.kv_faults = Gauge("blendrag_kv_faults", "KV store faults per tier", ["tier"], registry=r)
        self.ingest_chunks = Counter("blendrag_ingest_chunks_total", "Chunks committed by ingest", registry=r)
        self.ingest_seconds = Counter("blendrag_ingest_seconds_total", "Seconds spent in ingest jobs",
                                      registry=r)
        self.queue_depth = Gauge("blendrag_engine_queue_depth", "Requests waiting or running in the engine",
                                 registry=r)

    def render(self) -> bytes:
        return generate_latest(self.registry)
