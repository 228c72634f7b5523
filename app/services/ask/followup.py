"""The retrieval query of a question asked in a conversation (`retrieval.followup`, see retrieval/followup.py).

`concat` and `off` need only the embedder; `rewrite` has the model restate the question as a standalone
one first: a short greedy generation (full prefill of the recent turns + up to REWRITE_MAX_TOKENS tokens)
through the same scheduler as the answers, so it costs a prompt pass before the answer's own.

`concat` anchors a follow-up on the previous turn's sources. A stored conversation keeps them with its turns;
a /v1 messages array has none, so they are found again by retrieving once for the previous turn as it was
asked then (`recall`: its question, after the ones before it), kept only when that retrieval is covered (a
stored turn under the relevance floor keeps no sources either). Without this, /v1's follow-up read the
questions alone and found the right project page among the top three 6 times in 12 where /ask found it 12.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from retrieval.followup import (
    REWRITE_SYSTEM_PROMPT,
    EarlierTurn,
    FollowupQuery,
    clean_rewrite,
    followup_query,
    recent_questions,
    rewrite_request_text,
)
from retrieval.relevance import covers, relevance_floor

if TYPE_CHECKING:
    from engine.engine import Engine
    from engine.prompt import PromptBuilder, Turn
    from engine.scheduler import Scheduler
    from retrieval.config import FollowupMode, RetrievalSettings
    from retrieval.retriever import Retriever

logger = logging.getLogger(__name__)

REWRITE_MAX_TOKENS = 48


@dataclass(frozen=True)
class Recalled:
    """What the ask service's retrieval (the request's filters, ready chunks only) found for a query."""

    chunk_ids: tuple[int, ...]  # best first
    best_score: float | None  # what coverage is judged on (retrieval.relevance.judged_score); None: no hit


# Retrieval for an earlier turn's query, as the request's own retrieval runs (AskService._retrieve).
Recall = Callable[[FollowupQuery], Recalled]


class FollowupService:
    def __init__(self, settings: RetrievalSettings, retriever: Retriever, engine: Engine, scheduler: Scheduler) -> None:
        """`engine` gives the tokenizer of a `rewrite`, which `scheduler` runs; `retriever` embeds `concat`."""
        self._settings = settings
        self._retriever = retriever
        self._engine = engine
        self._scheduler = scheduler
        self._rewrite_builder: PromptBuilder | None = None

    async def query(
        self,
        question: str,
        history: Sequence[Turn],
        mode: FollowupMode | None = None,
        source_ids: Sequence[Sequence[int]] = (),
        recall: Recall | None = None,
    ) -> FollowupQuery:
        """What retrieval searches with for `question` after `history` (oldest first). `source_ids`: each
        earlier turn's sources, aligned with `history` (a stored conversation has them; a /v1 messages
        array does not: then `recall` retrieves the previous turn's again, see the module docstring)."""
        settings = self._settings
        mode = mode or settings.followup
        if not history or mode == "off" or settings.followup_turns == 0:
            return FollowupQuery(text=question.strip())
        if mode == "rewrite":
            text = await self.rewrite(question, history)
            earlier = recent_questions([t.question for t in history], settings.followup_turns)
            return FollowupQuery(
                text=text,
                num_turns_used=min(len(history), settings.followup_turns),
                questions=(question.strip(), *earlier),
            )
        stored = list(source_ids) if len(source_ids) == len(history) else None
        return await asyncio.to_thread(self._concat, question, history, stored, recall)

    def _concat(
        self, question: str, history: Sequence[Turn], stored: list[Sequence[int]] | None, recall: Recall | None
    ) -> FollowupQuery:
        """The `concat` query (blocks on the embedder and, for `recall`, on retrieval: a worker thread's)."""
        settings = self._settings
        sources: list[Sequence[int]] = stored if stored is not None else [() for _ in history]
        anchored = settings.followup_sources > 0 and settings.followup_source_weight > 0
        if stored is None and recall is not None and anchored:
            sources[-1] = self.recall_previous(history, recall)
        earlier = [EarlierTurn(t.question, tuple(s)) for t, s in zip(history, sources, strict=True)]
        return followup_query(question, earlier, self._retriever, settings)

    def recall_previous(self, history: Sequence[Turn], recall: Recall) -> tuple[int, ...]:
        """The sources of the last turn of `history` as a stored conversation would hold them: retrieved for its
        question after the questions before it (without their sources: a /v1 history has none), none when
        that retrieval is not covered. For a second turn this is exactly what the first one retrieved."""
        *before, previous = history
        earlier = [EarlierTurn(t.question) for t in before]
        query = followup_query(previous.question, earlier, self._retriever, self._settings)
        found = recall(query)
        if not found.chunk_ids or not covers(found.best_score, relevance_floor(self._settings)):
            logger.debug("follow-up: the previous question %r recalls no covered sources", previous.question)
            return ()
        return found.chunk_ids

    async def rewrite(self, question: str, history: Sequence[Turn]) -> str:
        """The model's standalone version of `question` (the question itself if it says nothing).

        Raises EngineBusy when the scheduler's queue is full, like the answer's own request would."""
        from engine.prompt import PromptBuilder
        from engine.types import FinishEvent, GenerationRequest, SamplingParams

        engine = self._engine
        if self._rewrite_builder is None:
            self._rewrite_builder = PromptBuilder(engine.tokenizer, REWRITE_SYSTEM_PROMPT, "{question}")
        text = rewrite_request_text(question, [(t.question, t.answer) for t in history], self._settings.followup_turns)
        request = GenerationRequest(
            request_id=f"rewrite-{uuid.uuid4()}",
            layout=self._rewrite_builder.layout([], text),
            kv_reader=None,
            mode="full",
            sampling=SamplingParams(max_tokens=REWRITE_MAX_TOKENS, temperature=0.0, stop=("\n",)),
        )
        stream = self._scheduler.submit(request)
        answer = ""
        try:
            async for event in stream:
                if isinstance(event, FinishEvent):
                    answer = event.text
                    break
        finally:
            await stream.aclose()
        rewritten = clean_rewrite(answer, question)
        logger.debug("follow-up %r rewritten as %r", question, rewritten)
        return rewritten
