"""Turn KV that someone owns: a stateless `/v1` client that resends its history gets its turns' KV from the
history memory tier (its next request reuses it) but none on disk, where nothing would name it; a stored
conversation's turns go to disk and `blendrag doctor` knows them. After normal use doctor finds no leftover."""

from __future__ import annotations

from pathlib import Path

from apitools import ingest_corpus, server_settings
from fastapi.testclient import TestClient

from app.build import build_services
from app.main import create_app
from app.services.doctor import run_doctor

QUESTIONS = ["What is the capital of Zorblat?", "And its rivers?", "When is the kite festival?", "Who bakes bread?"]
NUM_FOLLOWUPS = 12


def test_stateless_followups_leave_no_kv_for_doctor(tmp_path: Path, tiny_llama_dir: Path) -> None:
    settings = server_settings(tmp_path / "data", tiny_llama_dir)
    with TestClient(create_app(settings, load_in_background=False)) as client:
        ingest_corpus(client)
        store = client.app.state.blendrag.services.store  # type: ignore[attr-defined]
        on_disk_before = set(store.disk.keys())
        messages: list[dict[str, str]] = []
        reused: list[int] = []
        for n in range(NUM_FOLLOWUPS):  # one client resending its whole history, as OpenAI clients do
            messages.append({"role": "user", "content": QUESTIONS[n % len(QUESTIONS)] + f" ({n})"})
            response = client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 3})
            assert response.status_code == 200, response.text
            body = response.json()
            reused.append(body["blendrag"]["history_reused_tokens"])
            messages.append({"role": "assistant", "content": body["choices"][0]["message"]["content"]})
        # From the third request on, the turn the request before wrote (memory only) is reused.
        assert all(r > 0 for r in reused[2:]), reused
        assert set(store.disk.keys()) == on_disk_before  # no turn entry on disk
        # A stored conversation's turns do go to disk: its record names them.
        first = client.post("/ask", json={"question": QUESTIONS[0], "conversation_id": "new", "stream": False})
        conversation_id = first.json()["conversation_id"]
        followup = {"question": QUESTIONS[1], "conversation_id": conversation_id, "stream": False}
        assert client.post("/ask", json=followup).status_code == 200
        assert len(set(store.disk.keys()) - on_disk_before) == 2

    services = build_services(settings, {"doctor"})  # the server is stopped, as doctor wants
    try:
        report = run_doctor(services.doctor_parts(), repair=False)
    finally:
        services.close()
    assert (report.num_unreferenced_kv_entries, report.problems) == (0, 0)
