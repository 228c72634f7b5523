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
from app.services.attribution import Citation, SourceText, attribute
from app.services.estimates import PrefillRate
from retrieval.types import SearchFilters

if TYPE_CHECKING:
    from app.components import Components
    from app.metrics import Metrics
    from engine.scheduler import RequestStream, Scheduler
    from engine.types import FinishEvent, GenerationRequest, Mode, SelectorName
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


NOTHING_INGESTED = "nothing ingested yet"
NO_MATCH = "no documents match"


@dataclass(frozen=True)
class SourcesEvent:
    sources: list[Source]
    retrieval_ms: float
    # Why there are no sources, when there are none: NOTHING_INGESTED or NO_MATCH (the answer then comes
    # from the model alone, and the client should say so).
    notice: str | None = None


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
    notice: str | None = None  # as in SourcesEvent: set when the answer had no sources
    # Which source each answer sentence draws on (app/services/attribution.py), for [n] marks.
    citations: list[Citation] = field(default_factory=list)


@dataclass(frozen=True)
class ErrorEvent:
    message: str
    code: Literal["busy", "internal", "cancelled"] = "internal"


AskEvent = SourcesEvent | TokenDelta | DoneEvent | ErrorEvent

SNIPPET_CHARS = 240


@dataclass(frozen=True)
class OpenedKV:
    """The chunks' KV, ready to stream into a prompt pass, and how much of it the store had."""

    source: LayerKVSource
    num_hits: int
    num_misses: int


class AnswerRecorder:
    """Turns an engine finish into the DoneEvent and records what every answer reports (metrics, the
    prefill-rate estimate). One per AskService; AdmittedAnswer reports through it."""

    def __init__(self, metrics: Metrics | None, prefill_rate: PrefillRate) -> None:
        self._metrics = metrics
        self.prefill_rate = prefill_rate

    def count(self, mode: str, outcome: str) -> None:
        if self._metrics is not None:
            self._metrics.asks.labels(mode, outcome).inc()

    def done(
        self,
        event: FinishEvent,
        pieces: list[str],
        retrieval_ms: float,
        kv_load_ms: float,
        kv_hits: int,
        kv_misses: int,
        sources: SourcesEvent,
    ) -> DoneEvent:
        ttft_ms = retrieval_ms + kv_load_ms + event.ttft_s * 1000
        if event.mode == "full":
            self.prefill_rate.observe(event.num_prompt_tokens, event.ttft_s)
        estimate = self.prefill_rate.estimate_ms(event.num_prompt_tokens)
        if self._metrics is not None:
            self._metrics.kv_lookups.labels("hit").inc(kv_hits)
            self._metrics.kv_lookups.labels("miss").inc(kv_misses)
            self._metrics.ttft.labels(event.mode).observe(ttft_ms / 1000)
            self._metrics.total.labels(event.mode).observe(event.total_s)
            self._metrics.recompute_ratio.observe(event.recompute_ratio)
        self.count(event.mode, event.finish_reason)
        answer = event.text or "".join(pieces)
        return DoneEvent(
            answer=answer,
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
            notice=sources.notice,
            citations=attribute(answer, [SourceText(s.rank, s.text) for s in sources.sources]),
        )


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
        self._recorder = AnswerRecorder(metrics, prefill_rate or PrefillRate())

    @property
    def prefill_rate(self) -> PrefillRate:
        return self._recorder.prefill_rate

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
        notice = None if sources else (NOTHING_INGESTED if self._c.retriever.count == 0 else NO_MATCH)

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
        use_kv = bool(ordered) and mode != "full"
        answer = AdmittedAnswer(
            sources=SourcesEvent(sources=sources, retrieval_ms=round(retrieval_ms, 2), notice=notice),
            mode=mode,
            open_kv=(lambda: self._open_kv(ordered)) if use_kv else None,
            build=lambda kv_source, effective: GenerationRequest(
                request_id=str(uuid.uuid4()),
                layout=layout,
                kv_source=kv_source,
                mode=effective,
                blend=blend,
                sampling=sampling,
            ),
            scheduler=self._scheduler,
            recorder=self._recorder,
        )
        try:
            await answer.open_and_submit(readmit=False)
        except EngineBusy as exc:
            self._recorder.count(mode, "busy")
            raise AskBusy(f"the engine is busy, retry shortly ({exc})") from exc
        return answer

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

    def _open_kv(self, chunks: list[ChunkRecord]) -> OpenedKV:
        """Open the chunks' stored KV layer-wise; KV the store lacks is computed once and served as computed.

        Runs in a worker thread (it blocks on the engine for missing chunks). The computed KV is stored
        too (kvcache.writer), but served from what was computed, so a store that cannot keep it still answers.
        """
        from engine.scheduler import PrefillPriority
        from kvcache.errors import KVEntryMissing
        from kvcache.format import StoredEntry
        from kvcache.writer import ensure_chunk_kv

        engine, store = self._c.engine, self._c.store
        token_ids = [c.token_ids for c in chunks]
        keys = [self._c.expected_kv_key(ids) for ids in token_ids]
        computed: dict[str, StoredEntry] = {}
        num_misses = 0
        # A present entry may be evicted between two opens: it is then computed too, at most a few times.
        for _attempt in range(3):
            try:
                source = store.open_layers(keys, device=engine.device, dtype=engine.dtype, computed=computed)
                return OpenedKV(source=source, num_hits=len(set(keys)) - num_misses, num_misses=num_misses)
            except KVEntryMissing as exc:
                num_misses += len(exc.keys)
                logger.info("computing the KV of %d chunk(s) missing from the store", len(exc.keys))
                written = ensure_chunk_kv(
                    store,
                    token_ids,
                    model_fingerprint=engine.fingerprint,
                    prefix_ids=engine.prompt.prefix_ids,
                    # The engine's worker computes them before any other prompt work: a question waits.
                    compute=lambda todo: self._scheduler.prefill_chunks(todo, priority=PrefillPriority.QUESTION),
                    missing_keys=exc.keys,
                    keep_entries=True,
                )
                computed.update(written.computed)
        raise RuntimeError("KV store keeps losing entries; see the kvcache faults in /metrics")


