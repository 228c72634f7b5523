"""Ingest, jobs and documents routes on a real server (tiny Llama, MiniLM, fresh data dir)."""

from __future__ import annotations

from typing import Any

from apitools import CORPUS, MAX_FILE_BYTES, wait_for_job
from fastapi.testclient import TestClient

from app.services.ingest import IngestSource
from app.sse_reader import parse_sse

STAGES = {"parse", "chunk", "embed", "kv", "commit"}


def state_of(client: TestClient) -> Any:
    return client.app.state.blendrag  # type: ignore[attr-defined]


def queued_job(client: TestClient, title: str) -> tuple[str, str]:
    """A job accepted but not handed to the worker: it stays `queued` and its document `pending`."""
    submitted = state_of(client).services.ingest.submit(
        [IngestSource(kind="text", title=title, text=f"{title} text.")], enqueue=False
    )
    return submitted.job_id, submitted.document_ids[0]


# ---- POST /ingest -------------------------------------------------------------------------------


def test_json_ingest_is_accepted_and_its_job_succeeds(client: TestClient, corpus: dict[str, str]) -> None:
    doc = {
        "title": "Kite festival",
        "text": "The kite festival of Quintaro is held every May.",
        "metadata": {"lang": "en"},
        "tags": ["events"],
        "source": "test:kites",
    }
    response = client.post("/ingest", json={"documents": [doc]})
    assert response.status_code == 202
    body = response.json()
    assert set(body) == {"job_id", "document_ids"}
    assert len(body["document_ids"]) == 1
    job = wait_for_job(client, body["job_id"])
    assert job["status"] == "succeeded"
    assert job["stage"] is None
    assert job["errors"] == []
    assert job["document_ids"] == body["document_ids"]
    assert set(job["progress"]) == STAGES
    kv = job["progress"]["kv"]
    assert (kv["done"], kv["total"]) == (1, 1)
    # what the job added to the KV store: its one entry's file, and that chunk's tokens
    services = client.app.state.blendrag.services  # type: ignore[attr-defined]
    [chunk] = services.catalog.chunks_of(body["document_ids"][0])
    located = services.store.locate_many([chunk.kv_key])[chunk.kv_key]
    assert (kv["bytes"], kv["tokens"]) == (located.num_bytes_by_tier["disk"], len(chunk.token_ids))
    assert job["progress"]["commit"] == {"done": 1, "total": 1, "ready": 1}

    stored = client.get(f"/documents/{body['document_ids'][0]}").json()
    assert stored["title"] == "Kite festival"
    assert stored["status"] == "ready"
    assert stored["tags"] == ["events"]
    assert stored["metadata"]["lang"] == "en"
    assert stored["source"] == "test:kites"
    assert stored["num_chunks"] == 1
    client.delete(f"/documents/{body['document_ids'][0]}")


def test_multipart_upload_ingests_files_with_tags(client: TestClient) -> None:
    files = [
        ("files", ("rivers.txt", b"Purple rivers flow through Quintaro all year long.", "text/plain")),
        ("files", ("notes.md", b"# Kites\n\nKites fly over Quintaro in May.", "text/markdown")),
    ]
    response = client.post("/ingest", files=files, data={"tags": "upload, test"})
    assert response.status_code == 202, response.text
    ids = response.json()["document_ids"]
    assert len(ids) == 2
    job = wait_for_job(client, response.json()["job_id"])
    assert job["status"] == "succeeded", job
    first = client.get(f"/documents/{ids[0]}").json()
    assert first["title"] == "rivers.txt"  # plain text: its file name
    assert client.get(f"/documents/{ids[1]}").json()["title"] == "Kites"  # markdown: its first heading
    assert first["tags"] == ["upload", "test"]
    assert first["source"] == "rivers.txt"
    assert first["chunks"][0]["text"].startswith("Purple rivers flow through Quintaro")
    for doc_id in ids:
        assert client.delete(f"/documents/{doc_id}").status_code == 204


