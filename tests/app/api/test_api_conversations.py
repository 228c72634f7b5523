"""GET /conversations, GET/DELETE /conversations/{id} on SQLite and PostgreSQL: paging, owners, 404s.

The routes run in a FastAPI app holding only them and a real catalog (no model needed); the turns the
/ask route stores are tested in test_api_ask_conversation.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pgserver import pg_server, pg_url  # noqa: F401  (a real PostgreSQL server, see tests/pgserver.py)

from app.api import conversations
from app.api.errors import install_error_handlers
from app.catalog import Catalog
from app.catalog.conversations import NewTurn
from app.catalog.repository import NewChunk
from app.services.conversation_service import ConversationService, owner_of
from app.settings import Settings
from app.state import AppState

KEY = "k-123"


@pytest.fixture(params=["sqlite", "postgresql"])
def catalog(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Catalog]:
    url = f"sqlite:///{tmp_path / 'cat.db'}" if request.param == "sqlite" else request.getfixturevalue("pg_url")
    c = Catalog(url)
    yield c
    c.close()


@pytest.fixture
def client(catalog: Catalog, tmp_path: Path) -> Iterator[TestClient]:
    app = FastAPI()
    state = AppState(settings=Settings(data_dir=tmp_path / "data"))
    state.conversations = ConversationService(catalog)
    app.state.blendrag = state
    install_error_handlers(app)
    app.include_router(conversations.router)
    with TestClient(app) as c:
        yield c


def _turn(q: str, sources: list[int]) -> NewTurn:
    return NewTurn(
        question=q,
        answer=f"answer to {q}",
        source_chunk_ids=sources,
        mode="blend",
        selector="query",
        recompute_ratio=0.15,
        timings={"ttft_ms": 10.0},
        usage={"history_tokens": 0, "history_reused_tokens": 0},
    )


def _conversation(catalog: Catalog, owner: str | None, questions: list[str], sources: list[int]) -> str:
    service = ConversationService(catalog)
    context = service.open(None, owner)
    for q in questions:
        assert service.record(context, _turn(q, sources))
        context = service.open(context.conversation_id, owner)
    return context.conversation_id


def test_list_is_paged_newest_first(client: TestClient, catalog: Catalog) -> None:
    ids = [_conversation(catalog, None, [f"question {i}"], []) for i in range(3)]
    body = client.get("/conversations", params={"limit": 2}).json()
    assert body["total"] == 3 and (body["offset"], body["limit"]) == (0, 2)
    assert [c["id"] for c in body["conversations"]] == [ids[2], ids[1]]
    assert body["conversations"][0]["title"] == "question 2" and body["conversations"][0]["num_turns"] == 1
    rest = client.get("/conversations", params={"offset": 2, "limit": 2}).json()
    assert [c["id"] for c in rest["conversations"]] == [ids[0]]
    assert client.get("/conversations", params={"limit": 0}).status_code == 422


def test_detail_has_turns_with_answers_and_sources(client: TestClient, catalog: Catalog) -> None:
    doc = catalog.add_document(title="Timeouts", source_path=None, content_hash=None, tags=[], metadata={}, job_id=None)
    chunk_ids = catalog.replace_chunks(
        doc.id,
        [NewChunk(index=i, text=f"t{i}", token_ids=[1, 2], page=i + 1, char_start=0, char_end=2) for i in range(2)],
    )
    cid = _conversation(catalog, None, ["How do I set a timeout?", "And connect only?"], [chunk_ids[1], chunk_ids[0]])
    body = client.get(f"/conversations/{cid}").json()
    assert body["id"] == cid and body["title"] == "How do I set a timeout?" and body["num_turns"] == 2
    assert [(t["index"], t["question"], t["answer"]) for t in body["turns"]] == [
        (0, "How do I set a timeout?", "answer to How do I set a timeout?"),
        (1, "And connect only?", "answer to And connect only?"),
    ]
    assert body["turns"][0]["sources"] == [
        {"rank": 1, "chunk_id": chunk_ids[1], "document_id": doc.id, "title": "Timeouts", "page": 2},
        {"rank": 2, "chunk_id": chunk_ids[0], "document_id": doc.id, "title": "Timeouts", "page": 1},
    ]
    turn = body["turns"][1]
    assert (turn["mode"], turn["selector"], turn["recompute_ratio"]) == ("blend", "query", 0.15)
    assert turn["timings"] == {"ttft_ms": 10.0}
    # A source whose document is gone is left out; the turn stays.
    catalog.delete_document(doc.id)
    assert client.get(f"/conversations/{cid}").json()["turns"][0]["sources"] == []


def test_unknown_deleted_and_foreign_conversations_are_404(client: TestClient, catalog: Catalog) -> None:
    assert client.get("/conversations/nope").status_code == 404
    assert client.delete("/conversations/nope").status_code == 404
    mine = _conversation(catalog, owner_of(KEY), ["mine"], [])
    anonymous = _conversation(catalog, None, ["anonymous"], [])
    auth = {"Authorization": f"Bearer {KEY}"}
    assert client.get(f"/conversations/{mine}").status_code == 404  # without the key: not yours
    assert client.get(f"/conversations/{mine}", headers={"X-API-Key": "other"}).status_code == 404
    assert client.get(f"/conversations/{anonymous}", headers=auth).status_code == 404
    assert [c["id"] for c in client.get("/conversations", headers=auth).json()["conversations"]] == [mine]
    assert client.get(f"/conversations/{mine}", headers=auth).json()["title"] == "mine"
    response = client.delete(f"/conversations/{mine}", headers=auth)
    assert response.status_code == 204 and response.content == b""
    assert client.get(f"/conversations/{mine}", headers=auth).status_code == 404
    assert client.delete(f"/conversations/{mine}", headers=auth).status_code == 404
    assert client.get("/conversations", headers=auth).json()["total"] == 0
    assert client.get("/conversations").json()["total"] == 1
