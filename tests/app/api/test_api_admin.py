"""Admin data: /api/coverage, /api/stats and Prometheus /metrics."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from apitools import server_settings, wait_for_job
from fastapi.testclient import TestClient

from app.main import create_app


def sample(text: str, name: str, **labels: str) -> float | None:
    """The value of one sample in Prometheus text format (labels matched exactly, in any order)."""
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        match = re.fullmatch(r"([a-zA-Z_:][\w:]*)(?:\{(.*)\})? (\S+)", line)
        if not match or match.group(1) != name:
            continue
        found = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', match.group(2) or ""))
        if found == labels:
            return float(match.group(3))
    return None


def test_coverage_counts_every_ready_chunk(client: TestClient, corpus: dict[str, str]) -> None:
    body = client.get("/api/coverage").json()
    assert set(body) == {
        "chunks_total",
        "chunks_fresh",
        "chunks_stale",
        "chunks_missing",
        "coverage",
        "bytes_by_tier",
        "fresh_by_tier",
        "documents",
    }
    docs = {d["document_id"]: d for d in body["documents"]}
    assert set(corpus.values()) <= set(docs)
    zorblat = docs[corpus["Zorblat facts"]]
    assert zorblat == {
        "document_id": corpus["Zorblat facts"],
        "title": "Zorblat facts",
        "collection": "default",
        "status": "ready",
        "chunks_total": 1,
        "chunks_fresh": 1,
        "chunks_stale": 0,
        "chunks_missing": 0,
        "coverage": 1.0,
    }
    assert body["chunks_total"] == sum(d["chunks_total"] for d in docs.values())
    assert body["chunks_fresh"] + body["chunks_stale"] + body["chunks_missing"] == body["chunks_total"]
    assert body["coverage"] == round(body["chunks_fresh"] / body["chunks_total"], 6)
    # The tiny settings store in memory and on disk: every fresh entry is in both.
    assert body["fresh_by_tier"] == {"memory": body["chunks_fresh"], "disk": body["chunks_fresh"]}
    assert body["bytes_by_tier"]["memory"] > 0 and body["bytes_by_tier"]["disk"] > 0


def test_coverage_sees_a_lost_entry_as_missing(client: TestClient) -> None:
    accepted = client.post(
        "/ingest",
        json={"documents": [{"title": "Coverage probe", "text": "A probe document for the coverage report."}]},
    ).json()
    wait_for_job(client, accepted["job_id"])
    doc_id = accepted["document_ids"][0]
    before = client.get("/api/coverage").json()
    services = client.app.state.blendrag.services  # type: ignore[attr-defined]
    [chunk] = services.catalog.chunks_of(doc_id)
    services.store.delete(chunk.kv_key)
    after = client.get("/api/coverage").json()
    assert after["chunks_total"] == before["chunks_total"]
    assert after["chunks_fresh"] == before["chunks_fresh"] - 1
    assert after["chunks_missing"] == before["chunks_missing"] + 1
    probe = next(d for d in after["documents"] if d["document_id"] == doc_id)
    assert (probe["chunks_fresh"], probe["chunks_missing"], probe["coverage"]) == (0, 1, 0.0)
    client.delete(f"/documents/{doc_id}")


def test_stats_report_tiers_asks_and_ingest(client: TestClient, corpus: dict[str, str]) -> None:
    for mode in ("blend", "full"):
        response = client.post(
            "/ask",
            json={
                "question": "Where is Quintaro?",
                "mode": mode,
                "top_k": 2,
                "max_tokens": 2,
                "stream": False,
                "conversation_id": "new",
            },
        )
        assert response.status_code == 200
    stats = client.get("/api/stats").json()
    assert stats["model"] == "tiny-llama-smollm2-tok"
    # 49,152 × 64 tied embeddings + 2 layers of 36,992 + the final norm's 64.
    assert stats["served_model"] == {
        "name": "tiny-llama-smollm2-tok",
        "display_name": "tiny-llama-smollm2-tok",
        "source": "checkpoint",
        "architecture": "llama",
        "num_parameters": 3_219_776,
        "parameters_label": "3M",
        "num_layers": 2,
        "origin_quantisation": None,
        "compute_dtype": "float32",
        "decode_weights": "same",  # a 3M model decodes from its own weights (engine.decode_weights: auto)
    }
    assert len(stats["fingerprint"]) == 12
    # Blend settings in force and where they came from: the tiny model is not calibrated (and the suite turns
    # the background calibration off), so the safe ones.
    blend = stats["blend_settings"]
    assert (blend["source"], blend["label"]) == ("safe", "safe settings (this model is not calibrated yet)")
    assert blend["values"]["recompute_ratio"] == 0.3 == stats["default_recompute_ratio"]
    assert blend["values"]["history_ratio"] == 1.0 and blend["values"]["score_layers"] == [1]
    assert blend["operator_fields"] == [] and stats["calibration"] is None
    assert stats["compute"] == {"dtype": "float32", "reason": "set by engine.dtype", "requested": "float32"}
    assert stats["embedder_compute"] == {
        "dtype": "float32",
        "reason": "set by retrieval.embed_dtype",
        "requested": "float32",
    }
    # Each answer stored its turn's KV: the history memory tier exists now, one entry per distinct turn.
    assert [t["name"] for t in stats["kv_tiers"]] == ["memory", "history_memory", "disk"]
    assert stats["kv_tiers"][1]["num_entries"] >= 1
    assert stats["conversations"] >= 2 and stats["conversation_turns"] >= 2
    memory = stats["kv_tiers"][0]
    assert memory["num_entries"] >= 3 and memory["num_bytes"] > 0
    if memory["num_hits"] + memory["num_misses"]:
        assert memory["hit_rate"] == round(memory["num_hits"] / (memory["num_hits"] + memory["num_misses"]), 6)
    assert stats["documents_by_status"]["ready"] >= 3
    assert set(stats["documents_by_status"]) == {"pending", "ready", "failed"}
    assert stats["ingest_chunks"] >= 3
    assert stats["ingest_seconds"] > 0
    # ingest_seconds is shown rounded to ms; the rate is computed before rounding.
    assert stats["ingest_chunks_per_s"] == pytest.approx(stats["ingest_chunks"] / stats["ingest_seconds"], rel=0.01)
    assert stats["ask_kv_hits"] >= 2
    recent = stats["recent"]
    assert [r["mode"] for r in recent[-2:]] == ["blend", "full"]
    for mode in ("blend", "full"):
        mine = sorted(r["ttft_ms"] for r in recent if r["mode"] == mode)
        by_mode = stats["ttft_by_mode"][mode]
        assert by_mode["count"] == len(mine)
        assert by_mode["ttft_ms_p95"] == round(mine[round(0.95 * (len(mine) - 1))], 2)
    assert stats["prefill_tokens_per_s"] > 0  # full-mode answers and ingest teach the estimate
    # the bill: the tiny Llama (2 layers x 2 KV heads x head_dim 16) costs 256 B a token in fp16; in int4
    # 64 B of codes + 8 B of V scales/zeros (one group per token and layer) + 2 B of K's (per 128 tokens)
    fp = stats["kv_footprint"]
    per_token = {"fp16": 256.0, "bf16": 256.0, "int8": 160.0, "int4": 74.0}[fp["storage_dtype"]]
    assert (fp["bytes_per_token"], fp["bytes_per_million_tokens"]) == (per_token, per_token * 1e6)
    disk = next(t for t in stats["kv_tiers"] if t["name"] == "disk")
    assert (fp["disk_bytes"], fp["disk_entries"], fp["disk_budget_bytes"]) == (
        disk["num_bytes"],
        disk["num_entries"],
        disk["budget_bytes"],
    )
    assert fp["eviction"] == "frequency" and fp["disk_bytes"] <= fp["disk_budget_bytes"]


def test_metrics_use_route_templates_and_cover_every_family(client: TestClient, corpus: dict[str, str]) -> None:
    doc_id = corpus["Moon notes"]
    client.get(f"/documents/{doc_id}")
    client.get("/documents/does-not-exist")
    client.get("/no/such/path")
    answer = client.post(
        "/ask", json={"question": "Moon?", "mode": "reuse", "top_k": 1, "max_tokens": 1, "stream": False}
    )
    assert answer.status_code == 200
    outcome = answer.json()["finish_reason"]  # "length" after one token, unless that token was EOS
    assert outcome in ("length", "stop")
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    text = response.text
    assert doc_id not in text  # never a raw path as a label
    assert (
        sample(text, "blendrag_http_requests_total", route="/documents/{document_id}", method="GET", status="200") >= 1
    )
    assert (
        sample(text, "blendrag_http_requests_total", route="/documents/{document_id}", method="GET", status="404") >= 1
    )
    assert sample(text, "blendrag_http_requests_total", route="<unmatched>", method="GET", status="404") >= 1
    assert sample(text, "blendrag_http_requests_total", route="/ask", method="POST", status="200") >= 1
    assert sample(text, "blendrag_ttft_seconds_count", mode="reuse") >= 1
    assert sample(text, "blendrag_recompute_ratio_count") >= 1
    assert sample(text, "blendrag_asks_total", mode="reuse", outcome=outcome) >= 1
    stats = client.app.state.blendrag.services.store.stats()  # type: ignore[attr-defined]
    for tier in stats.tiers:
        assert sample(text, "blendrag_kv_bytes", tier=tier.name) == tier.num_bytes
        assert sample(text, "blendrag_kv_entries", tier=tier.name) == tier.num_entries
        assert sample(text, "blendrag_kv_hits", tier=tier.name) is not None
        assert sample(text, "blendrag_kv_misses", tier=tier.name) is not None
    assert sample(text, "blendrag_ingest_chunks_total") >= 3
    assert sample(text, "blendrag_ingest_seconds_total") > 0
    assert sample(text, "blendrag_engine_queue_depth") == 0
    assert sample(text, "blendrag_ask_kv_lookups_total", result="hit") >= 1


def test_a_new_system_prompt_makes_stored_kv_stale(tmp_path: Path, tiny_llama_dir: Path) -> None:
    """Stored KV is keyed on the prompt prefix: after a system prompt change every chunk is stale (its old
    entry exists, the one this server needs does not) until it is recomputed."""
    data_dir = tmp_path / "data"
    with TestClient(create_app(server_settings(data_dir, tiny_llama_dir), load_in_background=False)) as old:
        accepted = old.post(
            "/ingest", json={"documents": [{"title": "Old", "text": "Stored under the old system prompt."}]}
        ).json()
        assert wait_for_job(old, accepted["job_id"])["status"] == "succeeded"
    doc_id = accepted["document_ids"][0]
    settings = server_settings(
        data_dir, tiny_llama_dir, engine={"system_prompt": "Answer in one word."}, server={"refresh_stale_kv": False}
    )
    with TestClient(create_app(settings, load_in_background=False)) as new:
        assert [c["kv_state"] for c in new.get(f"/documents/{doc_id}").json()["chunks"]] == ["stale"]
        coverage = new.get("/api/coverage").json()
        assert (
            coverage["chunks_total"],
            coverage["chunks_fresh"],
            coverage["chunks_stale"],
            coverage["chunks_missing"],
            coverage["coverage"],
        ) == (1, 0, 1, 0, 0.0)
        answer = new.post("/ask", json={"question": "What was stored?", "max_tokens": 1, "stream": False}).json()
        assert (answer["kv_hits"], answer["kv_misses"]) == (0, 1)  # recomputed at ask time, then stored
        assert [c["kv_state"] for c in new.get(f"/documents/{doc_id}").json()["chunks"]] == ["fresh"]


def test_after_a_switch_the_stale_kv_is_recomputed_in_the_background(tmp_path: Path, tiny_llama_dir: Path) -> None:
    data_dir = tmp_path / "data"
    with TestClient(create_app(server_settings(data_dir, tiny_llama_dir), load_in_background=False)) as old:
        accepted = old.post("/ingest", json={"documents": [{"title": "Old", "text": "Stored before."}]}).json()
        assert wait_for_job(old, accepted["job_id"])["status"] == "succeeded"
        old_key = old.app.state.blendrag.services.catalog.iter_chunks()[0].kv_key  # type: ignore[attr-defined]
    settings = server_settings(data_dir, tiny_llama_dir, engine={"system_prompt": "Answer in one word."})
    with TestClient(create_app(settings, load_in_background=False)) as new:
        state = new.app.state.blendrag  # type: ignore[attr-defined]
        assert state.kv_refresh is not None and state.kv_refresh.join(timeout=600)
        assert [c["kv_state"] for c in new.get(f"/documents/{accepted['document_ids'][0]}").json()["chunks"]] == [
            "fresh"
        ]
        assert new.get("/api/coverage").json()["coverage"] == 1.0
        assert not state.services.store.contains(old_key)  # the old prompt's entry was evicted
        answer = new.post("/ask", json={"question": "What was stored?", "max_tokens": 1, "stream": False}).json()
        assert (answer["kv_hits"], answer["kv_misses"]) == (1, 0)


def test_answers_without_documents_are_left_out_of_the_mode_percentiles() -> None:
    from app.metrics import RecentAsk
    from app.services.stats_service import ttft_by_mode

    def ask(ttft: float, num_context_tokens: int) -> RecentAsk:
        return RecentAsk(0.0, "full", None, ttft, ttft, 0.0, 0, 0, 10, 1, None, num_context_tokens)

    stats = ttft_by_mode([ask(180, 0), ask(170, 0), ask(4000, 600), ask(4200, 600), ask(4100, 600)])
    assert set(stats) == {"full"}
    assert (stats["full"].count, stats["full"].ttft_ms_p50) == (3, 4100)
    assert ttft_by_mode([ask(180, 0)]) == {}
