"""TurnFinisher: the last stage of a question. A finished engine request becomes the one `DoneEvent` the
client gets, after the turn's KV is stored (the next turn reuses it) and the turn is recorded in its
conversation; both happen before `done` is sent, so a client's next turn finds them."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from app.services.ask.recorder import AnswerRecorder, KVCounts
from app.services.ask.types import AskPlan, AskRequest, DoneEvent, SourcesEvent
from app.services.attribution import SourceText, attribute, invention_notice, unsupported_identifiers
from app.services.storage_faults import is_storage_full
from engine.prompt import Turn

if TYPE_CHECKING:
    from app.catalog.conversations import NewTurn
    from app.services.ask.prompt import TurnKV
    from app.services.conversation_service import ConversationContext, ConversationService
    from engine.scheduler import Scheduler
    from engine.types import FinishEvent

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TurnFinisher:
    """Finishes answered turns: measures them (`AnswerRecorder`), stores their KV (`TurnKV`, through the
    scheduler at question priority), records them (`ConversationService`; None: nothing is recorded) and
    builds their `DoneEvent`. `on_storage_fault` / `on_storage_ok` hear whether a turn could be recorded."""

    recorder: AnswerRecorder
    turn_kv: TurnKV
    scheduler: Scheduler
    conversations: ConversationService | None
    on_storage_fault: Callable[[str], None] | None = None
    on_storage_ok: Callable[[], None] | None = None

    async def finish(
        self, request: AskRequest, plan: AskPlan, sources: SourcesEvent, event: FinishEvent, text: str, kv: KVCounts
    ) -> DoneEvent:
        """The `done` of an answer whose engine request finished with `event` (`text`: its streamed pieces)."""
        answer = event.text or text
        usage, timings = self.recorder.measure(event, sources.retrieval_ms, kv, plan.layout.num_history_tokens)
        if request.conversation is not None or plan.history:
            # Only a stored conversation's turn goes to disk: its record names it (doctor keeps it). A stateless
            # client's stays in the history memory tier, where its next request finds it and the tier's LRU
            # (or a restart) ends it, instead of piling up on disk with nothing to name it.
            await self._store_turn_kv(Turn(request.question, answer), persist=request.conversation is not None)
        conversation_id, not_stored = None, None
        context = plan.conversation
        if context is not None and context.conversation_id is not None and self.conversations is not None:
            from app.catalog.conversations import NewTurn

            recorded = NewTurn(
                question=request.question.strip(),
                answer=answer,
                source_chunk_ids=[s.chunk_id for s in plan.sources],
                mode=event.mode,
                selector=event.selector,
                recompute_ratio=round(event.recompute_ratio, 4),
                timings=dataclasses.asdict(timings),
                usage={**dataclasses.asdict(usage), "kv_hits": kv.num_hits, "kv_misses": kv.num_misses},
            )
            conversation_id, not_stored = await self._record(context, recorded)
        source_texts = [SourceText(s.rank, s.text) for s in sources.sources]
        unsupported = unsupported_identifiers(answer, source_texts)
        # An answer written mostly in names no source has is said to be so where it is read, not only listed.
        invented = invention_notice(answer, unsupported)
        notice = "; ".join(n for n in (sources.notice, invented, not_stored) if n) or None
        return DoneEvent(
            answer=answer,
            mode=event.mode,
            selector=event.selector,
            recompute_ratio=round(event.recompute_ratio, 4),
            finish_reason=event.finish_reason,
            usage=usage,
            timings=timings,
            kv_hits=kv.num_hits,
            kv_misses=kv.num_misses,
            notice=notice,
            citations=attribute(answer, source_texts),
            unsupported_identifiers=unsupported,
            conversation_id=conversation_id,
            history_turns=plan.num_history_turns,
            history_dropped_turns=plan.num_dropped_turns,
            retrieval_query=plan.query.text if plan.query.num_turns_used else None,
            repeated_line=event.repeated_line,
        )

    async def _store_turn_kv(self, turn: Turn, *, persist: bool) -> None:
        """Turn KV is written for turns likely to come back as history: those of a stored conversation, and
        those of a stateless client that already resends its history (its next request carries this turn
        too; memory only, `persist=False`). A lone stateless question writes none: nothing it names brings
        the turn back."""
        from engine.scheduler import PrecomputePriority

        try:
            await asyncio.to_thread(
                lambda: self.turn_kv.store_turn(
                    turn,
                    lambda todo: self.scheduler.precompute_chunks(todo, priority=PrecomputePriority.QUESTION),
                    persist=persist,
                )
            )
        except Exception:  # the answer stands; the next turn computes the entry
            logger.exception("could not store the KV of a finished turn")

    async def _record(self, context: ConversationContext, turn: NewTurn) -> tuple[str | None, str | None]:
        """Append the turn: (the conversation id `done` names, None) or, when it could not be stored,
        (None, the notice that says why)."""
        assert self.conversations is not None
        try:
            kept = await asyncio.to_thread(self.conversations.record, context, turn)
        except Exception as exc:  # the answer stands; `done` names no conversation and says why
            logger.exception("could not record a conversation turn")
            full = is_storage_full(exc)
            if full and self.on_storage_fault is not None:
                self.on_storage_fault(f"conversation turn not stored: {type(exc).__name__}: {exc}")
            why = "the server's storage is full" if full else f"{type(exc).__name__}"
            return None, (
                f"this turn was not stored ({why}): conversation_id is null; ask again later, or send the "
                "earlier turns yourself"
            )
        if self.on_storage_ok is not None:
            self.on_storage_ok()
        return (context.conversation_id if kept else None), None