class AdmittedAnswer:
    """A question the engine has accepted: `events()` streams sources, token deltas, then done or error.

    Its collaborators come in: `open_kv` (None: no stored KV, mode full), `build` (the engine request for a
    KV source), the scheduler and the recorder. Once a request is submitted its KV source belongs to the
    engine's worker, which closes it; this object only closes a source whose submit failed.
    """

    def __init__(
        self,
        *,
        sources: SourcesEvent,
        mode: Mode,
        open_kv: Callable[[], OpenedKV] | None,
        build: Callable[[LayerKVSource | None, Mode], GenerationRequest],
        scheduler: Scheduler,
        recorder: AnswerRecorder,
    ) -> None:
        self.sources = sources
        self._mode = mode
        self._open_kv = open_kv
        self._build = build
        self._scheduler = scheduler
        self._recorder = recorder
        self._stream: RequestStream | None = None
        self._kv_load_ms = 0.0
        self._kv_hits = 0
        self._kv_misses = 0

    async def open_and_submit(self, readmit: bool) -> None:
        """Open the chunks' KV (computing missing entries) and queue the request; EngineBusy if full."""
        started = time.perf_counter()
        kv_source = None
        if self._open_kv is not None:
            opened = await asyncio.to_thread(self._open_kv)
            kv_source = opened.source
            if readmit:
                self._kv_misses += opened.num_misses
            else:
                self._kv_hits, self._kv_misses = opened.num_hits, opened.num_misses
        self._kv_load_ms += (time.perf_counter() - started) * 1000
        gen = self._build(kv_source, self._mode if kv_source is not None else "full")
        try:
            self._stream = self._scheduler.submit(gen, readmit=readmit)
        except BaseException:
            if kv_source is not None:  # never handed over: still ours to close
                kv_source.close()
            raise

    def cancel(self) -> None:
        if self._stream is not None:
            self._stream.cancel()

    async def events(self) -> AsyncIterator[AskEvent]:
        from engine.scheduler import SchedulerStopped
        from engine.types import EngineError, FinishEvent
        from kvcache.errors import KVEntryCorrupt

        recorder, mode = self._recorder, self._mode
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
                            yield recorder.done(
                                event,
                                pieces,
                                retrieval_ms,
                                self._kv_load_ms,
                                self._kv_hits,
                                self._kv_misses,
                                self.sources,
                            )
                            return
                        if event.text:
                            pieces.append(event.text)
                            yield TokenDelta(text=event.text)
                except SchedulerStopped as exc:  # the server is shutting down
                    logger.info("ask cancelled: %s", exc)
                    recorder.count(mode, "cancelled")
                    yield ErrorEvent(message=f"the server is shutting down: {exc}", code="cancelled")
                    return
                except (KVEntryCorrupt, EngineError) as exc:
                    corrupt = exc if isinstance(exc, KVEntryCorrupt) else exc.__cause__
                    if not isinstance(corrupt, KVEntryCorrupt):
                        logger.exception("ask failed")
                        recorder.count(mode, "error")
                        yield ErrorEvent(message=str(exc), code="internal")
                        return
                    if pieces or attempt == 1:
                        logger.error("KV entry corrupt mid-answer: %s", exc)
                        recorder.count(mode, "error")
                        yield ErrorEvent(message=f"stored KV was corrupt: {exc}", code="internal")
                        return
                    logger.warning("KV entry corrupt (%s); recomputing it and starting over", exc)
                finally:
                    await stream.aclose()  # cancels the request if it is still running; the worker cleans up
        except Exception as exc:
            logger.exception("ask failed")
            recorder.count(mode, "error")
            yield ErrorEvent(message=f"{type(exc).__name__}: {exc}", code="internal")


def _snippet(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= SNIPPET_CHARS else flat[: SNIPPET_CHARS - 1].rstrip() + "…"
