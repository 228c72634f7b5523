"""AskService: retrieve → load chunk KV → blend → stream, one typed event at a time.

The router turns these events into Server-Sent Events (or one JSON body); the CLI prints them.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from app.catalog.repository import ChunkRecord
from app.services.estimates import PrefillRate

if TYPE_CHECKING:
    from app.components import Components
    from app.metrics import Metrics
    from engine.scheduler import Scheduler
    from engine.types import Mode, SelectorName
    from kvcache.types import LayerKVSource

logger = logging.getLogger(__name__)


class AskValidationError(ValueError):
    """A question that cannot be asked (empty, bad ratio …): HTTP 422 / CLI exit 2."""


@dataclass(frozen=True)
class SearchFilters:
    document_ids: list[str] | None = None
    tags: list[str] | None = None


@dataclass(frozen=True)
class AskRequest:
    question: str
    top_k: int | None = None
    filters: SearchFilters = field(default_factory=SearchFilters)
    mode: Mode | None = None
    recompute_ratio: float | None = None
    selector: SelectorName | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()


@dataclass(frozen=True)
class Source:
    rank: int  # 1-based, best first: the [n] a reader cites
    chunk_id: int
    document_id: str
    title: str
    page: int | None
    score: float
    snippet: str
    text: str


@dataclass(frozen=True)
class SourcesEvent:
    sources: list[Source]
    retrieval_ms: float


@dataclass(frozen=True)
class TokenDelta:
    text: str


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    context_tokens: int
    recomputed_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class Timings:
    retrieval_ms: float
    kv_load_ms: float
    ttft_ms: float
    total_ms: float
    full_prefill_estimate_ms: float | None  # what a plain (no-reuse) prefill of this prompt would take


@dataclass(frozen=True)
class DoneEvent:
    answer: str
    mode: str
    selector: str | None  # the blend's token selector; None when the mode recomputes by rule (full, reuse…)
    recompute_ratio: float
    finish_reason: str
    usage: Usage
    timings: Timings
    kv_hits: int
    kv_misses: int


@dataclass(frozen=True)
class ErrorEvent:
    message: str
    code: Literal["busy", "internal", "cancelled"] = "internal"


AskEvent = SourcesEvent | TokenDelta | DoneEvent | ErrorEvent

SNIPPET_CHARS = 240


class AskService:
    def __init__(self, components: Components, scheduler: Scheduler, metrics: Metrics | None = None,
                 prefill_rate: PrefillRate | None = None) -> None:
        self._c = components
        self._scheduler = scheduler
        self._metrics = metrics
        self.prefill_rate = prefill_rate or PrefillRate()

    def validate(self, request: AskRequest) -> None:
        """Raise AskValidationError for a request that must not reach the engine."""
        from engine.types import MODES, SELECTORS

        if not request.question or not request.question.strip():
            raise AskValidationError("question must not be empty")
        if request.mode is not None and request.mode not in MODES:
            raise AskValidationError(f"unknown mode {request.mode!r}; choose one of {', '.join(MODES)}")
        if request.selector is not None and request.selector not in SELECTORS:
            raise AskValidationError(f"unknown selector {request.selector!r}; choose one of {', '.join(SELECTORS)}")
        if request.recompute_ratio is not None and not 0.0 <= request.recompute_ratio <= 1.0:
            raise AskValidationError(f"recompute_ratio must be within [0, 1], got {request.recompute_ratio}")
        if request.top_k is not None and not 1 <= request.top_k <= 64:
            raise AskValidationError(f"top_k must be within [1, 64], got {request.top_k}")
        if request.max_tokens is not None and not 1 <= request.max_tokens <= 4096:
            raise AskValidationError(f"max_tokens must be within [1, 4096], got {request.max_tokens}")
        if request.temperature is not None and not 0.0 <= request.temperature <= 2.0:
            raise AskValidationError(f"temperature must be within [0, 2], got {request.temperature}")

    async def ask(self, request: AskRequest) -> AsyncIterator[AskEvent]:
        """Answer one question as a stream of events: sources, token deltas, then done (or error)."""
        from engine.types import (
            EngineBusy,
            EngineError,
            FinishEvent,
            GenerationRequest,
        )
        from kvcache.errors import KVEntryCorrupt

        self.validate(request)
        engine_settings = self._c.settings.engine
        mode: Mode = request.mode or engine_settings.mode
        started = time.perf_counter()

        chunks, sources = await asyncio.to_thread(self._retrieve, request)
        retrieval_ms = (time.perf_counter() - started) * 1000
        yield SourcesEvent(sources=sources, retrieval_ms=round(retrieval_ms, 2))

        engine = self._c.engine
        layout = engine.prompt.layout_ranked([c.token_ids for c in chunks], request.question.strip())
        ordered = list(reversed(chunks))  # the chunks in prompt order, for their stored KV
        blend = engine_settings.blend_config(recompute_ratio=request.recompute_ratio, selector=request.selector)
        sampling = engine_settings.sampling_params(
            max_tokens=request.max_tokens, temperature=request.temperature, top_p=request.top_p,
            seed=request.seed, stop=request.stop,
        )

        kv_load_ms, kv_hits, kv_misses = 0.0, 0, 0
        pieces: list[str] = []
        # A stored entry found corrupt while its layers stream in has already been dropped by the store:
        # opening again recomputes it. Only before the first token, so the client never sees a restart.
        for attempt in range(2):
            kv_started = time.perf_counter()
            kv_source = None
            if ordered and mode != "full":
                kv_source, hits, misses = await asyncio.to_thread(self._open_kv, ordered)
                kv_hits, kv_misses = (hits, misses) if attempt == 0 else (kv_hits, kv_misses + misses)
            kv_load_ms += (time.perf_counter() - kv_started) * 1000
            gen = GenerationRequest(request_id=str(uuid.uuid4()), layout=layout, kv_source=kv_source,
                                    mode=mode if kv_source is not None else "full", blend=blend,
                                    sampling=sampling)
            try:
                async for event in self._scheduler.submit(gen):
                    if isinstance(event, FinishEvent):
                        self._observe_kv(kv_hits, kv_misses)
                        yield self._done(event, pieces, retrieval_ms, kv_load_ms, kv_hits, kv_misses)
                        return
                    if event.text:
                        pieces.append(event.text)
                        yield TokenDelta(text=event.text)
            except (KVEntryCorrupt, EngineError) as exc:
                corrupt = exc if isinstance(exc, KVEntryCorrupt) else exc.__cause__
                if not isinstance(corrupt, KVEntryCorrupt):
                    if isinstance(exc, EngineBusy):
                        self._count(mode, "busy")
                        yield ErrorEvent(message=f"the engine is busy, retry shortly ({exc})", code="busy")
                        return
                    logger.exception("ask failed")
                    self._count(mode, "error")
                    yield ErrorEvent(message=str(exc), code="internal")
                    return
                if pieces or attempt == 1:
                    logger.error("KV entry corrupt mid-answer: %s", exc)
                    self._count(mode, "error")
                    yield ErrorEvent(message=f"stored KV was corrupt: {exc}", code="internal")
                    return
                logger.warning("KV entry corrupt (%s); recomputing it and starting over", exc)
            except Exception as exc:
                logger.exception("ask failed")
                self._count(mode, "error")
                yield ErrorEvent(message=f"{type(exc).__name__}: {exc}", code="internal")
                return
            finally:
                if kv_source is not None:
                    kv_source.close()

    def _observe_kv(self, kv_hits: int, kv_misses: int) -> None:
        if self._metrics is not None:
            self._metrics.kv_lookups.labels("hit").inc(kv_hits)
            self._metrics.kv_lookups.labels("miss").inc(kv_misses)

    # ---- steps -----------------------------------------------------------------------------------

    def _retrieve(self, request: AskRequest) -> tuple[list[ChunkRecord], list[Source]]:
        from retrieval.types import SearchFilters as RetrievalFilters

        settings = self._c.settings.retrieval
        hits = self._c.retriever.search(
            request.question.strip(), top_k=request.top_k or settings.top_k,
            score_threshold=settings.score_threshold,
            filters=RetrievalFilters(document_ids=request.filters.document_ids, tags=request.filters.tags),
        )
        # Only committed documents answer: a pending document's chunks may already be in the index.
        ready = self._c.catalog.ready_chunk_ids([h.chunk_id for h in hits])
        records = self._c.catalog.chunks_by_ids(list(ready))
        chunks: list[ChunkRecord] = []
        sources: list[Source] = []
        for hit in hits:
            record = records.get(hit.chunk_id)
            if record is None:
                continue
            chunks.append(record)
            sources.append(Source(
                rank=len(sources) + 1, chunk_id=record.id, document_id=record.document_id, title=record.title,
                page=record.page, score=round(float(hit.score), 6), snippet=_snippet(record.text),
                text=record.text,
            ))
        return chunks, sources

    def _open_kv(self, chunks: list[ChunkRecord]) -> tuple[LayerKVSource, int, int]:
        """Open the chunks' stored KV layer-wise, recomputing (and storing) any that are missing."""
        from kvcache.errors import KVEntryMissing

        engine, store = self._c.engine, self._c.store
        keys = [self._c.expected_kv_key(c.token_ids) for c in chunks]
        num_misses = 0
        for _attempt in range(3):
            try:
                source = store.open_layers(keys, device=engine.device, dtype=engine.dtype)
                return source, len(set(keys)) - num_misses, num_misses
            except KVEntryMissing as exc:
                missing = set(exc.keys)
                num_misses += len(missing)
                logger.info("recomputing KV of %d chunk(s) missing from the store", len(missing))
                for chunk, key in zip(chunks, keys, strict=True):
                    if key in missing:
                        kv = engine.prefill_chunk(chunk.token_ids)
                        store.put(key, kv, model_fingerprint=engine.fingerprint)
                        missing.discard(key)
        raise RuntimeError("KV store keeps losing entries; see the kvcache faults in /metrics")

    def _done(self, event: object, pieces: list[str], retrieval_ms: float, kv_load_ms: float, kv_hits: int,
              kv_misses: int) -> DoneEvent:
        from engine.types import FinishEvent

        assert isinstance(event, FinishEvent)
        ttft_ms = retrieval_ms + kv_load_ms + event.ttft_s * 1000
        if event.mode == "full":
            self.prefill_rate.observe(event.num_prompt_tokens, event.ttft_s)
        estimate = self.prefill_rate.estimate_ms(event.num_prompt_tokens)
        if self._metrics is not None:
            self._metrics.ttft.labels(event.mode).observe(ttft_ms / 1000)
            self._metrics.total.labels(event.mode).observe(event.total_s)
            self._metrics.recompute_ratio.observe(event.recompute_ratio)
        self._count(event.mode, event.finish_reason)
        return DoneEvent(
            answer=event.text or "".join(pieces), mode=event.mode, selector=event.selector,
            recompute_ratio=round(event.recompute_ratio, 4), finish_reason=event.finish_reason,
            usage=Usage(prompt_tokens=event.num_prompt_tokens, completion_tokens=event.num_completion_tokens,
                        context_tokens=event.num_context_tokens, recomputed_tokens=event.num_recomputed_tokens),
            timings=Timings(retrieval_ms=round(retrieval_ms, 2), kv_load_ms=round(kv_load_ms, 2),
                            ttft_ms=round(ttft_ms, 2), total_ms=round(retrieval_ms + kv_load_ms
                                                                      + event.total_s * 1000, 2),
                            full_prefill_estimate_ms=None if estimate is None else round(estimate, 1)),
            kv_hits=kv_hits, kv_misses=kv_misses,
        )

    def _count(self, mode: str, outcome: str) -> None:
        if self._metrics is not None:
            self._metrics.asks.labels(mode, outcome).inc()


def _snippet(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= SNIPPET_CHARS else flat[: SNIPPET_CHARS - 1].rstrip() + "…"
