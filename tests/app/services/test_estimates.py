"""The plain-prefill estimate survives a restart (it lives in the data dir, per model)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from apitools import ingest_corpus, server_settings
from fastapi.testclient import TestClient

from app.main import create_app
from app.services.estimates import FullPassRate
from app.state import PREFILL_RATE_FILE


def test_rate_is_saved_and_read_back_for_the_same_model(tmp_path: Path) -> None:
    path = tmp_path / "rate.json"
    first = FullPassRate()
    first.attach(path, key="model-a")
    first.observe(1000, 2.0)  # 500 tokens/s; the first observation is always saved
    assert json.loads(path.read_text()) == {"model": "model-a", "tokens_per_s": 500.0}

    again = FullPassRate()
    again.attach(path, key="model-a")
    assert again.tokens_per_s == 500.0
    assert again.estimate_ms(250) == 500.0

    other_model = FullPassRate()
    other_model.attach(path, key="model-b")
    assert other_model.tokens_per_s is None  # another model's rate says nothing about this one


def test_unreadable_file_is_ignored_with_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "rate.json"
    path.write_text("{not json")
    rate = FullPassRate()
    with caplog.at_level(logging.WARNING, logger="app.services.estimates"):
        rate.attach(path, key="m")
    assert rate.tokens_per_s is None
    assert "ignoring unreadable prefill estimate" in caplog.text
    rate.observe(300, 1.0)
    assert json.loads(path.read_text()) == {"model": "m", "tokens_per_s": 300.0}  # and it is rewritten


def test_a_full_disk_never_fails_an_observation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import app.services.estimates as estimates

    def full(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(estimates, "write_text_atomic", full)
    rate = FullPassRate()
    rate.attach(tmp_path / "rate.json", key="m")
    rate.observe(100, 1.0)
    assert rate.tokens_per_s == 100.0


def test_first_answer_after_a_restart_has_an_estimate(tmp_path: Path, tiny_llama_dir: Path) -> None:
    settings = server_settings(tmp_path / "data", tiny_llama_dir)
    with TestClient(create_app(settings, load_in_background=False)) as client:
        ingest_corpus(client)  # ingest's chunk precomputes feed the rate
    assert (settings.data_dir / PREFILL_RATE_FILE).is_file()
    with TestClient(create_app(settings, load_in_background=False)) as client:
        body = client.post("/ask", json={"question": "Where do purple rivers flow?", "stream": False}).json()
    assert body["timings"]["full_prefill_estimate_ms"] is not None


def test_probe_ids_are_prose_of_the_asked_length(tiny_llama_dir: Path) -> None:
    from transformers import AutoTokenizer

    from app.services.estimates import PROBE_TEXT, probe_ids

    tokenizer = AutoTokenizer.from_pretrained(tiny_llama_dir, local_files_only=True)
    ids = probe_ids(tokenizer, 300)
    unit = tokenizer.encode(PROBE_TEXT, add_special_tokens=False)
    assert len(ids) == 300 and ids[: len(unit)] == unit and ids[len(unit) : 2 * len(unit)] == unit[: 300 - len(unit)]


def test_a_server_without_a_rate_measures_one_at_start(tmp_path: Path, tiny_llama_dir: Path) -> None:
    """No ingest and no answer: the start-up probe alone teaches the rate, and saves it for the next start,
    which then measures nothing."""
    settings = server_settings(tmp_path / "data", tiny_llama_dir)
    with TestClient(create_app(settings, load_in_background=False)) as client:
        state = client.app.state.blendrag
        assert state.rate_probe is not None
        state.rate_probe.join(60.0)
        rate = client.get("/api/stats").json()["prefill_tokens_per_s"]
        assert rate is not None and rate > 0
        fingerprint = state.services.engine.fingerprint
    saved = json.loads((settings.data_dir / PREFILL_RATE_FILE).read_text())
    assert saved["model"] == fingerprint and saved["tokens_per_s"] > 0
    (settings.data_dir / PREFILL_RATE_FILE).write_text(json.dumps({"model": fingerprint, "tokens_per_s": 123.0}))
    with TestClient(create_app(settings, load_in_background=False)) as client:
        assert client.app.state.blendrag.rate_probe is None  # the stored rate is this model's: nothing measured
        assert client.get("/api/stats").json()["prefill_tokens_per_s"] == 123.0
