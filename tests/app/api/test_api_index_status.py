"""GET /api/index on the embedded (SQLite) server: the on-disk snapshot's chunk count."""

from __future__ import annotations

from fastapi.testclient import TestClient


def test_index_status_counts_indexed_chunks(client: TestClient, corpus: dict[str, str]) -> None:
    body = client.get("/api/index").json()
    chunks = sum(client.get(f"/documents/{doc_id}").json()["num_chunks"] for doc_id in corpus.values())
    assert body == {"chunks": chunks, "source": "snapshot", "change_log_position": None}
