"""AskService: retrieve → load chunk KV → blend → stream, one typed event at a time.

The router turns these events into Server-Sent Events (or one JSON body); the CLI prints them.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from app.catalog.repository import ChunkRecord
from app.services.estimates import PrefillRate
from retrieval.types import SearchFilters

if TYPE_CHECKING:
    from app.components import Components
    from app.metrics import Metrics
    from engine.scheduler import RequestStream, Scheduler
    from engine.types import GenerationRequest, Mode, SelectorName
    from kvcache.types import LayerKVSource

logger = logging.getLogger(__name__)

MAX_QUESTION_CHARS = 8000  # /ask and /v1 alike (enforced at the edge, app/api/schemas.py)
MAX_SEED = 2**53 - 1  # exact as a JSON double (torch.Generator.manual_seed takes more)


class AskValidationError(ValueError):
    """A question that cannot be asked although its fields are valid (its prompt is longer than the model's
    context): HTTP 422 / 400, CLI exit 2."""


class AskBusy(RuntimeError):
    """The engine's queue is full: HTTP 503 with Retry-After (checked before any response starts)."""


@dataclass(frozen=True)
class AskRequest:
    """One question. Its values are validated where it comes in (app/api/schemas.AskParams, which the
    CLI uses too); the service trusts them."""

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
    def __init__(
        self,
        components: Components,
        scheduler: Scheduler,
        metrics: Metrics | None = None,
        prefill_rate: PrefillRate | None = None,
    ) -> None:
        self._c = components
        self._scheduler = scheduler
        self._metrics = metrics
        self.prefill_rate = prefill_rate or PrefillRate()

    async def ask(self, request: AskRequest) -> AsyncIterator[AskEvent]:
        """Answer one question as a stream of events: sources, token deltas, then done (or error).

        For callers that cannot answer "busy" before they start (CLI, benchmarks): a full engine becomes an
        `error` event with code `busy`. HTTP routes call `admit` first instead, so busy is a 503.
        """
        try:
            answer = await self.admit(request)
        except AskBusy as exc:
            yield ErrorEvent(message=str(exc), code="busy")
            return
        async with aclosing(answer.events()) as events:
            async for event in events:
                yield event

    async def admit(self, request: AskRequest) -> AdmittedAnswer:
        """Retrieve, open the chunks' KV and queue the request in the engine scheduler.

        Raises AskValidationError (prompt longer than the model's context) or AskBusy (the scheduler's queue
        is full) before anything is sent to the client; once this returns, the engine has accepted the
        request and `AdmittedAnswer.events()` streams it. An answer that is never iterated is cancelled when
        it is dropped.
        """
        from engine.types import EngineBusy, GenerationRequest

        engine_settings = self._c.settings.engine
        mode: Mode = request.mode or engine_settings.mode
        started = time.perf_counter()

        chunks, sources = await asyncio.to_thread(self._retrieve, request)
        retrieval_ms = (time.perf_counter() - started) * 1000

        engine = self._c.engine
        layout = engine.prompt.layout_ranked([c.token_ids for c in chunks], request.question.strip())
        ordered = list(reversed(chunks))  # the chunks in prompt order, for their stored KV
        context = engine.model.config.max_position_embeddings
        if layout.num_tokens >= context:
            raise AskValidationError(
                f"the prompt is {layout.num_tokens} tokens (question + {len(ordered)} retrieved chunks), longer "
                f"than the model's context of {context} tokens; ask with a smaller top_k or a shorter question"
            )
        max_tokens = min(request.max_tokens or engine_settings.max_new_tokens, context - layout.num_tokens)
        blend = engine_settings.blend_config(recompute_ratio=request.recompute_ratio, selector=request.selector)
        # The settings' sampling (repetition control included, the same in every mode); request values win.
        sampling = engine_settings.sampling_params(
            max_tokens=max_tokens,
            temperature=request.temperature,
            top_p=request.top_p,
            seed=request.seed,
            stop=request.stop,
        )
        answer = AdmittedAnswer(
            self,
            SourcesEvent(sources=sources, retrieval_ms=round(retrieval_ms, 2)),
            ordered,
            mode,
            lambda kv_source, effective: GenerationRequest(
                request_id=str(uuid.uuid4()),
                layout=layout,
                kv_source=kv_source,
                mode=effective,
                blend=blend,
                sampling=sampling,
            ),
        )
        try:
            await answer.open_and_submit(readmit=False)
        except EngineBusy as exc:
            self._count(mode, "busy")
            raise AskBusy(f"the engine is busy, retry shortly ({exc})") from exc
        return answer

    def _observe_kv(self, kv_hits: int, kv_misses: int) -> None:
        if self._metrics is not None:
            self._metrics.kv_lookups.labels("hit").inc(kv_hits)
            self._metrics.kv_lookups.labels("miss").inc(kv_misses)

    # ---- steps -----------------------------------------------------------------------------------

    def _retrieve(self, request: AskRequest) -> tuple[list[ChunkRecord], list[Source]]:
        settings = self._c.settings.retrieval
        hits = self._c.retriever.search(
            request.question.strip(),
            top_k=request.top_k or settings.top_k,
            score_threshold=settings.score_threshold,
            filters=request.filters,
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
            sources.append(
                Source(
                    rank=len(sources) + 1,
                    chunk_id=record.id,
                    document_id=record.document_id,
                    title=record.title,
                    page=record.page,
                    score=round(float(hit.score), 6),
                    snippet=_snippet(record.text),
                    text=record.text,
                )
            )
        return chunks, sources

    def _open_kv(self, chunks: list[ChunkRecord]) -> tuple[LayerKVSource, int, int]:
        """Open the chunks' stored KV layer-wise, recomputing (and storing) any that are missing."""
        from engine.scheduler import PrefillPriority
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
                # The engine's worker computes them before any other prompt work: a question waits.
                todo = {key: chunk.token_ids for chunk, key in zip(chunks, keys, strict=True) if key in missing}
                kvs = self._scheduler.prefill_chunks(list(todo.values()), priority=PrefillPriority.QUESTION)
                for key, kv in zip(todo, kvs, strict=True):
                    store.put(key, kv, model_fingerprint=engine.fingerprint)
        raise RuntimeError("KV store keeps losing entries; see the kvcache faults in /metrics")

    def _done(
        self, event: object, pieces: list[str], retrieval_ms: float, kv_load_ms: float, kv_hits: int, kv_misses: int
    ) -> DoneEvent:
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
            answer=event.text or "".join(pieces),
            mode=event.mode,
            selector=event.selector,
            recompute_ratio=round(event.recompute_ratio, 4),
            finish_reason=event.finish_reason,
            usage=Usage(
                prompt_tokens=event.num_prompt_tokens,
                completion_tokens=event.num_completion_tokens,
                context_tokens=event.num_context_tokens,
                recomputed_tokens=event.num_recomputed_tokens,
            ),
            timings=Timings(
                retrieval_ms=round(retrieval_ms, 2),
                kv_load_ms=round(kv_load_ms, 2),
                ttft_ms=round(ttft_ms, 2),
                total_ms=round(retrieval_ms + kv_load_ms + event.total_s * 1000, 2),
                full_prefill_estimate_ms=None if estimate is None else round(estimate, 1),
            ),
            kv_hits=kv_hits,
            kv_misses=kv_misses,
        )

    def _count(self, mode: str, outcome: str) -> None:
        if self._metrics is not None:
            self._metrics.asks.labels(mode, outcome).inc()


