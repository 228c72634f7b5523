"""AskService: a question's flow, top to bottom, one stage per step of `admit`.

1. refuse early when the engine is full (`AskBusy` with the engine's estimate of when to retry, before any
   retrieval or database read);
2. open the conversation the request names (`ConversationNotFound` for one the caller may not open);
3. plan: the follow-up's retrieval query (`followup.py`), retrieval (ready chunks only), the prompt's
   layout with the earlier turns that fit (`prompt.py`) → `AskPlan`;
4. settle the engine request once (`resolve.py`: mode, blend, sampling, token limits), open the plan's KV
   from the store when the mode reads it, computing what is missing (`kv.py`), and
5. submit the engine request → an `Answer` (`answer.py`), which
6. streams sources, token deltas and
7. finishes the turn (`turn.py`: its KV stored, the turn recorded, the one `DoneEvent` built).

`/ask`, `/v1/chat/completions`, `blendrag ask` and bench all come through `admit` (or `ask`, which turns a
busy engine into an `error` event for callers that cannot answer 503 first). The values live in types.py.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from typing import TYPE_CHECKING

from app.services.ask.answer import Answer
from app.services.ask.budget import budget_prompt
from app.services.ask.followup import FollowupService, Recalled
from app.services.ask.kv import OpenedKV, PromptKV
from app.services.ask.prompt import TurnKV, build_prompt
from app.services.ask.recorder import AnswerRecorder
from app.services.ask.resolve import requested_mode, settle
from app.services.ask.turn import TurnFinisher
from app.services.ask.types import (
    NO_MATCH,
    NOT_COVERED,
    NOT_COVERED_NOTE,
    NOTHING_INGESTED,
    AskBusy,
    AskEvent,
    AskPlan,
    AskRequest,
    AskValidationError,
    ErrorEvent,
    Source,
    SourcesEvent,
)
from app.services.conversation_service import ConversationContext
from app.services.estimates import FullPassRate
from app.services.sections import section_of
from retrieval.relevance import covers, judged_score, relevance_floor

if TYPE_CHECKING:
    from app.catalog import Catalog
    from app.catalog.records import ChunkRecord
    from app.metrics import Metrics
    from app.services.conversation_service import ConversationService
    from app.settings import Settings
    from engine.engine import Engine
    from engine.scheduler import Scheduler
    from kvcache.space import KVSpace
    from retrieval.followup import FollowupQuery
    from retrieval.retriever import Retriever

SNIPPET_CHARS = 240
# Earlier chunks holding a '#' read to find a passage's heading: the first with a heading before the passage
# decides, so more are read only when code comments or headings past its start come first.
_LOOK_BACK = 8
BUSY = "the engine is busy, retry shortly"


class AskService:
    def __init__(
        self,
        settings: Settings,
        *,
        catalog: Catalog,
        retriever: Retriever,
        engine: Engine,
        kv_space: KVSpace,
        scheduler: Scheduler,
        conversations: ConversationService | None,
        metrics: Metrics | None = None,
        full_pass_rate: FullPassRate | None = None,
        on_storage_fault: Callable[[str], None] | None = None,
        on_storage_ok: Callable[[], None] | None = None,
    ) -> None:
        """`conversations` opens and records conversations (None: a request naming one is refused with
        ConversationNotFound). `metrics` and `full_pass_rate` hear of every answer (a server's);
        `on_storage_fault` / `on_storage_ok` whether a conversation turn could be stored."""
        self._settings = settings
        self._catalog, self._retriever, self._engine = catalog, retriever, engine
        self._scheduler = scheduler
        self._conversations = conversations
        self._recorder = AnswerRecorder(metrics, full_pass_rate or FullPassRate())
        self._followup = FollowupService(settings.retrieval, retriever, engine, scheduler)
        self._turn_kv = TurnKV(engine, kv_space)
        self._kv = PromptKV(engine, kv_space, scheduler)
        self._finisher = TurnFinisher(
            self._recorder, self._turn_kv, scheduler, conversations, on_storage_fault, on_storage_ok
        )

    @property
    def full_pass_rate(self) -> FullPassRate:
        return self._recorder.full_pass_rate

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

    async def admit(self, request: AskRequest) -> Answer:
        """Stages 1-5: once this returns the engine has accepted the request and `Answer.events()` streams it.

        Raises, before anything is sent to the client: AskBusy (the engine's queue is full, or a new request's
        wait over `engine.max_queue_wait_s`: early, or at the binding check of the scheduler),
        ConversationNotFound, AskValidationError (a question or prompt too long).
        """
        from engine.types import EngineBusy

        # 1. Not binding (requests race between it and the scheduler), but it spares retrieval and the
        # database; the scheduler's own check at submit is the binding one.
        if (busy := self._scheduler.refusal()) is not None:
            raise AskBusy(BUSY, busy.retry_after_s)
        in_force = self._engine.settings  # the operator's settings with the blend in force (app/calibration)
        settled = None
        try:
            plan = await self.plan(request)  # 2. and 3.
            # Every value of the engine request, once: nothing after this decides the mode again.
            settled = settle(request, plan.layout, in_force, self._engine.model.config.max_position_embeddings)
            answer = Answer(
                request,
                plan,
                self._sources(plan),
                settled,
                kv=self._kv,
                scheduler=self._scheduler,
                recorder=self._recorder,
                finisher=self._finisher,
            )
            await answer.open_and_submit(readmit=False)  # 4. and 5.
        except EngineBusy as exc:  # the scheduler's queue, or a follow-up's rewrite, found the engine full
            self._recorder.count(settled.mode if settled is not None else requested_mode(request, in_force), "busy")
            raise AskBusy(f"{BUSY} ({exc})", exc.retry_after_s) from exc
        return answer

    async def plan(self, request: AskRequest) -> AskPlan:
        """The request's conversation opened, then retrieval (reading the recent turns) and the prompt.

        Raises ConversationNotFound, AskValidationError when the question is over `server.max_question_tokens`,
        the client's system messages and the question together over `server.max_prompt_tokens` (budget.py) or
        even without earlier turns the prompt is longer than the model's context, EngineBusy when a
        `rewrite` follow-up finds the engine full."""
        conversation = self._open_conversation(request)
        history = request.history or (conversation.history if conversation is not None else ())
        engine = self._engine
        # Bounded before any work: retrieval, a follow-up rewrite and the prompt pass all grow with it.
        budget = budget_prompt(
            engine.prompt,
            system_prompt=request.system_prompt,
            question=request.question,
            history=history,
            max_question_tokens=self._settings.server.max_question_tokens,
            max_prompt_tokens=self._settings.server.max_prompt_tokens,
            history_max_tokens=self._settings.engine.history_max_tokens,
        )
        started = time.perf_counter()
        # A stored conversation's turns carry their sources (a /v1 client's own messages replace them).
        same_history = conversation is not None and conversation.history == history
        source_ids = conversation.source_ids if conversation is not None and same_history else ()

        def recall(earlier: FollowupQuery) -> Recalled:  # a /v1 history's previous turn, retrieved again
            found, _, best = self._retrieve(request, earlier)
            return Recalled(tuple(c.id for c in found), best)

        query = await self._followup.query(request.question, history, request.followup, source_ids, recall)
        chunks, sources, best_score = await asyncio.to_thread(self._retrieve, request, query)
        retrieval_ms = (time.perf_counter() - started) * 1000
        # Chunks that score below the relevance floor do not answer the question: left out, they cannot be
        # quoted or cited for an answer they do not hold, and the model is told the documents say nothing.
        covered = not sources or covers(best_score, relevance_floor(self._settings.retrieval))
        question = request.question.strip()
        if not covered:
            chunks, sources, question = [], [], f"{question}\n\n{NOT_COVERED_NOTE}"
        context = engine.model.config.max_position_embeddings
        prompt = build_prompt(
            engine.prompt.for_system_prompt(request.system_prompt),
            [c.token_ids for c in chunks],
            question,
            budget.history,
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
            history=history,
            conversation=conversation,
            best_score=best_score,
            covered=covered,
        )

    def open_plan_kv(self, plan: AskPlan) -> OpenedKV:
        """Open the plan's stored KV (chunks, then earlier turns), computing and storing what is missing.
        Blocks on the engine for missing entries: call it from a worker thread; close `source` after."""
        return self._kv.open(plan)

    # ---- the stages' details ----------------------------------------------------------------------

    def _open_conversation(self, request: AskRequest) -> ConversationContext | None:
        ref = request.conversation
        if ref is None:
            return None
        if self._conversations is None:
            from app.services.conversation_service import ConversationNotFound

            raise ConversationNotFound(f"no conversation {ref.conversation_id!r} (conversations are not kept here)")
        return self._conversations.open(ref.conversation_id, ref.owner, ref.readable, request.filters.collections)

    def _retrieve(
        self, request: AskRequest, query: FollowupQuery
    ) -> tuple[list[ChunkRecord], list[Source], float | None]:
        """The ready chunks retrieved, their sources (best first) and the score their coverage is judged on: the
        best cosine similarity among them, to the query or (a follow-up's) the questions it read."""
        settings = self._settings.retrieval
        hits = self._retriever.search(
            query.text,
            top_k=request.top_k or settings.top_k,
            score_threshold=settings.score_threshold,
            filters=request.filters,
            query_vector=query.vector,
        )
        # Only committed documents answer: a pending document's chunks may already be in the index. The
        # catalog (the truth) checks the collections again behind the index's own filter.
        ready = self._catalog.ready_chunk_ids([h.chunk_id for h in hits], request.filters.collections)
        records = self._catalog.chunks_by_ids(list(ready))
        chunks: list[ChunkRecord] = []
        sources: list[Source] = []
        best: float | None = None
        for hit in hits:
            record = records.get(hit.chunk_id)
            if record is None:
                continue
            best = hit.vector_score if best is None else max(best, hit.vector_score)
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
                    section=self._section(record),
                )
            )
        best = None if best is None else round(float(best), 6)
        floor = relevance_floor(settings)
        return chunks, sources, judged_score(self._retriever, query, [c.id for c in chunks], best, floor)

    def _section(self, record: ChunkRecord) -> str | None:
        """The heading the chunk sits under: its own opening heading, else the latest one of the chunks
        before it (read only when the chunk does not open with one, and only those holding a '#')."""
        section = section_of(record, [])
        if section is not None or record.index == 0:
            return section
        return section_of(record, self._catalog.chunks_before(record.document_id, record.index, "#", _LOOK_BACK))

    def _sources(self, plan: AskPlan) -> SourcesEvent:
        if not plan.covered:
            notice: str | None = NOT_COVERED
        else:
            notice = None if plan.sources else (NOTHING_INGESTED if self._retriever.count == 0 else NO_MATCH)
        return SourcesEvent(sources=plan.sources, retrieval_ms=round(plan.retrieval_ms, 2), notice=notice)


def _snippet(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= SNIPPET_CHARS else flat[: SNIPPET_CHARS - 1].rstrip() + "…"