def test_a_duplicate_upload_answers_with_the_stored_documents_id(client: TestClient) -> None:
    body = b"Glass bridges cross the purple rivers of Quintaro."
    first = client.post("/ingest", files=[("files", ("bridges.txt", body, "text/plain"))])
    assert wait_for_job(client, first.json()["job_id"])["status"] == "succeeded"
    stored_id = first.json()["document_ids"][0]
    again = client.post("/ingest", files=[("files", ("bridges-copy.txt", body, "text/plain"))])
    assert again.status_code == 202
    assert again.json()["document_ids"] == [stored_id]
    job = wait_for_job(client, again.json()["job_id"])
    assert (job["status"], job["duplicate_ids"], job["errors"][0]["code"]) == ("succeeded", [stored_id], "duplicate")
    detail = client.get(f"/documents/{stored_id}")
    assert detail.status_code == 200 and detail.json()["status"] == "ready"
    assert client.delete(f"/documents/{stored_id}").status_code == 204


def test_multipart_inline_documents_field_is_ingested_too(client: TestClient) -> None:
    inline = '[{"title": "Inline note", "text": "An inline note about Zorblat moons."}]'
    response = client.post(
        "/ingest", files=[("files", ("a.txt", b"File text about Zorblat.", "text/plain"))], data={"documents": inline}
    )
    assert response.status_code == 202, response.text
    ids = response.json()["document_ids"]
    job = wait_for_job(client, response.json()["job_id"])
    assert job["status"] == "succeeded", job
    assert [client.get(f"/documents/{i}").json()["title"] for i in ids] == ["Inline note", "a.txt"]
    for doc_id in ids:
        client.delete(f"/documents/{doc_id}")


def test_unsupported_file_type_is_refused_with_415(client: TestClient) -> None:
    response = client.post("/ingest", files=[("files", ("slides.ppt", b"binary", "application/octet-stream"))])
    assert response.status_code == 415
    assert response.json()["detail"].startswith("slides.ppt: unsupported file type .ppt")


def test_file_over_the_size_limit_is_refused_with_413(client: TestClient) -> None:
    big = b"a" * (MAX_FILE_BYTES + 1)
    response = client.post("/ingest", files=[("files", ("big.txt", big, "text/plain"))])
    assert response.status_code == 413
    assert response.json() == {
        "detail": f"big.txt: larger than the {MAX_FILE_BYTES}-byte limit (ingest.max_file_bytes)"
    }


def test_multipart_without_files_is_422(client: TestClient) -> None:
    response = client.post("/ingest", data={"tags": "x"}, files=[("other", ("a.txt", b"x", "text/plain"))])
    assert response.status_code == 422
    assert response.json() == {
        "detail": "multipart ingest needs at least one file in the 'files' field (or inline 'documents')"
    }


def test_json_ingest_errors_are_422_with_a_message(client: TestClient) -> None:
    empty = client.post("/ingest", json={"documents": []})
    assert empty.status_code == 422
    assert empty.json()["detail"] == (
        "invalid ingest body: documents: List should have at least 1 item after validation, not 0"
    )
    no_text = client.post("/ingest", json={"documents": [{"title": "x"}]})
    assert no_text.status_code == 422
    assert no_text.json()["detail"] == "invalid ingest body: documents.0.text: Field required"
    blank = client.post("/ingest", json={"documents": [{"title": "x", "text": "   "}]})
    assert blank.status_code == 422
    assert blank.json()["detail"] == "document 'x' has no text"
    broken = client.post("/ingest", content=b"{not json", headers={"content-type": "application/json"})
    assert broken.status_code == 422
    assert broken.json()["detail"].startswith("invalid ingest body: Expecting property name")


def test_other_content_types_are_415(client: TestClient) -> None:
    response = client.post("/ingest", content=b"hello", headers={"content-type": "text/plain"})
    assert response.status_code == 415
    assert response.json() == {"detail": "send application/json or multipart/form-data, not 'text/plain'"}


# ---- jobs ---------------------------------------------------------------------------------------


