"""Collections and keys over HTTP: every route classified, two collection keys isolated on every scoped
route (a document about the same subject in each collection), anonymous questions refused once keys exist,
`server.public_collections`, and the admin's key and collection routes."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from apitools import server_settings, wait_for_job
from fastapi.testclient import TestClient

from app.catalog import DocumentStatus
from app.catalog.records import NewDocument
from app.main import create_app

ADMIN_KEY = "admin-secret"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
QUESTION = "What is the capital of Zorblat?"
DOCS = {
    "team-a": {"title": "Zorblat report", "text": "Quintaro is the capital of Zorblat. Its kite festival is in May."},
    "team-b": {"title": "Zorblat notes", "text": "Quintaro is the capital of Zorblat. Its purple rivers freeze."},
}

# Every route of the OpenAPI document, by who may use it. A new route must be added to one of these (the
# test below fails otherwise), and the behaviour test checks each class against a real collection key.
ADMIN_ONLY = {
    ("GET", "/metrics"),
    ("GET", "/api/index"),
    ("POST", "/admin/keys"),
    ("GET", "/admin/keys"),
    ("DELETE", "/admin/keys/{key_id}"),
    ("DELETE", "/collections/{name}"),
}
COLLECTION_SCOPED = {
    ("POST", "/ingest"),
    ("GET", "/ingest/jobs"),
    ("GET", "/ingest/jobs/{job_id}"),
    ("POST", "/ingest/jobs/{job_id}/cancel"),
    ("GET", "/ingest/jobs/{job_id}/events"),
    ("GET", "/documents"),
    ("DELETE", "/documents"),
    ("GET", "/documents/{document_id}"),
    ("DELETE", "/documents/{document_id}"),
    ("GET", "/collections"),
    ("GET", "/api/coverage"),
    ("GET", "/api/stats"),
    ("POST", "/ask"),
    ("GET", "/api/defaults"),
    ("POST", "/v1/chat/completions"),
    ("GET", "/v1/models"),
    ("GET", "/conversations"),
    ("GET", "/conversations/{conversation_id}"),
    ("DELETE", "/conversations/{conversation_id}"),
    ("GET", "/syncs"),
    ("POST", "/syncs/plan"),
    ("POST", "/syncs/remove"),
    ("POST", "/syncs/finish"),
}
# Public by design: liveness, readiness and text rendering (Markdown of the caller's own text) show no
# document, chunk or conversation.
PUBLIC = {("GET", "/health"), ("GET", "/ready"), ("POST", "/api/render")}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, tiny_llama_dir: Path) -> Iterator[TestClient]:
    settings = server_settings(
        tmp_path_factory.mktemp("collections") / "data",
        tiny_llama_dir,
        server={"api_key": ADMIN_KEY},
        engine={"max_new_tokens": 2},
    )
    with TestClient(create_app(settings, load_in_background=False)) as client:
        yield client


def make_key(client: TestClient, name: str, collections: list[str], can_ingest: bool = False) -> dict[str, str]:
    made = client.post(
        "/admin/keys", json={"name": name, "collections": collections, "can_ingest": can_ingest}, headers=ADMIN
    )
    assert made.status_code == 201, made.text
    body = made.json()
    assert re.fullmatch(r"brk_[A-Za-z0-9_-]{43}", body["key"])
    return {"Authorization": f"Bearer {body['key']}", "key_id": body["key_id"]}


def bearer(key: dict[str, str]) -> dict[str, str]:
    return {"Authorization": key["Authorization"]}


@pytest.fixture(scope="module")
def world(server: TestClient) -> dict[str, Any]:
    """Two collection keys (A may ingest), a document about Zorblat in each collection, ingested by A's key
    into team-a and by the admin into team-b, and a read-only key for team-a."""
    key_a = make_key(server, "team A", ["team-a"], can_ingest=True)
    key_b = make_key(server, "team B", ["team-b"])
    reader_a = make_key(server, "team A reader", ["team-a"])
    docs: dict[str, str] = {}
    jobs: dict[str, str] = {}
    for collection, headers in (("team-a", bearer(key_a)), ("team-b", ADMIN)):
        accepted = server.post(
            "/ingest", json={"documents": [DOCS[collection]], "collection": collection}, headers=headers
        )
        assert accepted.status_code == 202, accepted.text
        job = wait_for_job(server, accepted.json()["job_id"], headers=headers)
        assert (job["status"], job["collection"]) == ("succeeded", collection)
        docs[collection], jobs[collection] = job["document_ids"][0], job["job_id"]
    return {"a": bearer(key_a), "b": bearer(key_b), "reader_a": bearer(reader_a), "docs": docs, "jobs": jobs}


def test_every_route_is_classified(server: TestClient) -> None:
    routes = {
        (method.upper(), path) for path, item in server.get("/openapi.json").json()["paths"].items() for method in item
    }
    classified = ADMIN_ONLY | COLLECTION_SCOPED | PUBLIC
    assert routes - classified == set(), "classify the new route(s) in this test"
    assert classified - routes == set()
    assert not (ADMIN_ONLY & COLLECTION_SCOPED or ADMIN_ONLY & PUBLIC or COLLECTION_SCOPED & PUBLIC)


def _call(client: TestClient, method: str, path: str, headers: dict[str, str]) -> int:
    concrete = re.sub(r"\{[^}]+\}", "unknown-id", path)
    body: dict[str, Any] | None = None
    if path == "/api/render":
        body = {"text": "hi"}
    return client.request(method, concrete, headers=headers, json=body).status_code


def test_each_class_behaves_as_classified(server: TestClient, world: dict[str, Any]) -> None:
    for method, path in sorted(ADMIN_ONLY):
        assert _call(server, method, path, world["b"]) == 403, (method, path)
        assert _call(server, method, path, {}) == 401, (method, path)
    for method, path in sorted(COLLECTION_SCOPED):
        status = _call(server, method, path, world["b"])
        assert status not in (401, 403) or (method, path) in _WRITES, (method, path, status)
        assert _call(server, method, path, {}) == 401, (method, path)  # keys exist: nothing anonymous
    for method, path in sorted(PUBLIC):
        assert _call(server, method, path, {}) == 200, (method, path)


# Scoped routes that change the library: a key without can_ingest is refused (403).
_WRITES = {
    ("POST", "/ingest"),
    ("POST", "/ingest/jobs/{job_id}/cancel"),
    ("DELETE", "/documents"),
    ("DELETE", "/documents/{document_id}"),
}


def _ask(client: TestClient, headers: dict[str, str], **extra: Any) -> Any:
    return client.post("/ask", json={"question": QUESTION, "stream": False, "top_k": 4, **extra}, headers=headers)


def test_questions_retrieve_only_the_keys_collection(server: TestClient, world: dict[str, Any]) -> None:
    docs = world["docs"]
    for who, collection in (("a", "team-a"), ("b", "team-b")):
        answer = _ask(server, world[who])
        assert answer.status_code == 200, answer.text
        assert [s["document_id"] for s in answer.json()["sources"]] == [docs[collection]]
        chat = server.post(
            "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": QUESTION}], "max_tokens": 2},
            headers=world[who],
        )
        assert chat.status_code == 200, chat.text
        assert [s["document_id"] for s in chat.json()["sources"]] == [docs[collection]]
    both = _ask(server, ADMIN)
    assert sorted(s["document_id"] for s in both.json()["sources"]) == sorted(docs.values())
    narrowed = _ask(server, ADMIN, collections=["team-b"])
    assert [s["document_id"] for s in narrowed.json()["sources"]] == [docs["team-b"]]
    refused = _ask(server, world["a"], collections=["team-a", "team-b"])
    assert refused.status_code == 403
    assert refused.json()["detail"] == "this key may not read collection 'team-b'"
    chat_refused = server.post(
        "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": QUESTION}], "collections": ["team-b"]},
        headers=world["a"],
    )
    assert chat_refused.status_code == 403


def test_documents_are_scoped_and_another_collections_look_unknown(server: TestClient, world: dict[str, Any]) -> None:
    docs = world["docs"]
    listed = server.get("/documents", headers=world["b"]).json()
    assert (listed["total"], [d["id"] for d in listed["documents"]]) == (1, [docs["team-b"]])
    assert listed["documents"][0]["collection"] == "team-b"
    assert server.get("/documents", headers=ADMIN).json()["total"] == 2
    own = server.get(f"/documents/{docs['team-a']}", headers=world["a"])
    assert own.status_code == 200 and own.json()["collection"] == "team-a"
    foreign = server.get(f"/documents/{docs['team-a']}", headers=world["b"])
    unknown = server.get("/documents/no-such-id", headers=world["b"])
    assert (foreign.status_code, unknown.status_code) == (404, 404)
    assert foreign.json()["detail"] == f"no document {docs['team-a']}"
    # A delete of another collection's document answers what a delete of an unknown id does, and deletes nothing.
    writer_b = make_key(server, "team B writer", ["team-b"], can_ingest=True)
    assert server.delete(f"/documents/{docs['team-a']}", headers=bearer(writer_b)).status_code == 204
    assert server.delete("/documents/no-such-id", headers=bearer(writer_b)).status_code == 204
    assert server.get(f"/documents/{docs['team-a']}", headers=world["a"]).status_code == 200
    read_only = server.delete(f"/documents/{docs['team-b']}", headers=world["b"])
    assert read_only.status_code == 403
    assert server.delete("/documents", params={"status": "failed"}, headers=world["b"]).status_code == 403
    # A failed document of team-a: B's purge leaves it, and B's own job list and cancel never see A's job.
    catalog = server.app.state.blendrag.services.catalog
    failed = catalog.add_document(NewDocument(title="broken", collection="team-a"))
    catalog.set_document_status(failed.id, DocumentStatus.FAILED, error="unreadable")
    assert server.delete("/documents", params={"status": "failed"}, headers=bearer(writer_b)).json() == {"deleted": 0}
    assert server.post(f"/ingest/jobs/{world['jobs']['team-a']}/cancel", headers=bearer(writer_b)).status_code == 404
    assert server.get(f"/documents/{failed.id}", headers=ADMIN).status_code == 200
    assert server.delete("/documents", params={"status": "failed"}, headers=world["a"]).json() == {"deleted": 1}


def test_ingest_is_refused_outside_the_keys_grant_before_anything_is_stored(
    server: TestClient, world: dict[str, Any]
) -> None:
    before = server.get("/documents", headers=ADMIN).json()["total"]
    jobs_before = len(server.get("/ingest/jobs", params={"limit": 100}, headers=ADMIN).json()["jobs"])
    doc = {"documents": [{"title": "x", "text": "Something new about Zorblat."}]}
    into_b = server.post("/ingest", json={**doc, "collection": "team-b"}, headers=world["a"])
    assert (into_b.status_code, into_b.json()["detail"]) == (403, "this key may not write to collection 'team-b'")
    two = make_key(server, "teams A and B", ["team-a", "team-b"], can_ingest=True)
    default = server.post("/ingest", json=doc, headers=bearer(two))  # two collections, none named: `default`
    assert (default.status_code, default.json()["detail"]) == (403, "this key may not write to collection 'default'")
    read_only = server.post("/ingest", json={**doc, "collection": "team-a"}, headers=world["reader_a"])
    assert (read_only.status_code, read_only.json()["detail"]) == (403, "this key may not ingest or delete documents")
    upload = server.post(
        "/ingest",
        files=[("files", ("z.txt", b"Zorblat upload", "text/plain"))],
        data={"collection": "team-b"},
        headers=world["a"],
    )
    assert upload.status_code == 403
    assert server.get("/documents", headers=ADMIN).json()["total"] == before
    assert len(server.get("/ingest/jobs", params={"limit": 100}, headers=ADMIN).json()["jobs"]) == jobs_before
    assert not any((server.app.state.blendrag.settings.uploads_dir).glob("*/*"))


def test_a_key_with_one_collection_ingests_into_it_without_naming_it(server: TestClient, world: dict[str, Any]) -> None:
    """The trial: a key granted exactly one writable collection got 403 "may not write to collection
    'default'" for an ingest without `collection`. It goes to the key's collection, JSON and multipart."""
    doc = {"documents": [{"title": "Moons", "text": "Zorblat has three moons."}]}
    accepted = server.post("/ingest", json=doc, headers=world["a"])
    assert accepted.status_code == 202, accepted.text
    job = wait_for_job(server, accepted.json()["job_id"], headers=world["a"])
    assert (job["status"], job["collection"]) == ("succeeded", "team-a")
    files = [("files", ("m.txt", b"Zorblat's moons are grey.", "text/plain"))]
    upload = server.post("/ingest", files=files, headers=world["a"])
    assert upload.status_code == 202, upload.text
    uploaded = wait_for_job(server, upload.json()["job_id"], headers=world["a"])
    assert (uploaded["status"], uploaded["collection"]) == ("succeeded", "team-a")
    for doc_id in job["document_ids"] + uploaded["document_ids"]:
        assert server.delete(f"/documents/{doc_id}", headers=world["a"]).status_code == 204