class AdmittedAnswer:
    """A question the engine has accepted: `events()` streams sources, token deltas, then done or error."""

    def __init__(
        self,
        service: AskService,
        sources: SourcesEvent,
        ordered: list[ChunkRecord],
        mode: Mode,
        build: Callable[[LayerKVSource | None, Mode], GenerationRequest],
    ) -> None:
        self.sources = sources
        self._service = service
        self._ordered = ordered
        self._mode = mode
        self._build = build
        self._stream: RequestStream | None = None
        self._kv_source: LayerKVSource | None = None
        self._kv_load_ms = 0.0
        self._kv_hits = 0
        self._kv_misses = 0

    async def open_and_submit(self, readmit: bool) -> None:
        """Open the chunks' KV (recomputing missing entries) and queue the request; EngineBusy if full."""
        started = time.perf_counter()
        kv_source = None
        if self._ordered and self._mode != "full":
            kv_source, hits, misses = await asyncio.to_thread(self._service._open_kv, self._ordered)
            if readmit:
                self._kv_misses += misses
            else:
                self._kv_hits, self._kv_misses = hits, misses
        self._kv_load_ms += (time.perf_counter() - started) * 1000
        gen = self._build(kv_source, self._mode if kv_source is not None else "full")
        try:
            self._stream = self._service._scheduler.submit(gen, readmit=readmit)
        except BaseException:
            if kv_source is not None:
                kv_source.close()
            raise
        self._kv_source = kv_source

    def cancel(self) -> None:
        if self._stream is not None:
            self._stream.cancel()

    async def events(self) -> AsyncIterator[AskEvent]:
        from engine.types import EngineError, FinishEvent
        from kvcache.errors import KVEntryCorrupt

        service, mode = self._service, self._mode
        pieces: list[str] = []
        yield self.sources
        retrieval_ms = self.sources.retrieval_ms
        try:
            # A stored entry found corrupt while its layers stream in has already been dropped by the store:
            # opening again recomputes it. Only before the first token, so the client never sees a restart.
            for attempt in range(2):
                if attempt == 1:
                    await self.open_and_submit(readmit=True)
                stream = self._stream
                assert stream is not None
                try:
                    async for event in stream:
                        if isinstance(event, FinishEvent):
                            service._observe_kv(self._kv_hits, self._kv_misses)
                            yield service._done(
                                event, pieces, retrieval_ms, self._kv_load_ms, self._kv_hits, self._kv_misses
                            )
                            return
                        if event.text:
                            pieces.append(event.text)
                            yield TokenDelta(text=event.text)
                except (KVEntryCorrupt, EngineError) as exc:
                    corrupt = exc if isinstance(exc, KVEntryCorrupt) else exc.__cause__
                    if not isinstance(corrupt, KVEntryCorrupt):
                        logger.exception("ask failed")
                        service._count(mode, "error")
                        yield ErrorEvent(message=str(exc), code="internal")
                        return
                    if pieces or attempt == 1:
                        logger.error("KV entry corrupt mid-answer: %s", exc)
                        service._count(mode, "error")
                        yield ErrorEvent(message=f"stored KV was corrupt: {exc}", code="internal")
                        return
                    logger.warning("KV entry corrupt (%s); recomputing it and starting over", exc)
                finally:
                    await stream.aclose()
                    if self._kv_source is not None:
                        self._kv_source.close()
                        self._kv_source = None
        except Exception as exc:
            logger.exception("ask failed")
            service._count(mode, "error")
            yield ErrorEvent(message=f"{type(exc).__name__}: {exc}", code="internal")


def _snippet(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= SNIPPET_CHARS else flat[: SNIPPET_CHARS - 1].rstrip() + "…"
