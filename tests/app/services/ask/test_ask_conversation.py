"""AskService in a conversation on the fast stack: the follow-up query, rewrite through the scheduler,
turns recorded in the catalog, and the turn's KV stored before `done`."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from app.build import Services, new_ask, new_ingest, new_scheduler
from app.services.ask import AskRequest, ConversationRef, DoneEvent
from app.services.ingest import IngestSource
from engine.prompt import Turn

DOCS = {
    "zorblat": "Quintaro is the capital of Zorblat. It has purple rivers and a kite festival in May.",
    "bread": "Sourdough needs flour, water, salt and a starter. Bake it at 250 degrees for forty minutes.",
}


@pytest.fixture
def ingested(services: Services) -> None:
    service = new_ingest(services)
    submitted = service.submit([IngestSource(kind="text", title=t, text=x) for t, x in DOCS.items()], enqueue=False)
    service.run_job(submitted.job_id)


def run(services: Services, *requests: AskRequest):
    """The done event of each request, asked in order, and the request ids the scheduler saw (turns of a
    conversation are recorded through `services.conversations`)."""
    submitted: list[str] = []

    async def go() -> list[DoneEvent]:
        scheduler = new_scheduler(services.settings, services.engine)
        real = scheduler.submit

        def spy(request, **kwargs):
            submitted.append(request.request_id)
            return real(request, **kwargs)

        scheduler.submit = spy  # type: ignore[method-assign]
        scheduler.start()
        service = new_ask(services, scheduler=scheduler)
        try:
            return [[e async for e in service.ask(r)][-1] for r in requests]
        finally:
            await asyncio.to_thread(scheduler.stop)

    return asyncio.run(go()), submitted


def test_concat_query_reads_the_earlier_questions(services: Services, ingested: None) -> None:
    history = (Turn("Where is Quintaro?", "On Zorblat."),)
    [concat, off], _ = run(
        services,
        AskRequest(question="And its rivers?", history=history, top_k=1, max_tokens=2),
        AskRequest(question="And its rivers?", history=history, top_k=1, max_tokens=2, followup="off"),
    )
    assert concat.retrieval_query == "And its rivers? Where is Quintaro?"
    assert off.retrieval_query is None
    assert concat.history_turns == 1 and concat.usage.history_tokens == len(services.engine.prompt.turn_ids(history[0]))


def test_rewrite_asks_the_model_first(services: Services, ingested: None) -> None:
    history = (Turn("Where is Quintaro?", "On Zorblat."),)
    [done], submitted = run(
        services, AskRequest(question="And its rivers?", history=history, top_k=1, max_tokens=2, followup="rewrite")
    )
    assert isinstance(done, DoneEvent)
    assert [r.startswith("rewrite-") for r in submitted] == [True, False]  # the rewrite, then the answer
    assert done.retrieval_query  # whatever the random model wrote (or the question itself when it wrote nothing)


def test_turns_are_recorded_and_their_kv_stored_before_done(services: Services, ingested: None) -> None:
    conversations = services.conversations
    assert conversations is not None
    new = ConversationRef("new")
    [first], _ = run(services, AskRequest(question="Where is Quintaro?", top_k=1, max_tokens=3, conversation=new))
    assert first.conversation_id is not None
    key = services.kv_space.key(services.engine.prompt.turn_ids(Turn("Where is Quintaro?", first.answer)))
    assert services.store.contains(key) == "history_memory"
    context = conversations.open(first.conversation_id, owner=None, readable=None, searched=None)
    assert context.history == (Turn("Where is Quintaro?", first.answer),)
    # Continued by id: the service opens it, its stored turn is the history.
    continued = ConversationRef(first.conversation_id)
    [second], _ = run(services, AskRequest(question="And its rivers?", top_k=1, max_tokens=3, conversation=continued))
    assert second.usage.history_reused_tokens == second.usage.history_tokens > 0
    turns = services.catalog.conversations.turns(first.conversation_id)
    assert [t.question for t in turns] == ["Where is Quintaro?", "And its rivers?"]
    assert turns[1].usage["history_reused_tokens"] == second.usage.history_reused_tokens
    assert turns[0].source_chunk_ids and turns[0].mode == "blend"
    # Stateless (no conversation): the turn's KV is stored, nothing is recorded.
    [stateless], _ = run(services, AskRequest(question="Bread?", top_k=1, max_tokens=2))
    assert stateless.conversation_id is None
    assert services.catalog.conversations.counts().num_conversations == 1


def test_a_stored_conversations_sources_join_the_follow_up_query(services: Services, ingested: None) -> None:
    """The previous turn's sources (stored with the turn) anchor the follow-up's query vector; a /v1
    client's own messages have none, so they are retrieved again for the earlier question: the same query."""
    import dataclasses

    conversations = services.conversations
    assert conversations is not None
    new = ConversationRef("new")
    [first], _ = run(services, AskRequest(question="Where is Quintaro?", top_k=1, max_tokens=2, conversation=new))
    context = conversations.open(first.conversation_id, None, None, None)
    [stored] = services.catalog.conversations.turns(first.conversation_id)
    assert context.source_ids == (tuple(stored.source_chunk_ids),) and len(stored.source_chunk_ids) == 1
    service = new_ask(services, scheduler=new_scheduler(services.settings, services.engine))
    request = AskRequest(question="And its rivers?", top_k=1, conversation=ConversationRef(first.conversation_id))
    plan = asyncio.run(service.plan(request))
    assert plan.history == context.history and plan.conversation == context
    assert (plan.query.num_turns_used, plan.query.num_sources_used) == (1, 1)
    stateless = asyncio.run(service.plan(dataclasses.replace(request, history=context.history, conversation=None)))
    assert (stateless.query.num_turns_used, stateless.query.num_sources_used) == (1, 1)
    np.testing.assert_array_equal(stateless.query.vector, plan.query.vector)
    assert [s.chunk_id for s in stateless.sources] == [s.chunk_id for s in plan.sources]
    # `followup: off` reads neither the history nor its sources.
    alone = asyncio.run(service.plan(dataclasses.replace(request, history=context.history, followup="off")))
    assert (alone.query.num_turns_used, alone.query.num_sources_used, alone.query.vector) == (0, 0, None)