def test_jobs_coverage_stats_and_collections_are_scoped(server: TestClient, world: dict[str, Any]) -> None:
    jobs = world["jobs"]
    listed = server.get("/ingest/jobs", headers=world["b"]).json()["jobs"]
    assert {j["job_id"] for j in listed} == {jobs["team-b"]}
    assert server.get(f"/ingest/jobs/{jobs['team-a']}", headers=world["b"]).status_code == 404
    assert server.get(f"/ingest/jobs/{jobs['team-a']}/events", headers=world["b"]).status_code == 404
    assert server.post(f"/ingest/jobs/{jobs['team-b']}/cancel", headers=world["b"]).status_code == 403
    assert server.get(f"/ingest/jobs/{jobs['team-b']}", headers=world["b"]).json()["status"] == "succeeded"
    coverage = server.get("/api/coverage", headers=world["a"]).json()
    assert [d["document_id"] for d in coverage["documents"]] == [world["docs"]["team-a"]]
    assert coverage["chunks_total"] == 1
    stats = server.get("/api/stats", headers=world["a"]).json()
    assert stats["documents_by_status"] == {"pending": 0, "ready": 1, "failed": 0}
    assert stats["conversations"] is None
    # What sums up every collection is the admin's: other collections' question times, KV entries, counts.
    server.post("/ask", json={"question": QUESTION, "stream": False, "max_tokens": 1}, headers=world["b"])
    assert (stats := server.get("/api/stats", headers=world["a"]).json())["recent"] == []
    assert (stats["ttft_by_mode"], stats["kv_tiers"], stats["kv_hit_rate"]) == ({}, [], None)
    assert (stats["ask_kv_hits"], stats["ask_kv_misses"], stats["ingest_chunks"], stats["ingest_seconds"]) == (
        None,
        None,
        None,
        None,
    )
    footprint = stats["kv_footprint"]
    assert (footprint["disk_budget_bytes"], footprint["disk_bytes"], footprint["disk_entries"]) == (None, None, None)
    admin_stats = server.get("/api/stats", headers=ADMIN).json()
    assert len(admin_stats["recent"]) >= 1 and admin_stats["ingest_chunks"] >= 2
    collections = server.get("/collections", headers=world["b"]).json()["collections"]
    assert collections == [
        {
            "name": "team-b",
            "num_documents": 1,
            "num_ready_documents": 1,
            "num_chunks": 1,
            "chunks_fresh": 1,
            "coverage": 1.0,
        }
    ]
    every = server.get("/collections", headers=ADMIN).json()["collections"]
    assert [c["name"] for c in every] == ["team-a", "team-b"]


