"""The relevance floor: a question whose best match scores below it gets no chunks, a prompt that tells the
model the documents do not cover it, and the notice; a question above it is planned and answered exactly as
without a floor. On the fast stack (hash embedder: shared words make the cosine similarity)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from app.build import Services, new_ask, new_ingest, new_scheduler
from app.services.ask.types import NOT_COVERED, NOT_COVERED_NOTE, AskPlan, AskRequest, DoneEvent, SourcesEvent
from app.services.ingest import IngestSource
from app.settings import Settings
from engine.prompt import Turn
from retrieval.config import RetrievalSettings
from retrieval.relevance import BUILTIN_EMBEDDER_FLOOR, covers, relevance_floor

DOCS = {
    "zorblat": "Quintaro is the capital of Zorblat. It has purple rivers and a kite festival in May.",
    "bread": "Sourdough needs flour, water, salt and a starter. Bake it at 250 degrees for forty minutes.",
}
IN_CORPUS = "What is the capital of Zorblat?"
OUT_OF_CORPUS = "How do I set a connect timeout on an httpx AsyncClient?"
FLOOR = 0.2


def _services(make_fast_settings, make_fast_services, floor: float | None, data: Path, **retrieval: object) -> Services:
    settings: Settings = make_fast_settings(data_dir=data, retrieval={"relevance_floor": floor, **retrieval})
    services = make_fast_services(settings)
    ingest = new_ingest(services)
    submitted = ingest.submit([IngestSource(kind="text", title=t, text=x) for t, x in DOCS.items()], enqueue=False)
    ingest.run_job(submitted.job_id)
    return services


def _plan(services: Services, question: str, history: tuple[Turn, ...] = ()) -> AskPlan:
    request = AskRequest(question=question, top_k=2, history=history)
    return asyncio.run(new_ask(services, scheduler=services.scheduler).plan(request))


def _ask(services: Services, question: str) -> list:
    async def go() -> list:
        scheduler = new_scheduler(services.settings, services.engine)
        scheduler.start()
        try:
            request = AskRequest(question=question, top_k=2, max_tokens=4)
            return [e async for e in new_ask(services, scheduler=scheduler).ask(request)]
        finally:
            await asyncio.to_thread(scheduler.stop)

    return asyncio.run(go())


@pytest.fixture
def floored(make_fast_settings, make_fast_services, tmp_path: Path) -> Callable[[float | None], Services]:
    return lambda floor: _services(make_fast_settings, make_fast_services, floor, tmp_path / f"data-{floor}")


def test_below_the_floor_no_chunk_is_read_and_the_model_is_told(floored) -> None:
    services = floored(FLOOR)
    plan = _plan(services, OUT_OF_CORPUS)
    assert plan.best_score is not None and plan.best_score < FLOOR
    assert (plan.covered, plan.sources, plan.ordered, plan.layout.num_context_tokens) == (False, [], [], 0)
    engine = services.engine
    assert engine is not None
    expected = engine.prompt.layout([], f"{OUT_OF_CORPUS}\n\n{NOT_COVERED_NOTE}")
    assert plan.layout.all_ids() == expected.all_ids()
    events = _ask(services, OUT_OF_CORPUS)
    sources, done = events[0], events[-1]
    assert isinstance(sources, SourcesEvent) and isinstance(done, DoneEvent)
    assert (sources.sources, sources.notice) == ([], NOT_COVERED)
    assert (done.notice, done.citations, done.usage.context_tokens) == (NOT_COVERED, [], 0)


def test_above_the_floor_the_question_is_planned_as_without_one(floored) -> None:
    with_floor, without = _plan(floored(FLOOR), IN_CORPUS), _plan(floored(None), IN_CORPUS)
    assert with_floor.best_score is not None and with_floor.best_score >= FLOOR
    assert with_floor.best_score == without.best_score
    assert with_floor.covered and without.covered
    assert [s.title for s in with_floor.sources] == ["zorblat", "bread"]
    assert [(s.title, s.score) for s in with_floor.sources] == [(s.title, s.score) for s in without.sources]
    assert with_floor.layout.all_ids() == without.layout.all_ids()
    # Without a floor the out-of-corpus question still gets the closest chunks, as before.
    assert _plan(floored(None), OUT_OF_CORPUS).covered


def test_the_floor_in_force_is_the_embedders_unless_set() -> None:
    assert relevance_floor(RetrievalSettings()) == BUILTIN_EMBEDDER_FLOOR == 0.35  # builtin MiniLM, auto
    assert relevance_floor(RetrievalSettings(embedder="/models/e5-small")) is None  # nobody measured it
    assert relevance_floor(RetrievalSettings(embedder="/models/e5-small", relevance_floor=0.8)) == 0.8
    assert relevance_floor(RetrievalSettings(relevance_floor=None)) is None
    assert covers(0.35, 0.35) and not covers(0.349, 0.35) and not covers(None, 0.35) and covers(None, None)


# A follow-up that names nothing: with the hash embedder it shares no word with either document, so the query
# that mixes it with "What is the capital of Zorblat?" (weights 1 and 0.5) scores 0.239 on zorblat, under 0.3.
FOLLOW_UP = "What else?"
COVERED_TURN = (Turn("What is the capital of Zorblat?", "Quintaro."),)


def test_a_follow_up_is_judged_covered_the_way_its_conversation_is(
    make_fast_settings, make_fast_services, tmp_path: Path
) -> None:
    """As /v1 sends it (history, no stored sources): the earlier question's sources are retrieved again and
    anchor the query; without that anchor (weight 0) the mixed query's 0.239 would be under the floor, and the
    earlier question's own score on the retrieved chunk (0.594) is what covers it."""
    anchored = _services(make_fast_settings, make_fast_services, 0.3, tmp_path / "anchored")
    plan = _plan(anchored, FOLLOW_UP, COVERED_TURN)
    assert (plan.covered, [s.title for s in plan.sources]) == (True, ["zorblat", "bread"])
    assert (plan.query.num_turns_used, plan.query.num_sources_used) == (1, 2)
    plain = _services(make_fast_settings, make_fast_services, 0.3, tmp_path / "plain", followup_source_weight=0.0)
    plan = _plan(plain, FOLLOW_UP, COVERED_TURN)
    assert (plan.query.num_turns_used, plan.query.num_sources_used) == (1, 0)
    assert plan.query.questions == (FOLLOW_UP, COVERED_TURN[0].question)
    retriever = plain.retriever
    assert retriever is not None
    mixed = float(retriever.vectors_of([plan.sources[0].chunk_id])[0] @ plan.query.vector)
    asked = retriever.embedder.embed_queries(list(plan.query.questions))
    judged = round(float((retriever.vectors_of([s.chunk_id for s in plan.sources]) @ asked.T).max()), 6)
    assert (round(mixed, 3), round(judged, 3)) == (0.239, 0.594)
    assert (plan.covered, plan.best_score, [s.title for s in plan.sources]) == (True, judged, ["zorblat", "bread"])


def test_a_follow_up_in_a_conversation_the_documents_do_not_cover_gets_the_notice(floored) -> None:
    """The earlier question is under the floor: nothing is recalled for it (a stored turn would keep no
    sources either), and neither question covers what the mixed query retrieves."""
    plan = _plan(floored(0.3), FOLLOW_UP, (Turn(OUT_OF_CORPUS, "I do not know."),))
    assert (plan.query.num_turns_used, plan.query.num_sources_used) == (1, 0)
    assert plan.best_score is not None and plan.best_score < 0.3
    assert (plan.covered, plan.sources, plan.ordered) == (False, [], [])
