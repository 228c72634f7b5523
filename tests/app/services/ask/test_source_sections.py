"""Each source names the section its passage sits in (the nearest heading), not only its document."""

from __future__ import annotations

import asyncio

from app.build import Services, new_ask, new_ingest, new_scheduler
from app.services.ask.types import AskRequest, SourcesEvent
from app.services.ingest import IngestSource
from retrieval.types import SearchFilters

SECTIONS = {
    "Field aliases": "An alias lets a field be read under another name. " * 6,
    "Extra fields": "By default extra fields are ignored; forbid makes them an error. " * 6,
    "Serialization": "A model is turned into a dict or into JSON text by its dump methods. " * 6,
}
PAGE = "\n\n".join(f"## {heading}\n\n{body.strip()}" for heading, body in SECTIONS.items())


def test_every_source_names_the_heading_its_passage_starts_under(make_fast_services, make_fast_settings) -> None:
    services: Services = make_fast_services(make_fast_settings(ingest={"chunk_tokens": 48, "chunk_overlap": 8}))
    ingest = new_ingest(services)
    submitted = ingest.submit([IngestSource(kind="text", title="models.md", text=PAGE)], enqueue=False)
    ingest.run_job(submitted.job_id)
    [document_id] = submitted.document_ids
    chunks = services.catalog.chunks_of(document_id)
    assert len(chunks) > 6  # the page is cut inside sections, so most chunks open with no heading

    async def sources() -> list:
        scheduler = new_scheduler(services.settings, services.engine)
        scheduler.start()
        try:
            request = AskRequest(question="extra fields", top_k=len(chunks), max_tokens=1, filters=SearchFilters())
            events = [e async for e in new_ask(services, scheduler=scheduler).ask(request)]
        finally:
            await asyncio.to_thread(scheduler.stop)
        assert isinstance(events[0], SourcesEvent)
        return events[0].sources

    found = {s.chunk_id: (s.title, s.section) for s in asyncio.run(sources())}
    assert len(found) == len(chunks)
    for chunk in chunks:
        # The heading in force at the chunk's first character, read from the page itself.
        starts = [PAGE.index(f"## {h}") for h in SECTIONS]
        expected = [h for h, at in zip(SECTIONS, starts, strict=True) if at <= chunk.char_start][-1]
        assert found[chunk.id] == ("models.md", expected), (chunk.char_start, chunk.text[:40])