def test_conversations_belong_to_the_key(server: TestClient, world: dict[str, Any]) -> None:
    first = _ask(server, world["a"], conversation_id="new")
    conversation_id = first.json()["conversation_id"]
    assert server.get(f"/conversations/{conversation_id}", headers=world["a"]).status_code == 200
    assert server.get(f"/conversations/{conversation_id}", headers=world["b"]).status_code == 404
    assert _ask(server, world["b"], conversation_id=conversation_id).status_code == 404
    assert conversation_id not in {
        c["id"] for c in server.get("/conversations", headers=world["b"]).json()["conversations"]
    }
    assert server.delete(f"/conversations/{conversation_id}", headers=world["b"]).status_code == 404


def test_anonymous_questions_are_refused_once_keys_exist(server: TestClient, world: dict[str, Any]) -> None:
    for method, path, body in (
        ("POST", "/ask", {"question": QUESTION, "stream": False}),
        ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": QUESTION}]}),
        ("GET", "/v1/models", None),
        ("GET", "/api/defaults", None),
        ("GET", "/conversations", None),
    ):
        response = server.request(method, path, json=body)
        assert response.status_code == 401, (path, response.text)
    wrong = server.post("/ask", json={"question": QUESTION}, headers={"Authorization": "Bearer brk_made-up"})
    assert wrong.status_code == 401


