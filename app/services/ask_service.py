"""AskService: retrieve → load chunk (and earlier turns') KV → blend → stream, one typed event at a time.

The router turns these events into Server-Sent Events (or one JSON body); the CLI prints them. The
values a question and its answer are made of live in ask_types.py; opening a prompt's KV in
prompt_kv.py; streaming an accepted answer in admitted_answer.py.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from typing import TYPE_CHECKING

from app.catalog.repository import ChunkRecord
from app.services.admitted_answer import AdmittedAnswer
from app.services.answer_recorder import AnswerRecorder
from app.services.ask_types import (
    NO_MATCH,
    NOTHING_INGESTED,
    AskBusy,
    AskEvent,
    AskPlan,
    AskRequest,
    AskValidationError,
    DoneEvent,
    ErrorEvent,
    Source,
    SourcesEvent,
)
from app.services.conversation_prompt import TurnKV, build_prompt
from app.services.estimates import PrefillRate
from app.services.followup_service import FollowupService
from app.services.prompt_kv import OpenedKV, open_plan_kv
from app.services.storage_faults import is_storage_full
from engine.prompt import Turn
from retrieval.followup import FollowupQuery

if TYPE_CHECKING:
    from app.components import Components
    from app.metrics import Metrics
    from app.services.conversation_service import ConversationService
    from engine.scheduler import Scheduler
    from engine.types import Mode

logger = logging.getLogger(__name__)

SNIPPET_CHARS = 240


class AskService:
    def __init__(
        self,
        components: Components,
        scheduler: Scheduler,
        metrics: Metrics | None = None,
        prefill_rate: PrefillRate | None = None,
        conversations: ConversationService | None = None,
        on_storage_fault: Callable[[str], None] | None = None,
        on_storage_ok: Callable[[], None] | None = None,
    ) -> None:
        """`on_storage_fault` / `on_storage_ok` hear whether a conversation turn could be stored."""
        self._c = components
        self._on_storage_fault = on_storage_fault
        self._on_storage_ok = on_storage_ok
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
        # The engine's settings carry the blend settings in force (calibrated, shipped or safe; app/calibration).
        blend = self._c.engine.settings.blend_config(recompute_ratio=request.recompute_ratio, selector=request.selector)
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
            open_kv=(lambda: open_plan_kv(self._c, self._scheduler, plan)) if use_kv else None,
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
        # Bounded before any work: retrieval, a follow-up rewrite and the prompt pass all grow with it.
        cap = self._c.settings.server.max_question_tokens
        num_question_tokens = len(engine.tokenizer.encode(request.question, add_special_tokens=False))
        if num_question_tokens > cap:
            raise AskValidationError(
                f"the question is {num_question_tokens} tokens; the limit is {cap} (server.max_question_tokens)"
            )
        started = time.perf_counter()
        conversation = request.conversation
        # A stored conversation's turns carry their sources (a /v1 client's own messages replace them).
        same_history = conversation is not None and conversation.history == request.history
        source_ids = conversation.source_ids if conversation is not None and same_history else ()
        query = await self._followup.query(request.question, request.history, request.followup, source_ids)
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
        return open_plan_kv(self._c, self._scheduler, plan)

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
        # Only committed documents answer: a pending document's chunks may already be in the index. The
        # catalog (the truth) checks the collections again behind the index's own filter.
        ready = self._c.catalog.ready_chunk_ids([h.chunk_id for h in hits], request.filters.collections)
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

    async def _finish_turn(self, request: AskRequest, plan: AskPlan, done: DoneEvent, history_reused: int) -> DoneEvent:
        """A finished answer: store its turn's KV (the next turn reuses it), record it in its conversation,
        and say so in `done`. Runs before `done` is sent, so a client's next turn finds both."""
        import dataclasses

        from engine.scheduler import PrecomputePriority

        # Turn KV is written for turns likely to come back as history: those of a stored conversation, and
        # those of a stateless client that already resends its history (its next request carries this turn
        # too). A lone stateless question writes none: nothing it names brings the turn back.
        if request.conversation is not None or request.history:
            try:
                await asyncio.to_thread(
                    self._turn_kv.store_turn,
                    Turn(request.question, done.answer),
                    lambda todo: self._scheduler.precompute_chunks(todo, priority=PrecomputePriority.QUESTION),
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
        except Exception as exc:  # the answer stands; `done` names no conversation and says why
            logger.exception("could not record a conversation turn")
            full = is_storage_full(exc)
            if full and self._on_storage_fault is not None:
                self._on_storage_fault(f"conversation turn not stored: {type(exc).__name__}: {exc}")
            why = "the server's storage is full" if full else f"{type(exc).__name__}"
            notice = (
                f"this turn was not stored ({why}): conversation_id is null; ask again later, or send the "
                "earlier turns yourself"
            )
            return dataclasses.replace(done, notice=f"{done.notice} {notice}" if done.notice else notice)
        if self._on_storage_ok is not None:
            self._on_storage_ok()
        return dataclasses.replace(done, conversation_id=context.conversation_id) if kept else done


def _snippet(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= SNIPPET_CHARS else flat[: SNIPPET_CHARS - 1].rstrip() + "…"