def test_unknown_job_is_404(client: TestClient) -> None:
    for method, path in (
        ("GET", "/ingest/jobs/nope"),
        ("POST", "/ingest/jobs/nope/cancel"),
        ("GET", "/ingest/jobs/nope/events"),
    ):
        response = client.request(method, path)
        assert response.status_code == 404, path
        assert response.json() == {"detail": "no ingest job nope"}


def test_job_events_stream_progress_then_done(client: TestClient) -> None:
    accepted = client.post(
        "/ingest",
        json={"documents": [{"title": "Streamed", "text": "A document whose ingest progress is streamed over SSE."}]},
    ).json()
    with client.stream("GET", f"/ingest/jobs/{accepted['job_id']}/events") as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = parse_sse(response.read().decode())
    names = [name for name, _ in events]
    assert names[-1] == "done"
    assert set(names[:-1]) <= {"progress"}
    final = events[-1][1]
    assert final["job_id"] == accepted["job_id"]
    assert final["status"] == "succeeded"
    for _, job in events[:-1]:
        assert job["status"] in ("queued", "running")
    # Events only come when something changed.
    bodies = [job for _, job in events]
    assert all(a != b for a, b in zip(bodies, bodies[1:], strict=False))
    client.delete(f"/documents/{accepted['document_ids'][0]}")


def test_events_of_a_finished_job_are_just_done(client: TestClient, corpus: dict[str, str]) -> None:
    doc = client.get(f"/documents/{corpus['Zorblat facts']}").json()
    events = parse_sse(client.get(f"/ingest/jobs/{doc['job_id']}/events").text)
    assert [name for name, _ in events] == ["done"]
    assert events[0][1]["status"] == "succeeded"


def test_cancel_a_queued_job(client: TestClient) -> None:
    job_id, doc_id = queued_job(client, "To be cancelled")
    assert client.get(f"/documents/{doc_id}").json()["status"] == "pending"
    response = client.post(f"/ingest/jobs/{job_id}/cancel")
    assert response.status_code == 200
    assert response.json()["status"] == "cancelled"
    assert response.json()["cancel_requested"] is True
    doc = client.get(f"/documents/{doc_id}").json()
    assert doc["status"] == "failed"
    assert doc["error"] == "ingest cancelled"
    again = client.post(f"/ingest/jobs/{job_id}/cancel")  # idempotent
    assert again.status_code == 200
    assert again.json()["status"] == "cancelled"
    events = parse_sse(client.get(f"/ingest/jobs/{job_id}/events").text)
    assert [(name, job["status"]) for name, job in events] == [("done", "cancelled")]
    assert client.delete(f"/documents/{doc_id}").status_code == 204


def test_cancel_a_finished_job_is_409(client: TestClient, corpus: dict[str, str]) -> None:
    job_id = client.get(f"/documents/{corpus['Baking notes']}").json()["job_id"]
    response = client.post(f"/ingest/jobs/{job_id}/cancel")
    assert response.status_code == 409
    assert response.json() == {"detail": f"ingest job {job_id} already succeeded"}


# ---- documents ----------------------------------------------------------------------------------


def test_documents_are_listed_newest_first_with_paging(client: TestClient, corpus: dict[str, str]) -> None:
    full = client.get("/documents", params={"status": "ready"}).json()
    ready_ids = [d["id"] for d in full["documents"]]
    assert set(corpus.values()) <= set(ready_ids)
    assert full["total"] == len(ready_ids)
    assert full["offset"] == 0 and full["limit"] == 50
    page = client.get("/documents", params={"status": "ready", "offset": 1, "limit": 1}).json()
    assert page["total"] == full["total"]
    assert [d["id"] for d in page["documents"]] == ready_ids[1:2]
    first = full["documents"][0]
    assert set(first) == {
        "id",
        "title",
        "status",
        "error",
        "source",
        "tags",
        "metadata",
        "num_chunks",
        "num_tokens",
        "job_id",
        "collection",
        "created_at",
        "updated_at",
    }
    created = [d["created_at"] for d in full["documents"]]
    assert created == sorted(created, reverse=True)