def test_keys_are_listed_without_secrets_and_revoked_at_once(server: TestClient, world: dict[str, Any]) -> None:
    temp = make_key(server, "temporary", ["team-a"])
    assert _ask(server, bearer(temp)).status_code == 200
    listed = {k["key_id"]: k for k in server.get("/admin/keys", headers=ADMIN).json()["keys"]}
    entry = listed[temp["key_id"]]
    assert (entry["name"], entry["collections"], entry["can_ingest"]) == ("temporary", ["team-a"], False)
    assert entry["last_used_at"] is not None
    assert set(entry) == {"key_id", "name", "collections", "can_ingest", "created_at", "last_used_at"}
    assert server.delete(f"/admin/keys/{temp['key_id']}", headers=ADMIN).status_code == 204
    assert _ask(server, bearer(temp)).status_code == 401
    assert server.delete(f"/admin/keys/{temp['key_id']}", headers=ADMIN).status_code == 404
    bad = server.post("/admin/keys", json={"name": "x", "collections": ["no spaces"]}, headers=ADMIN)
    assert bad.status_code == 422
    none = server.post("/admin/keys", json={"name": "x", "collections": []}, headers=ADMIN)
    assert none.status_code == 422


def test_deleting_a_collection_keeps_kv_entries_another_collection_uses(
    server: TestClient, world: dict[str, Any]
) -> None:
    same = {"title": "Shared text", "text": "Both teams keep this very same sentence about Zorblat's moons."}
    ids = {}
    for collection in ("gone", "stays"):
        accepted = server.post("/ingest", json={"documents": [same], "collection": collection}, headers=ADMIN)
        job = wait_for_job(server, accepted.json()["job_id"], headers=ADMIN)
        assert job["status"] == "succeeded", job  # the same text in another collection is no duplicate
        ids[collection] = job["document_ids"][0]
    state = server.app.state.blendrag
    key = state.services.catalog.chunks_of(ids["stays"])[0].kv_key
    assert key == state.services.catalog.chunks_of(ids["gone"])[0].kv_key  # one entry, shared by content
    deleted = server.delete("/collections/gone", headers=ADMIN)
    assert deleted.json() == {"name": "gone", "deleted": 1}
    assert server.get(f"/documents/{ids['gone']}", headers=ADMIN).status_code == 404
    assert state.services.store.contains(key)
    assert server.delete("/collections/gone", headers=ADMIN).status_code == 404
    assert server.delete("/collections/stays", headers=ADMIN).json()["deleted"] == 1
    assert not state.services.store.contains(key)


