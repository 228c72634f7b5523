"""The retrieval query of a question asked in a conversation (`retrieval.followup`, see retrieval/followup.py).

`concat` and `off` need only the embedder; `rewrite` has the model restate the question as a standalone
one first: a short greedy generation (full prefill of the recent turns + up to REWRITE_MAX_TOKENS tokens)
through the same scheduler as the answers, so it costs a prompt pass before the answer's own.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING

from retrieval.followup import (
    REWRITE_SYSTEM_PROMPT,
    EarlierTurn,
    FollowupQuery,
    clean_rewrite,
    followup_query,
    rewrite_request_text,
)

if TYPE_CHECKING:
    from engine.engine import Engine
    from engine.prompt import PromptBuilder, Turn
    from engine.scheduler import Scheduler
    from retrieval.config import FollowupMode, RetrievalSettings
    from retrieval.retriever import Retriever

logger = logging.getLogger(__name__)

REWRITE_MAX_TOKENS = 48


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
    ) -> FollowupQuery:
        """What retrieval searches with for `question` after `history` (oldest first). `source_ids`: each
        earlier turn's sources, aligned with `history` (a stored conversation has them; a /v1 messages
        array does not, and its query reads the questions only)."""
        settings = self._settings
        mode = mode or settings.followup
        if not history or mode == "off" or settings.followup_turns == 0:
            return FollowupQuery(text=question.strip())
        if mode == "rewrite":
            text = await self.rewrite(question, history)
            return FollowupQuery(text=text, num_turns_used=min(len(history), settings.followup_turns))
        sources = list(source_ids) if len(source_ids) == len(history) else [() for _ in history]
        earlier = [EarlierTurn(t.question, tuple(s)) for t, s in zip(history, sources, strict=True)]
        return await asyncio.to_thread(followup_query, question, earlier, self._retriever, settings)

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
            kv_source=None,
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
