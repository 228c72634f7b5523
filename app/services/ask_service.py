"""AskService: retrieve → load chunk (and earlier turns') KV → blend → stream, one typed event at a time.

The router turns these events into Server-Sent Events (or one JSON body); the CLI prints them.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from app.catalog.repository import ChunkRecord
from app.services.attribution import Citation, SourceText, attribute
from app.services.conversation_prompt import TurnKV, build_prompt
from app.services.estimates import PrefillRate
from app.services.followup_service import FollowupService
from engine.prompt import Turn
from retrieval.followup import FollowupQuery
from retrieval.types import SearchFilters

if TYPE_CHECKING:
    from app.components import Components
    from app.metrics import Metrics
    from app.services.conversation_service import ConversationContext, ConversationService
    from engine.scheduler import RequestStream, Scheduler
    from engine.types import FinishEvent, GenerationRequest, Mode, PromptLayout, SelectorName
    from kvcache.types import LayerKVSource
    from retrieval.config import FollowupMode

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
    # A conversation: the earlier turns (oldest first) go into the prompt and the retrieval query; the
    # finished turn is recorded in `conversation` when there is one (/ask always, /v1 on request).
    history: tuple[Turn, ...] = ()
    conversation: ConversationContext | None = None
    system_prompt: str | None = None  # a client's own (/v1 `system` message); None: the server's
    followup: FollowupMode | None = None  # how retrieval reads the history (default: settings)


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
    history_tokens: int = 0  # tokens of earlier turns in the prompt
    history_reused_tokens: int = 0  # of those, served from stored KV

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
    conversation_id: str | None = None
    history_turns: int = 0
    history_dropped_turns: int = 0
    retrieval_query: str | None = None  # what retrieval searched when it was not the question alone


@dataclass(frozen=True)
class ErrorEvent:
    message: str
    code: Literal["busy", "internal", "cancelled"] = "internal"


AskEvent = SourcesEvent | TokenDelta | DoneEvent | ErrorEvent

SNIPPET_CHARS = 240


@dataclass(frozen=True)
class AskPlan:
    """A question's retrieval and prompt, before any KV is opened (`AskService.plan`; bench reads it)."""

    layout: PromptLayout
    ordered: list[ChunkRecord]  # the retrieved chunks in prompt order
    sources: list[Source]  # best first
    retrieval_ms: float
    query: FollowupQuery  # what retrieval searched
    num_history_turns: int
    num_dropped_turns: int
    history_keys: list[str]  # the store key of each earlier turn in the layout


