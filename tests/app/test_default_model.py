"""The served default model (qwen2.5-coder-0.5b) end to end: ingest a few documents over HTTP, ask a
look-up question through /ask, and the answer carries the inserted code. Kept to a few hundred tokens."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.calibration.runner import needs_calibration
from app.main import create_app
from app.settings import load_settings
from engine.models.catalog import DEFAULT_MODEL, catalog_entry

pytestmark = pytest.mark.slow

DOCS = [
    {
        "title": "Heron release notes",
        "text": "Project Heron ships every second Tuesday. The deployment code for project Heron is HX-4471-QZ. "
        "Only the release manager may use it.",
    },
    {
        "title": "Office plants",
        "text": "The ficus in the hallway is watered on Mondays. The cactus needs water once a month.",
    },
    {
        "title": "Kestrel runbook",
        "text": "Project Kestrel restarts its workers at midnight and writes its logs to the central server.",
    },
]


def test_the_default_model_answers_a_look_up_from_the_documents(tmp_path: Path, default_model_dir: Path) -> None:
    entry = catalog_entry(DEFAULT_MODEL)
    assert entry is not None
    data_dir = tmp_path / "data"
    (data_dir / "models").mkdir(parents=True)
    (data_dir / "models" / entry.converted_dir).symlink_to(default_model_dir)  # converted once per cache
    settings = load_settings(data_dir=data_dir, engine={"model": DEFAULT_MODEL, "max_new_tokens": 24, "num_threads": 2})
    with TestClient(create_app(settings, load_in_background=False)) as client:
        stats = client.get("/api/stats").json()
        assert stats["served_model"]["name"] == DEFAULT_MODEL
        assert (stats["served_model"]["source"], stats["served_model"]["origin_quantisation"]) == ("catalog", "Q4_K_M")
        assert stats["served_model"]["decode_weights"] == "int8"  # auto on a CPU: decode reads int8 copies
        # The prompt is laid out by the model's own chat template (ChatML, carried over from its GGUF).
        engine = client.app.state.blendrag.services.engine  # type: ignore[attr-defined]
        # The model ships a blend settings record for this machine's compute dtype (bfloat16 where the CPU has
        # bf16 units, float32 elsewhere) measured on these very weights: the server starts on it and has
        # nothing to calibrate in the background.
        dtype = str(engine.dtype).removeprefix("torch.")
        assert stats["blend_settings"]["source"] == "shipped"
        assert f"({dtype}, fingerprint {engine.fingerprint[:12]})" in stats["blend_settings"]["label"]
        served = client.app.state.blendrag.services  # type: ignore[attr-defined]
        assert needs_calibration(served.engine, served.settings) is None
        assert engine.tokenizer.decode(engine.prompt.prefix_ids) == (
            "<|im_start|>system\nYou are a helpful assistant. Answer the question using the documents. "
            "Be concise.<|im_end|>\n<|im_start|>user\n"
        )
        accepted = client.post("/ingest", json={"documents": DOCS}).json()
        deadline = time.monotonic() + 600
        while (job := client.get(f"/ingest/jobs/{accepted['job_id']}").json())["status"] not in ("succeeded", "failed"):
            assert time.monotonic() < deadline, job
            time.sleep(0.2)
        assert job["status"] == "succeeded", job
        answers = {
            mode: client.post(
                "/ask",
                json={
                    "question": "What is the deployment code for project Heron?",
                    "top_k": 3,
                    "mode": mode,
                    "stream": False,
                },
            ).json()
            for mode in ("full", "blend")
        }
    assert "HX-4471-QZ" in answers["full"]["answer"], answers["full"]
    assert "HX-4471-QZ" in answers["blend"]["answer"], answers["blend"]
