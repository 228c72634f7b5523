"""GET /conversations, GET/DELETE /conversations/{id} on SQLite and PostgreSQL: paging, owners, the
collections a conversation searched against those a caller may read, anonymous ones listed to nobody, 404s.

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
from app.build import Services
from app.catalog import Catalog
from app.catalog.conversations import NewTurn, Scope
from app.catalog.models import ApiKeyRow
from app.catalog.records import NewChunk, NewDocument
from app.services.conversation_service import ConversationService, owner_of
from app.services.key_service import KeyService
from app.settings import Settings
from app.state import AppState

KEY = "k-123"
ADMIN_KEY = "admin-secret"


@pytest.fixture(params=["sqlite", "postgresql"])
def catalog(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Catalog]:
    url = f"sqlite:///{tmp_path / 'cat.db'}" if request.param == "sqlite" else request.getfixturevalue("pg_url")
    c = Catalog(url)
    yield c
    c.close()


@pytest.fixture
def client(catalog: Catalog, tmp_path: Path) -> Iterator[TestClient]:
    app = FastAPI()
    settings = Settings(data_dir=tmp_path / "data")
    state = AppState(settings=settings, services=Services(settings, conversations=ConversationService(catalog)))
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


def _conversation(
    catalog: Catalog, owner: str | None, questions: list[str], sources: list[int], searched: Scope = None
) -> str:
    service = ConversationService(catalog)
    context = service.open(None, owner, None, searched)
    for q in questions:
        assert service.record(context, _turn(q, sources))
        context = service.open(context.conversation_id, owner, None, searched)
    return context.conversation_id


def _keyed_client(catalog: Catalog, tmp_path: Path, public: list[str]) -> TestClient:
    """The routes on a server with an admin key, collection keys in `catalog` and `public` collections."""
    app = FastAPI()
    settings = Settings(data_dir=tmp_path / "data", server={"api_key": ADMIN_KEY, "public_collections": public})
    # A changed grant counts at the next request (no key cache).
    services = Services(
        settings, conversations=ConversationService(catalog), keys=KeyService(catalog.keys, cache_s=0.0)
    )
    state = AppState(settings=settings, services=services)
    app.state.blendrag = state
    install_error_handlers(app)
    app.include_router(conversations.router)
    return TestClient(app)


def _ids(client: TestClient, headers: dict[str, str] | None = None, **params: str) -> list[str]:
    response = client.get("/conversations", headers=headers or {}, params=params)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["total"] == len(body["conversations"]) + body["offset"]
    return [c["id"] for c in body["conversations"]]


def test_list_is_paged_newest_first(client: TestClient, catalog: Catalog) -> None:
    ids = [_conversation(catalog, owner_of(KEY), [f"question {i}"], []) for i in range(3)]
    auth = {"X-API-Key": KEY}
    body = client.get("/conversations", params={"limit": 2}, headers=auth).json()
    assert body["total"] == 3 and (body["offset"], body["limit"]) == (0, 2)
    assert [c["id"] for c in body["conversations"]] == [ids[2], ids[1]]
    assert body["conversations"][0]["title"] == "question 2" and body["conversations"][0]["num_turns"] == 1
    rest = client.get("/conversations", params={"offset": 2, "limit": 2}, headers=auth).json()
    assert [c["id"] for c in rest["conversations"]] == [ids[0]]
    assert client.get("/conversations", params={"limit": 0}).status_code == 422


def test_anonymous_conversations_are_listed_to_nobody_but_reached_by_id(client: TestClient, catalog: Catalog) -> None:
    """Every caller without a key is the same "owner": listing would show one stranger's questions to the
    next. Its random id (which only the client that started it holds) is what reaches it."""
    first, second = (_conversation(catalog, None, [q], []) for q in ("first", "second"))
    assert client.get("/conversations").json() == {"total": 0, "offset": 0, "limit": 20, "conversations": []}
    assert client.get(f"/conversations/{first}").json()["title"] == "first"
    assert _ids(client, ids=f"{first},nope,{second},{first}") == [second, first]
    assert _ids(client, ids=second, headers={"X-API-Key": KEY}) == []  # a key's caller is another owner
    assert _ids(client, ids=f"{first},{second}", limit="1", offset="1") == [first]
    assert client.delete(f"/conversations/{first}").status_code == 204
    assert _ids(client, ids=f"{first},{second}") == [second]


def test_conversations_follow_the_collections_a_key_may_read(catalog: Catalog, tmp_path: Path) -> None:
    created = KeyService(catalog.keys).create("team", ["a", "b"], can_ingest=False)
    auth = {"Authorization": f"Bearer {created.secret}"}
    owner = owner_of(created.secret)
    over_a = _conversation(catalog, owner, ["over a"], [], frozenset({"a"}))
    over_ab = _conversation(catalog, owner, ["over a and b"], [], frozenset({"a", "b"}))
    everything = _conversation(catalog, owner, ["over every collection"], [], None)
    with _keyed_client(catalog, tmp_path, public=[]) as client:
        assert _ids(client, auth) == [over_ab, over_a]
        assert client.get(f"/conversations/{everything}", headers=auth).status_code == 404
        assert client.get(f"/conversations/{over_ab}", headers=auth).status_code == 200
        # The admin narrows the key's grant to `a`: the conversation that also searched `b` is gone for it.
        with catalog._session() as s:  # noqa: SLF001 (no route narrows a key; the grant is read per request)
            s.get(ApiKeyRow, created.record.id).collections = ["a"]
        assert _ids(client, auth) == [over_a]
        assert _ids(client, auth, ids=f"{over_a},{over_ab},{everything}") == [over_a]
        assert client.get(f"/conversations/{over_ab}", headers=auth).status_code == 404
        assert client.delete(f"/conversations/{over_ab}", headers=auth).status_code == 404
        assert catalog.conversations.get(over_ab, owner, None) is not None  # hidden, not lost
        # Revoked: the key is refused outright.
        assert KeyService(catalog.keys).revoke(created.record.id)
        assert client.get("/conversations", headers=auth).status_code == 401
        assert client.get(f"/conversations/{over_a}", headers=auth).status_code == 401


def test_keyless_conversations_stay_hidden_once_keys_and_public_collections_exist(
    catalog: Catalog, tmp_path: Path
) -> None:
    """The trial's finding: conversations made on an open server (every collection searched) were listed
    to, read by and continued by anonymous callers of `public_collections: [beta]`."""
    before_keys = _conversation(catalog, None, ["what is in default?"], [], None)
    over_beta = _conversation(catalog, None, ["what is in beta?"], [], frozenset({"beta"}))
    with _keyed_client(catalog, tmp_path, public=["beta"]) as client:
        assert _ids(client) == []
        assert _ids(client, ids=f"{before_keys},{over_beta}") == [over_beta]
        assert client.get(f"/conversations/{before_keys}").status_code == 404
        assert client.delete(f"/conversations/{before_keys}").status_code == 404
        assert client.get(f"/conversations/{over_beta}").status_code == 200
        admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
        assert _ids(client, admin, ids=f"{before_keys},{over_beta}") == []  # the admin key is another owner
    # A public scope narrowed from [beta] to [alpha] hides what was asked over beta.
    with _keyed_client(catalog, tmp_path, public=["alpha"]) as client:
        assert client.get(f"/conversations/{over_beta}").status_code == 404
        assert _ids(client, ids=over_beta) == []


def test_detail_has_turns_with_answers_and_sources(client: TestClient, catalog: Catalog) -> None:
    doc = catalog.add_document(NewDocument(title="Timeouts"))
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
    assert client.get(f"/conversations/{anonymous}").status_code == 200
