"""An answer written mostly in code names no source has says so in its `done` notice (issue 62, item 8), which
/ask, /v1's `blendrag` field, the chat page and `blendrag ask` show with the answer."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from app.build import Services, new_ask, new_ingest, new_scheduler
from app.services.ask.types import AskRequest, DoneEvent
from app.services.ingest import IngestSource

DOC = "Quintaro is the capital of Zorblat. Call `kite_festival(month)` to list the festivals of a month."
INVENTED = (
    "2 of the 3 code names in this answer are in none of its sources: "
    "it is likely invented, not drawn from your documents"
)


@pytest.fixture
def ingested(services: Services) -> str:
    service = new_ingest(services)
    submitted = service.submit([IngestSource(kind="text", title="zorblat", text=DOC)], enqueue=False)
    service.run_job(submitted.job_id)
    return submitted.document_ids[0]


def _scripted(monkeypatch: pytest.MonkeyPatch, pieces: list[str]) -> None:
    """The tiny model writes random tokens: the text they decode to is scripted, one piece per token."""
    from engine.sampling import IncrementalDetokenizer

    def script() -> Iterator[str]:
        yield from pieces
        while True:
            yield ""

    lines = script()
    monkeypatch.setattr(IncrementalDetokenizer, "add", lambda self, token_id: next(lines))


def _done(services: Services, max_tokens: int) -> DoneEvent:
    async def go() -> DoneEvent:
        scheduler = new_scheduler(services.settings, services.engine)
        scheduler.start()
        try:
            request = AskRequest(question="How do I list festivals?", top_k=1, max_tokens=max_tokens)
            events = [e async for e in new_ask(services, scheduler=scheduler).ask(request)]
        finally:
            await asyncio.to_thread(scheduler.stop)
        assert isinstance(events[-1], DoneEvent)
        return events[-1]

    return asyncio.run(go())


def test_mostly_invented_names_put_a_notice_in_done(
    services: Services, ingested: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _scripted(monkeypatch, ["Call `relationship_loader()`", " with `back_populates_map`", " and `kite_festival`."])
    done = _done(services, max_tokens=3)
    assert done.answer == "Call `relationship_loader()` with `back_populates_map` and `kite_festival`."
    assert [u.identifier for u in done.unsupported_identifiers] == ["relationship_loader", "back_populates_map"]
    assert done.notice == INVENTED


def test_one_unsupported_name_of_two_is_no_notice(
    services: Services, ingested: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _scripted(monkeypatch, ["Call `kite_festival`", " with `festival_month`."])
    done = _done(services, max_tokens=2)
    assert [u.identifier for u in done.unsupported_identifiers] == ["festival_month"]
    assert done.notice is None


def test_the_cli_prints_the_notice_between_the_answer_and_its_sources(capsys: pytest.CaptureFixture[str]) -> None:
    from app.cli.ask import _print_sources

    source = {"rank": 1, "title": "zorblat", "section": None, "page": None, "score": 0.41}
    _print_sources([source], INVENTED)
    assert capsys.readouterr().out == f"\n\n[{INVENTED}]\n\nSources:\n  [1] zorblat (score 0.410)\n"
