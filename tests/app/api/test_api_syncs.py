"""`blendrag sync` through a running server (a real uvicorn on 127.0.0.1): POST /syncs/plan, /ingest,
/syncs/remove, /syncs/finish, and GET /syncs as the admin page reads it; bad bodies are 422s."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from apitools import LiveServer

from app.cli import main

SHA = "0" * 64


@pytest.fixture
def client(live_server: LiveServer) -> Iterator[httpx.Client]:
    """Requests to the same live server the CLI syncs through (one server owns the data dir)."""
    with httpx.Client(base_url=live_server.url, timeout=30) as c:
        yield c


def in_collection(client: httpx.Client, collection: str) -> list[tuple[str, str]]:
    docs = client.get("/documents", params={"limit": 500}).json()["documents"]
    return sorted((d["source"], d["status"]) for d in docs if d["collection"] == collection)


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)  # the CLI's own settings: no data dir of its own is touched
    root = tmp_path / "handbook"
    root.mkdir()
    (root / "zorblat.md").write_text("# Zorblat\n\nQuintaro is the capital of Zorblat.\n")
    (root / "bread.txt").write_text("Sourdough needs flour, water, salt and a starter.\n")
    return root


def test_a_folder_synced_through_the_server(
    live_server: LiveServer, client: httpx.Client, folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["sync", str(folder), "--server", live_server.url]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert ": 2 added, 0 changed, 0 removed, 0 unchanged, 0 failed, 0 skipped in " in out
    (folder / "bread.txt").unlink()
    (folder / "zorblat.md").write_text("# Zorblat\n\nQuintaro is the capital of Zorblat, on purple rivers.\n")
    assert main(args) == 0
    assert ": 0 added, 1 changed, 1 removed, 0 unchanged, 0 failed, 0 skipped in " in capsys.readouterr().out

    assert in_collection(client, "handbook") == [("zorblat.md", "ready")]
    syncs = client.get("/syncs").json()["syncs"]
    record = next(s for s in syncs if s["collection"] == "handbook")
    assert record["folder"] == str(folder.resolve())
    assert record["changes"] == {"added": 0, "changed": 1, "removed": 1, "unchanged": 0, "failed": 0, "skipped": 0}

    # Another folder may not take the collection over without --replace: a 409, shown as the CLI's error.
    other = folder.parent / "other"
    other.mkdir()
    (other / "a.md").write_text("# A\n\nAnother folder.\n")
    assert main(["sync", str(other), "--collection", "handbook", "--server", live_server.url]) == 2
    err = capsys.readouterr().err
    assert f"error: collection 'handbook' is kept equal to the folder {folder.resolve()}, not {other.resolve()}" in err
    assert in_collection(client, "handbook") == [("zorblat.md", "ready")]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"collection": "a/b", "folder": "/x", "files": {}}, "String should match pattern"),
        ({"collection": "c", "folder": "/x", "files": {"a.md": "nothex"}}, "String should match pattern"),
        ({"collection": "c", "folder": "", "files": {}}, "at least 1 character"),
        ({"collection": "c", "folder": "/x", "files": {"": SHA}}, "at least 1 character"),
        ({"collection": "c", "folder": "/x", "files": {"a" * 2049: SHA}}, "at most 2048 characters"),
        ('{"collection": "c", "folder": "/x\\ud800", "files": {}}', "as a unicode string"),  # a lone surrogate
        ({"collection": "c", "folder": "/x", "files": {}, "extra": 1}, "Extra inputs are not permitted"),
    ],
)
def test_bad_sync_bodies_are_422(client: httpx.Client, body: dict[str, object] | str, message: str) -> None:
    for path in ("/syncs/plan", "/syncs/remove"):
        if isinstance(body, str):
            response = client.post(path, content=body, headers={"Content-Type": "application/json"})
        else:
            response = client.post(path, json=body)
        assert response.status_code == 422, response.text
        assert message in response.text


def test_a_finish_is_refused_like_its_plan(client: httpx.Client) -> None:
    empty_plan = {"new": [], "changed": [], "upload": [], "num_unchanged": 0, "remove": {}, "busy_jobs": []}
    accepted = client.post(
        "/ingest", json={"documents": [{"title": "T", "text": "hand-made", "source": "hand"}], "collection": "kept"}
    )
    assert accepted.status_code == 202
    from apitools import wait_for_job

    assert wait_for_job(client, accepted.json()["job_id"])["status"] == "succeeded"
    body = {"collection": "kept", "folder": os.sep + "empty", "files": {}}
    finish = {"plan": empty_plan, "num_skipped": 0}
    for path in ("/syncs/plan", "/syncs/remove", "/syncs/finish"):
        response = client.post(path, json=body | finish if path == "/syncs/finish" else body)
        assert response.status_code == 409, (path, response.text)
        assert "holds documents of 1 source(s) that are not files of /empty (hand)" in response.json()["detail"]
    assert in_collection(client, "kept") == [("hand", "ready")]