@dataclass(frozen=True)
class OpenedKV:
    """The prompt's KV (chunks, then earlier turns), ready to stream into a prompt pass, and how much of it
    the store had."""

    source: LayerKVSource
    num_hits: int  # retrieved chunks found in the store
    num_misses: int  # retrieved chunks computed now
    num_history_reused_tokens: int = 0  # earlier turns' tokens found in the store


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
        conversations: ConversationService | None = None,
    ) -> None:
        self._c = components
        self._scheduler = scheduler
        self._metrics = metrics
        self._recorder = AnswerRecorder(metrics, prefill_rate or PrefillRate())
        self._conversations = conversations
        self._followup = FollowupService(components, scheduler)
        self._turn_kv = TurnKV(components)

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
        try:
            plan = await self.plan(request)
        except EngineBusy as exc:  # the rewrite of a follow-up found the engine full
            self._recorder.count(mode, "busy")
            raise AskBusy(f"the engine is busy, retry shortly ({exc})") from exc
        notice = None if plan.sources else (NOTHING_INGESTED if self._c.retriever.count == 0 else NO_MATCH)
        layout = plan.layout
        context = self._c.engine.model.config.max_position_embeddings
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
        use_kv = bool(layout.chunk_ids) and mode != "full"
        answer = AdmittedAnswer(
            sources=SourcesEvent(sources=plan.sources, retrieval_ms=round(plan.retrieval_ms, 2), notice=notice),
            mode=mode,
            open_kv=(lambda: self._open_kv(plan)) if use_kv else None,
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
            finish=lambda done, history_reused: self._finish_turn(request, plan, done, history_reused),
        )
        try:
            await answer.open_and_submit(readmit=False)
        except EngineBusy as exc:
            self._recorder.count(mode, "busy")
            raise AskBusy(f"the engine is busy, retry shortly ({exc})") from exc
        return answer

    async def plan(self, request: AskRequest) -> AskPlan:
        """Retrieve (reading the conversation's recent questions) and lay out the prompt.

        Raises AskValidationError when even without earlier turns the prompt is longer than the model's
        context, EngineBusy when a `rewrite` follow-up finds the engine full."""
        engine = self._c.engine
        started = time.perf_counter()
        query = await self._followup.query(request.question, request.history, request.followup)
        chunks, sources = await asyncio.to_thread(self._retrieve, request, query)
        retrieval_ms = (time.perf_counter() - started) * 1000
        context = engine.model.config.max_position_embeddings
        prompt = build_prompt(
            engine.prompt.for_system_prompt(request.system_prompt),
            [c.token_ids for c in chunks],
            request.question.strip(),
            request.history,
            self._c.settings.engine.history_max_tokens,
            context,
        )
        layout = prompt.layout
        if layout.num_tokens >= context:
            raise AskValidationError(
                f"the prompt is {layout.num_tokens} tokens (question + {len(chunks)} retrieved chunks), longer "
                f"than the model's context of {context} tokens; ask with a smaller top_k or a shorter question"
            )
        return AskPlan(
            layout=layout,
            ordered=list(reversed(chunks)),  # the chunks in prompt order, for their stored KV
            sources=sources,
            retrieval_ms=retrieval_ms,
            query=query,
            num_history_turns=prompt.num_history_turns,
            num_dropped_turns=prompt.num_dropped_turns,
            history_keys=self._turn_kv.keys(layout),
        )

    def open_plan_kv(self, plan: AskPlan) -> OpenedKV:
        """Open the plan's stored KV (chunks, then earlier turns), computing and storing what is missing.
        Blocks on the engine for missing entries: call it from a worker thread; close `source` after."""
        return self._open_kv(plan)

    # ---- steps -----------------------------------------------------------------------------------

    def _retrieve(self, request: AskRequest, query: FollowupQuery) -> tuple[list[ChunkRecord], list[Source]]:
        settings = self._c.settings.retrieval
        hits = self._c.retriever.search(
            query.text,
            top_k=request.top_k or settings.top_k,
            score_threshold=settings.score_threshold,
            filters=request.filters,
            query_vector=query.vector,
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

    def _open_kv(self, plan: AskPlan) -> OpenedKV:
        """Open the prompt's stored KV layer-wise (chunks, then earlier turns); KV the store lacks is computed
        once and served as computed.

        Runs in a worker thread (it blocks on the engine for missing segments). The computed KV is stored
        too (kvcache.writer), but served from what was computed, so a store that cannot keep it still answers.
        A missing or corrupt turn entry is computed like a missing chunk, never an error.
        """
        from engine.scheduler import PrefillPriority
        from kvcache.errors import KVEntryMissing
        from kvcache.format import StoredEntry
        from kvcache.writer import ensure_chunk_kv

        engine, store = self._c.engine, self._c.store
        chunk_ids = [c.token_ids for c in plan.ordered]
        chunk_keys = [self._c.expected_kv_key(ids) for ids in chunk_ids]
        history = set(plan.history_keys)
        token_ids = chunk_ids + plan.layout.history_ids
        keys = chunk_keys + plan.history_keys
        computed: dict[str, StoredEntry] = {}
        missed: set[str] = set()
        # A present entry may be evicted between two opens: it is then computed too, at most a few times.
        for _attempt in range(3):
            try:
                source = store.open_layers(
                    keys, device=engine.device, dtype=engine.dtype, computed=computed, history_keys=history
                )
                num_misses = len(missed - history)
                return OpenedKV(
                    source=source,
                    num_hits=len(set(chunk_keys)) - num_misses,
                    num_misses=num_misses,
                    num_history_reused_tokens=TurnKV.reused_tokens(plan.layout, plan.history_keys, missed),
                )
            except KVEntryMissing as exc:
                missed.update(exc.keys)
                logger.info("computing the KV of %d segment(s) missing from the store", len(exc.keys))
                written = ensure_chunk_kv(
                    store,
                    token_ids,
                    model_fingerprint=engine.fingerprint,
                    prefix_ids=engine.prompt.prefix_ids,
                    # The engine's worker computes them before any other prompt work: a question waits.
                    compute=lambda todo: self._scheduler.prefill_chunks(todo, priority=PrefillPriority.QUESTION),
                    missing_keys=exc.keys,
                    keep_entries=True,
                    history_keys=history,
                )
                computed.update(written.computed)
        raise RuntimeError("KV store keeps losing entries; see the kvcache faults in /metrics")

    async def _finish_turn(self, request: AskRequest, plan: AskPlan, done: DoneEvent, history_reused: int) -> DoneEvent:
        """A finished answer: store its turn's KV (the next turn reuses it), record it in its conversation,
        and say so in `done`. Runs before `done` is sent, so a client's next turn finds both."""
        import dataclasses

        from engine.scheduler import PrefillPriority

        try:
            await asyncio.to_thread(
                self._turn_kv.store_turn,
                Turn(request.question, done.answer),
                lambda todo: self._scheduler.prefill_chunks(todo, priority=PrefillPriority.QUESTION),
            )
        except Exception:  # the answer stands; the next turn computes the entry
            logger.exception("could not store the KV of a finished turn")
        usage = dataclasses.replace(
            done.usage, history_tokens=plan.layout.num_history_tokens, history_reused_tokens=history_reused
        )
        if self._metrics is not None:
            self._metrics.history_tokens.inc(usage.history_tokens)
            self._metrics.history_reused_tokens.inc(usage.history_reused_tokens)
        done = dataclasses.replace(
            done,
            usage=usage,
            history_turns=plan.num_history_turns,
            history_dropped_turns=plan.num_dropped_turns,
            retrieval_query=plan.query.text if plan.query.num_turns_used else None,
        )
        context = request.conversation
        if context is None or context.conversation_id is None or self._conversations is None:
            return done
        from app.catalog.conversations import NewTurn

        recorded = NewTurn(
            question=request.question.strip(),
            answer=done.answer,
            source_chunk_ids=[s.chunk_id for s in plan.sources],
            mode=done.mode,
            selector=done.selector,
            recompute_ratio=done.recompute_ratio,
            timings=dataclasses.asdict(done.timings),
            usage={**dataclasses.asdict(usage), "kv_hits": done.kv_hits, "kv_misses": done.kv_misses},
        )
        try:
            kept = await asyncio.to_thread(self._conversations.record, context, recorded)
        except Exception:  # the answer stands; `done` then names no conversation
            logger.exception("could not record a conversation turn")
            return done
        return dataclasses.replace(done, conversation_id=context.conversation_id) if kept else done


class AdmittedAnswer:
    """A question the engine has accepted: `events()` streams sources, token deltas, then done or error.

    Its collaborators come in: `open_kv` (None: no stored KV, mode full), `build` (the engine request for a
    KV source), the scheduler, the recorder and `finish` (the finished turn: its KV stored, its conversation
    recorded, the `done` that says so; given the history tokens served from the store). Once a request is
    submitted its KV source belongs to the engine's worker, which closes it; this object only closes a
    source whose submit failed.
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
        finish: Callable[[DoneEvent, int], Awaitable[DoneEvent]] | None = None,
    ) -> None:
        self.sources = sources
        self._mode = mode
        self._open_kv = open_kv
        self._build = build
        self._scheduler = scheduler
        self._recorder = recorder
        self._finish = finish
        self._stream: RequestStream | None = None
        self._kv_load_ms = 0.0
        self._kv_hits = 0
        self._kv_misses = 0
        self._history_reused = 0

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
            # After a corrupt entry, the second open says which turns were computed after all.
            self._history_reused = opened.num_history_reused_tokens
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
                            done = recorder.done(
                                event,
                                pieces,
                                retrieval_ms,
                                self._kv_load_ms,
                                self._kv_hits,
                                self._kv_misses,
                                self.sources,
                            )
                            if self._finish is not None:
                                done = await self._finish(done, self._history_reused)
                            yield done
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