def test_documents_status_filter(client: TestClient, corpus: dict[str, str]) -> None:
    job_id, doc_id = queued_job(client, "Pending doc")
    pending = client.get("/documents", params={"status": "pending"}).json()
    assert [d["id"] for d in pending["documents"]] == [doc_id]
    assert pending["total"] == 1
    client.post(f"/ingest/jobs/{job_id}/cancel")
    assert client.get("/documents", params={"status": "pending"}).json()["total"] == 0
    client.delete(f"/documents/{doc_id}")


def test_failed_documents_are_purged_in_one_call(client: TestClient, corpus: dict[str, str]) -> None:
    bad = client.post(
        "/ingest",
        files=[
            ("files", ("a.json", b'[{"text": "ok"}, {"text": broken}]', "x/y")),
            ("files", ("b.json", b"[]", "x/y")),
        ],
    )
    assert wait_for_job(client, bad.json()["job_id"])["status"] == "failed"
    failed = client.get("/documents", params={"status": "failed"}).json()
    assert sorted(d["id"] for d in failed["documents"]) == sorted(bad.json()["document_ids"])
    ready_before = client.get("/documents", params={"status": "ready"}).json()["total"]
    purged = client.delete("/documents", params={"status": "failed"})
    assert (purged.status_code, purged.json()) == (200, {"deleted": 2})
    assert client.get("/documents", params={"status": "failed"}).json()["total"] == 0
    assert client.get("/documents", params={"status": "ready"}).json()["total"] == ready_before
    refused = client.delete("/documents", params={"status": "ready"})
    assert refused.status_code == 422
    assert refused.json()["detail"] == "query.status: Input should be 'failed'"
    assert client.delete("/documents").status_code == 422  # no status: never everything


def test_an_upload_keeps_the_path_it_was_sent_with_relative_and_safe(client: TestClient) -> None:
    files = [
        ("files", ("advanced/timeouts.md", b"# Timeouts\n\nhttpx times out after five seconds.", "text/markdown")),
        ("files", ("../../etc/notes.txt", b"Escaping names stay inside.", "text/plain")),
    ]
    accepted = client.post("/ingest", files=files)
    assert wait_for_job(client, accepted.json()["job_id"])["status"] == "succeeded"
    docs = [client.get(f"/documents/{i}").json() for i in accepted.json()["document_ids"]]
    assert [(d["title"], d["source"]) for d in docs] == [
        ("Timeouts", "advanced/timeouts.md"),
        ("notes.txt", "etc/notes.txt"),
    ]
    for d in docs:
        client.delete(f"/documents/{d['id']}")


def test_a_retry_of_the_same_failed_bytes_replaces_the_failed_document(client: TestClient) -> None:
    broken = [("files", ("broken.json", b'[{"text": "fine"}, {"text": oops}]', "application/json"))]
    ids = []
    for _ in range(3):  # before: three uploads of the same bytes left three failed documents
        accepted = client.post("/ingest", files=broken)
        assert wait_for_job(client, accepted.json()["job_id"])["status"] == "failed"
        ids.append(accepted.json()["document_ids"][0])
    failed = client.get("/documents", params={"status": "failed"}).json()
    assert [d["id"] for d in failed["documents"]] == [ids[-1]]
    assert [client.get(f"/documents/{i}").status_code for i in ids] == [404, 404, 200]
    client.delete("/documents", params={"status": "failed"})


def test_documents_query_validation(client: TestClient) -> None:
    bad_status = client.get("/documents", params={"status": "done"})
    assert bad_status.status_code == 422
    assert bad_status.json()["detail"] == "query.status: Input should be 'pending', 'ready' or 'failed'"
    bad_limit = client.get("/documents", params={"limit": 0})
    assert bad_limit.status_code == 422
    assert bad_limit.json()["detail"] == "query.limit: Input should be greater than or equal to 1"
    assert client.get("/documents", params={"offset": -1}).status_code == 422


