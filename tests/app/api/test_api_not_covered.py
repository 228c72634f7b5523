"""The relevance floor through the HTTP API, on the real MiniLM embedder at its shipped floor (`auto`): a
question the corpus does not cover gets no sources and the notice in /ask's `sources` and `done` and in
/v1's `blendrag` field; a question it covers is answered from its sources, without a notice."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from apitools import ingest_corpus, server_settings
from fastapi.testclient import TestClient

from app.main import create_app
from app.services.ask.types import NOT_COVERED
from app.sse_reader import parse_sse

COVERED = "What is the capital of the planet Zorblat?"
NOT_IN_CORPUS = "How many calories are in a banana?"


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory, tiny_llama_dir: Path) -> Iterator[TestClient]:
    settings = server_settings(
        tmp_path_factory.mktemp("floor") / "data", tiny_llama_dir, retrieval={"relevance_floor": "auto"}
    )
    with TestClient(create_app(settings, load_in_background=False)) as c:
        ingest_corpus(c)
        yield c


def _ask(client: TestClient, question: str) -> list[tuple[str | None, dict]]:
    response = client.post("/ask", json={"question": question, "top_k": 2, "max_tokens": 2})
    assert response.status_code == 200, response.text
    return parse_sse(response.text)


def test_a_question_the_documents_do_not_cover_says_so(client: TestClient) -> None:
    events = _ask(client, NOT_IN_CORPUS)
    (first, sources), (last, done) = events[0], events[-1]
    assert (first, last) == ("sources", "done")
    assert (sources["sources"], sources["notice"]) == ([], NOT_COVERED)
    assert (done["notice"], done["citations"], done["usage"]["context_tokens"]) == (NOT_COVERED, [], 0)
    answer = client.post(
        "/v1/chat/completions",
        json={"model": "blendrag", "messages": [{"role": "user", "content": NOT_IN_CORPUS}], "max_tokens": 2},
    ).json()
    assert (answer["sources"], answer["blendrag"]["notice"]) == ([], NOT_COVERED)


def test_a_question_they_cover_keeps_its_sources(client: TestClient) -> None:
    events = _ask(client, COVERED)
    (_, sources), (_, done) = events[0], events[-1]
    assert [s["title"] for s in sources["sources"]][0] == "Zorblat facts"
    assert sources["sources"][0]["score"] >= 0.35  # the builtin embedder's floor
    assert (sources["notice"], done["notice"]) == (None, None)
    assert done["usage"]["context_tokens"] > 0