@pytest.fixture(scope="module")
def public_server(tmp_path_factory: pytest.TempPathFactory, tiny_llama_dir: Path) -> Iterator[TestClient]:
    settings = server_settings(
        tmp_path_factory.mktemp("public") / "data",
        tiny_llama_dir,
        server={"api_key": ADMIN_KEY, "public_collections": ["team-a"]},
        engine={"max_new_tokens": 2},
    )
    with TestClient(create_app(settings, load_in_background=False)) as client:
        yield client


def test_public_collections_are_what_anonymous_questions_see(public_server: TestClient) -> None:
    docs = {}
    for collection in ("team-a", "team-b"):
        accepted = public_server.post(
            "/ingest", json={"documents": [DOCS[collection]], "collection": collection}, headers=ADMIN
        )
        docs[collection] = wait_for_job(public_server, accepted.json()["job_id"], headers=ADMIN)["document_ids"][0]
    make_key(public_server, "team B", ["team-b"])
    anonymous = _ask(public_server, {})
    assert anonymous.status_code == 200, anonymous.text
    assert [s["document_id"] for s in anonymous.json()["sources"]] == [docs["team-a"]]
    assert _ask(public_server, {}, collections=["team-b"]).status_code == 403
    assert public_server.get("/v1/models").status_code == 200
    assert public_server.get("/documents").status_code == 401  # public means asking, not the library