def test_document_detail_has_chunks_with_fresh_kv(client: TestClient, corpus: dict[str, str]) -> None:
    doc_id = corpus["Moon notes"]
    body = client.get(f"/documents/{doc_id}").json()
    assert body["id"] == doc_id
    assert body["status"] == "ready"
    assert body["num_chunks"] == len(body["chunks"]) == 1
    chunk = body["chunks"][0]
    assert chunk["index"] == 0
    assert chunk["kv_state"] == "fresh"
    assert chunk["text"].startswith(CORPUS[2]["text"])
    assert chunk["num_tokens"] == body["num_tokens"]
    assert body["kv"] == {"fresh": 1, "stale": 0, "missing": 0}


def test_a_chunk_whose_kv_entry_is_gone_shows_missing(client: TestClient) -> None:
    accepted = client.post(
        "/ingest",
        json={"documents": [{"title": "Evicted", "text": "This chunk's KV entry will be removed from the store."}]},
    ).json()
    wait_for_job(client, accepted["job_id"])
    doc_id = accepted["document_ids"][0]
    services = state_of(client).services
    [chunk] = services.catalog.chunks_of(doc_id)
    assert services.store.delete(chunk.kv_key)
    body = client.get(f"/documents/{doc_id}").json()
    assert [c["kv_state"] for c in body["chunks"]] == ["missing"]
    assert body["kv"] == {"fresh": 0, "stale": 0, "missing": 1}
    client.delete(f"/documents/{doc_id}")


def test_unknown_document_is_404(client: TestClient) -> None:
    response = client.get("/documents/no-such-id")
    assert response.status_code == 404
    assert response.json() == {"detail": "no document no-such-id"}


def test_delete_is_idempotent(client: TestClient) -> None:
    accepted = client.post(
        "/ingest", json={"documents": [{"title": "Short-lived", "text": "A document that is deleted right away."}]}
    ).json()
    wait_for_job(client, accepted["job_id"])
    doc_id = accepted["document_ids"][0]
    services = state_of(client).services
    [chunk] = services.catalog.chunks_of(doc_id)

    first = client.delete(f"/documents/{doc_id}")
    assert first.status_code == 204
    assert first.content == b""
    assert client.get(f"/documents/{doc_id}").status_code == 404
    assert services.store.contains(chunk.kv_key) is None  # its unshared KV entry went too
    assert chunk.id not in {h.chunk_id for h in services.retriever.search("deleted right away", top_k=10)}
    assert client.delete(f"/documents/{doc_id}").status_code == 204
    assert client.delete("/documents/never-existed").status_code == 204


def test_delete_while_ingesting_is_409(client: TestClient) -> None:
    job_id, doc_id = queued_job(client, "Busy doc")
    response = client.delete(f"/documents/{doc_id}")
    assert response.status_code == 409
    assert response.json() == {
        "detail": f"document {doc_id} is still being ingested by job {job_id}; cancel the job first"
    }
    client.post(f"/ingest/jobs/{job_id}/cancel")
    assert client.delete(f"/documents/{doc_id}").status_code == 204


def test_recent_jobs_are_listed_newest_first(client: TestClient) -> None:
    first = client.post("/ingest", json={"documents": [{"title": "J1", "text": "Job one's text."}]}).json()
    second = client.post("/ingest", json={"documents": [{"title": "J2", "text": "Job two's text."}]}).json()
    for accepted in (first, second):
        wait_for_job(client, accepted["job_id"])
    listed = client.get("/ingest/jobs", params={"limit": 2}).json()["jobs"]
    assert [j["job_id"] for j in listed] == [second["job_id"], first["job_id"]]
    assert listed[0]["status"] == "succeeded" and listed[0]["document_ids"] == second["document_ids"]
    assert client.get("/ingest/jobs", params={"limit": 0}).status_code == 422
    for accepted in (first, second):
        client.delete(f"/documents/{accepted['document_ids'][0]}")
