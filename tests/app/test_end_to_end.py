"""The walking skeleton on the real models: ingest two documents over HTTP, ask, read the SSE stream."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.calibration.runner import needs_calibration
from app.main import create_app
from app.settings import load_settings
from app.sse_reader import parse_sse
from engine.builtin import BUILTIN_LLM_NAME

pytestmark = pytest.mark.slow


def wait_for_job(client: TestClient, job_id: str, timeout_s: float = 300) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job = client.get(f"/ingest/jobs/{job_id}").json()
        if job["status"] in ("succeeded", "failed", "cancelled"):
            return job
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} did not finish: {job}")


def test_ingest_then_ask_streams_sources_tokens_done(tmp_path: Path, smollm2_dir: Path) -> None:
    data_dir = tmp_path / "data"
    (data_dir / "models").mkdir(parents=True)
    (data_dir / "models" / BUILTIN_LLM_NAME).symlink_to(smollm2_dir)  # skip the 20 s conversion
    settings = load_settings(data_dir=data_dir, engine={"max_new_tokens": 24})

    with TestClient(create_app(settings, load_in_background=False)) as client:
        assert client.get("/ready").status_code == 200
        # SmolLM2 ships a blend settings record per compute dtype, measured on these very weights: the server
        # starts on the one of its own dtype and fingerprint and has nothing to calibrate in the background.
        services = client.app.state.blendrag.services  # type: ignore[attr-defined]
        dtype = str(services.engine.dtype).removeprefix("torch.")
        blend_settings = client.get("/api/stats").json()["blend_settings"]
        assert blend_settings["source"] == "shipped"
        assert f"({dtype}, fingerprint {services.engine.fingerprint[:12]})" in blend_settings["label"]
        assert needs_calibration(services.engine, services.settings) is None
        docs = [
            {
                "title": "Zorblat facts",
                "text": "The capital of the planet Zorblat is Quintaro. "
                "Quintaro is famous for its purple rivers and its annual kite festival.",
            },
            {
                "title": "Baking notes",
                "text": "To bake sourdough bread you need flour, water, salt and a "
                "starter. Let the dough rise overnight before baking it at 250 degrees.",
            },
        ]
        accepted = client.post("/ingest", json={"documents": docs})
        assert accepted.status_code == 202
        body = accepted.json()
        assert len(body["document_ids"]) == 2
        job = wait_for_job(client, body["job_id"])
        assert job["status"] == "succeeded", job
        zorblat_id = body["document_ids"][0]

        response = client.post("/ask", json={"question": "What is the capital of Zorblat?", "top_k": 2})
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = parse_sse(response.text)
        # The same question answered by plain prefill and by a blend that recomputes everything:
        # greedy fp32 decoding makes them token-identical, and the model reads the answer off the context.
        full = client.post(
            "/ask", json={"question": "What is the capital of Zorblat?", "top_k": 2, "mode": "full", "stream": False}
        ).json()
        blend_all = client.post(
            "/ask",
            json={
                "question": "What is the capital of Zorblat?",
                "top_k": 2,
                "mode": "blend",
                "recompute_ratio": 1.0,
                "stream": False,
            },
        ).json()

    names = [name for name, _ in events]
    assert names[0] == "sources"
    assert names[-1] == "done"
    assert "token" in names
    assert set(names) == {"sources", "token", "done"}
    sources = events[0][1]["sources"]
    assert sources[0]["document_id"] == zorblat_id  # the relevant document ranks first
    done = events[-1][1]
    answer = "".join(data["text"] for name, data in events if name == "token")
    assert done["answer"] == answer
    assert "Zorblat" in answer
    assert "Quintaro" in full["answer"]
    assert blend_all["answer"] == full["answer"]
    assert (full["mode"], blend_all["mode"], blend_all["recompute_ratio"]) == ("full", "blend", 1.0)
    assert done["mode"] == "blend"
    assert done["ttft_ms"] > 0 and done["total_ms"] >= done["ttft_ms"]
    assert 0.0 < done["recompute_ratio"] <= 1.0
    assert done["kv_hits"] == 2 and done["kv_misses"] == 0
