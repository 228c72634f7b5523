"""An answer written mostly in code names no source has: /ask's `done` and /v1's `blendrag` field carry the
notice that says so (issue 62, item 8), on a real server whose answer text is scripted."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from app.sse_reader import parse_sse

QUESTION = "What is the capital of Zorblat?"
PIECES = ["Quintaro is loaded by `capital_loader()`", " and `river_map`."]
INVENTED = (
    "2 of the 2 code names in this answer are in none of its sources: "
    "it is likely invented, not drawn from your documents"
)


@pytest.fixture
def scripted(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tiny model writes random tokens: the text they decode to is scripted, one piece per token."""
    from engine.sampling import IncrementalDetokenizer

    def script() -> Iterator[str]:
        while True:
            yield from PIECES
            yield from [""] * 8  # the rest of this answer's tokens; the next answer starts the script again

    pieces = script()
    monkeypatch.setattr(IncrementalDetokenizer, "add", lambda self, token_id: next(pieces))


def test_ask_and_v1_carry_the_notice(client: TestClient, corpus: dict[str, str], scripted: None) -> None:
    response = client.post("/ask", json={"question": QUESTION, "top_k": 1, "max_tokens": 10})
    events = parse_sse(response.text)
    (_, sources), (_, done) = events[0], events[-1]
    assert [s["title"] for s in sources["sources"]] == ["Zorblat facts"]
    assert done["answer"] == "".join(PIECES)
    assert [u["identifier"] for u in done["unsupported_identifiers"]] == ["capital_loader", "river_map"]
    assert done["notice"] == INVENTED
    answer = client.post(
        "/v1/chat/completions",
        json={"model": "blendrag", "messages": [{"role": "user", "content": QUESTION}], "max_tokens": 10},
    ).json()
    assert answer["choices"][0]["message"]["content"] == "".join(PIECES)
    assert answer["blendrag"]["notice"] == INVENTED