def test_anonymous_callers_continue_only_conversations_within_the_public_collections(
    public_server: TestClient,
) -> None:
    """/ask and /v1 continuing a stored conversation: one made before keys existed (every collection
    searched, owner none) is a 404 for an anonymous caller of `public_collections: [team-a]`, so its
    history never reaches a team-a prompt; one over team-a is continued by its id, never listed."""
    catalog = public_server.app.state.blendrag.services.catalog
    before_keys = catalog.conversations.create(None, "what is in every collection?", None)
    v1_body = {"messages": [{"role": "user", "content": QUESTION}], "max_tokens": 2}
    assert _ask(public_server, {}, conversation_id=before_keys.id).status_code == 404
    refused = public_server.post("/v1/chat/completions", json={**v1_body, "conversation_id": before_keys.id})
    assert refused.status_code == 404 and refused.json()["error"]["code"] == "conversation_not_found"
    assert public_server.get(f"/conversations/{before_keys.id}").status_code == 404
    started = _ask(public_server, {}, conversation_id="new")
    assert started.status_code == 200, started.text
    conversation_id = started.json()["conversation_id"]
    assert catalog.conversations.get(conversation_id, None, None).collections == frozenset({"team-a"})
    assert _ask(public_server, {}, conversation_id=conversation_id).status_code == 200
    continued = public_server.post("/v1/chat/completions", json={**v1_body, "conversation_id": conversation_id})
    assert continued.status_code == 200, continued.text
    assert public_server.get(f"/conversations/{conversation_id}").json()["num_turns"] == 3
    assert public_server.get("/conversations").json()["total"] == 0
    listed = public_server.get("/conversations", params={"ids": f"{conversation_id},{before_keys.id}"}).json()
    assert [c["id"] for c in listed["conversations"]] == [conversation_id]
    # The admin's key is another owner: it neither sees nor continues the anonymous conversation.
    assert _ask(public_server, ADMIN, conversation_id=conversation_id).status_code == 404


def test_making_a_key_on_an_open_server_is_refused(client: TestClient) -> None:
    refused = client.post("/admin/keys", json={"name": "x", "collections": ["a"]})
    assert refused.status_code == 409
    assert refused.json()["detail"] == "set server.api_key (the admin key) before making collection keys"
    assert client.get("/admin/keys").json() == {"keys": []}


@pytest.mark.parametrize("value", [0, 1, "yes", "false", "true", None])
def test_can_ingest_is_a_json_boolean(server: TestClient, value: object) -> None:
    body = {"name": "strict", "collections": ["team-a"], "can_ingest": value}
    response = server.post("/admin/keys", json=body, headers=ADMIN)
    assert response.status_code == 422, response.text
    assert response.json()["detail"].startswith("can_ingest: Input should be a valid boolean")
