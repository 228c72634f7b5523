"""POST /ask on a real server: the SSE stream, the JSON body, and every 4xx."""

from __future__ import annotations

from pathlib import Path

import pytest
from apitools import CORPUS
from fastapi.testclient import TestClient

from app.sse_reader import parse_sse

QUESTION = "What is the capital of Zorblat?"


def ask_stream(client: TestClient, **body: object) -> list[tuple[str | None, dict]]:
    response = client.post("/ask", json={"question": QUESTION, **body})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.headers["cache-control"] == "no-cache"
    return parse_sse(response.text)


def test_stream_is_sources_then_tokens_then_done(client: TestClient, corpus: dict[str, str]) -> None:
    events = ask_stream(client, top_k=2, max_tokens=6)
    names = [name for name, _ in events]
    assert names[0] == "sources"
    assert names[-1] == "done"
    assert set(names[1:-1]) == {"token"}
    assert len(names) >= 3

    sources = events[0][1]
    assert set(sources) == {"sources", "retrieval_ms", "notice"}
    assert sources["notice"] is None  # there are sources: nothing to warn about
    assert len(sources["sources"]) == 2
    assert [s["rank"] for s in sources["sources"]] == [1, 2]
    top = sources["sources"][0]
    assert set(top) == {"rank", "chunk_id", "document_id", "title", "page", "score", "snippet", "text", "section"}
    assert top["document_id"] == corpus["Zorblat facts"]  # MiniLM ranks the right passage first
    assert top["title"] == "Zorblat facts"
    assert top["page"] is None
    assert top["text"].startswith(CORPUS[0]["text"])
    assert top["snippet"] == " ".join(top["text"].split())
    assert sources["sources"][0]["score"] >= sources["sources"][1]["score"]

    done = events[-1][1]
    answer = "".join(data["text"] for name, data in events if name == "token")
    assert done["answer"] == answer
    assert done["mode"] == "blend"
    assert done["finish_reason"] in ("stop", "length")
    assert done["usage"]["completion_tokens"] <= 6
    assert done["usage"]["total_tokens"] == done["usage"]["prompt_tokens"] + done["usage"]["completion_tokens"]
    assert set(done["timings"]) == {
        "retrieval_ms",
        "kv_load_ms",
        "ttft_ms",
        "total_ms",
        "full_prefill_estimate_ms",
        "decode_tokens_per_s",
    }
    # The decode rate: the tokens after the first over the engine's time after it (None for one token).
    rate = done["timings"]["decode_tokens_per_s"]
    assert (rate is None) == (done["usage"]["completion_tokens"] < 2) and (rate is None or rate > 0)
    assert done["ttft_ms"] == done["timings"]["ttft_ms"] > 0
    assert done["total_ms"] == done["timings"]["total_ms"] >= done["ttft_ms"]
    assert done["kv_hits"] == 2 and done["kv_misses"] == 0
    assert 0.0 < done["recompute_ratio"] <= 1.0
    assert done["selector"] == "query"  # the engine's default selector answered
    assert done["notice"] is None
    assert all(set(c) == {"start", "end", "rank", "score"} for c in done["citations"])


@pytest.mark.parametrize("selector", ["query", "deviation", "first_k", "random"])
def test_selector_is_chosen_per_request_at_equal_budget(
    client: TestClient, corpus: dict[str, str], selector: str
) -> None:
    done = ask_stream(client, mode="blend", selector=selector, recompute_ratio=0.5, top_k=2, max_tokens=1)[-1][1]
    assert done["selector"] == selector
    context = done["usage"]["context_tokens"]
    # the budget, and at most match_extra's share (0.1 by default) on top for the names the question matches
    budget, extra = int(0.5 * context + 0.5), int(0.1 * context + 0.5)
    assert budget <= done["usage"]["recomputed_tokens"] <= budget + extra
    # Modes that recompute by rule have no selector.
    assert ask_stream(client, mode="reuse", selector=selector, top_k=2, max_tokens=1)[-1][1]["selector"] is None


@pytest.mark.parametrize("mode", ["blend", "full", "prefix", "reuse"])
def test_every_mode_answers(client: TestClient, corpus: dict[str, str], mode: str) -> None:
    events = ask_stream(client, mode=mode, top_k=2, max_tokens=3)
    assert events[-1][0] == "done"
    assert events[-1][1]["mode"] == mode


def test_recompute_ratio_one_recomputes_every_context_token(client: TestClient, corpus: dict[str, str]) -> None:
    done = ask_stream(client, mode="blend", recompute_ratio=1.0, top_k=2, max_tokens=2)[-1][1]
    assert done["recompute_ratio"] == 1.0
    assert done["usage"]["recomputed_tokens"] == done["usage"]["context_tokens"] > 0
    reuse = ask_stream(client, mode="reuse", top_k=2, max_tokens=2)[-1][1]
    assert reuse["recompute_ratio"] == 0.0
    assert reuse["usage"]["recomputed_tokens"] == 0


def test_filters_restrict_retrieval(client: TestClient, corpus: dict[str, str]) -> None:
    by_doc = ask_stream(client, top_k=3, max_tokens=1, filters={"document_ids": [corpus["Baking notes"]]})
    assert [s["document_id"] for s in by_doc[0][1]["sources"]] == [corpus["Baking notes"]]
    by_tag = ask_stream(client, top_k=3, max_tokens=1, filters={"tags": ["planets"]})
    assert {s["document_id"] for s in by_tag[0][1]["sources"]} == {corpus["Zorblat facts"], corpus["Moon notes"]}


def test_non_streaming_answer_is_one_json_body(client: TestClient, corpus: dict[str, str]) -> None:
    response = client.post("/ask", json={"question": QUESTION, "top_k": 2, "max_tokens": 4, "stream": False})
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert set(body) == {
        "answer",
        "sources",
        "mode",
        "selector",
        "recompute_ratio",
        "finish_reason",
        "repeated_line",
        "usage",
        "timings",
        "kv_hits",
        "kv_misses",
        "conversation_id",
        "history_turns",
        "history_dropped_turns",
        "retrieval_query",
        "retrieval_ms",
        "ttft_ms",
        "total_ms",
        "notice",
        "citations",
        "unsupported_identifiers",
    }
    # A one-off question (no `conversation_id`) is not stored.
    assert body["conversation_id"] is None and (body["history_turns"], body["history_dropped_turns"]) == (0, 0)
    assert client.app.state.blendrag.services.conversations.counts().num_conversations == 0
    assert body["retrieval_query"] is None
    assert (body["usage"]["history_tokens"], body["usage"]["history_reused_tokens"]) == (0, 0)
    assert [s["rank"] for s in body["sources"]] == [1, 2]
    assert body["sources"][0]["document_id"] == corpus["Zorblat facts"]
    assert body["usage"]["completion_tokens"] <= 4
    # Greedy decoding: the same question streams the same answer.
    streamed = ask_stream(client, top_k=2, max_tokens=4)
    assert streamed[-1][1]["answer"] == body["answer"]


def test_answers_are_recorded_for_the_admin_page(client: TestClient, corpus: dict[str, str]) -> None:
    before = len(client.get("/api/stats").json()["recent"])
    done = ask_stream(client, mode="prefix", top_k=1, max_tokens=1)[-1][1]
    recent = client.get("/api/stats").json()["recent"]
    assert len(recent) == min(before + 1, 200)
    assert recent[-1]["mode"] == "prefix" and recent[-1]["selector"] is None
    assert recent[-1]["ttft_ms"] == done["timings"]["ttft_ms"]
    assert recent[-1]["kv_hits"] == done["kv_hits"]


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        ({"question": ""}, "question: question must not be empty"),
        ({"question": "   \n"}, "question: question must not be empty"),
        ({}, "question: Field required"),
        ({"question": "q", "mode": "fast"}, "mode: Input should be 'blend', 'full', 'prefix' or 'reuse'"),
        ({"question": "q", "recompute_ratio": 1.5}, "recompute_ratio: Input should be less than or equal to 1"),
        ({"question": "q", "recompute_ratio": -0.1}, "recompute_ratio: Input should be greater than or equal to 0"),
        ({"question": "q", "top_k": 0}, "top_k: Input should be greater than or equal to 1"),
        ({"question": "q", "max_tokens": 0}, "max_tokens: Input should be greater than or equal to 1"),
        ({"question": "q", "temperature": 3}, "temperature: Input should be less than or equal to 2"),
        ({"question": "q", "ratio": 0.5}, "ratio: Extra inputs are not permitted"),
        (
            {"question": "q", "selector": "magic"},
            "selector: Input should be 'query', 'deviation', 'first_k' or 'random'",
        ),
    ],
)
def test_invalid_questions_are_422_with_a_message(client: TestClient, body: dict, detail: str) -> None:
    response = client.post("/ask", json=body)
    assert response.status_code == 422
    assert response.json()["detail"] == detail
    assert response.json()["errors"][0]["loc"][0] == "body"


def test_non_json_body_is_422(client: TestClient) -> None:
    response = client.post("/ask", content=b"question?", headers={"content-type": "text/plain"})
    assert response.status_code == 422


def test_bench_builds_the_prompt_ask_serves(client: TestClient, corpus: dict[str, str], monkeypatch) -> None:
    """bench/ measures the path users take: for the same question and passages (in retrieval order) bench's
    prompt builder gives the same token ids and blend config as the request /ask submits to the engine."""
    from bench.data import Example, Passage, build_prompt
    from bench.passes import mode_specs

    state = client.app.state.blendrag
    submitted = []
    real_submit = state.scheduler.submit

    def spy(request, *args, **kwargs):
        submitted.append(request)
        return real_submit(request, *args, **kwargs)

    monkeypatch.setattr(state.scheduler, "submit", spy)
    events = ask_stream(client, top_k=3, max_tokens=1)
    [request] = submitted
    ranked = [Passage(title=s["title"], text=s["text"]) for s in events[0][1]["sources"]]
    engine = state.services.engine
    bench = build_prompt(engine.prompt, engine.tokenizer, Example(0, QUESTION, ["x"], ranked), num_passages=3)
    assert request.layout.all_ids() == bench.layout.all_ids()
    assert request.layout.chunk_ids == bench.chunk_ids and len(bench.chunk_ids) == 3
    [spec] = mode_specs(engine, [engine.settings.blend.recompute_ratio], baselines=())
    assert request.blend == spec.blend and request.mode == spec.mode == "blend"


def test_defaults_are_the_servers_settings(client: TestClient) -> None:
    # The tiny test model has no calibration record and none shipped: its blend runs on the safe settings
    # (app/calibration/in_force.py), and /api/defaults gives the ratio in force, not the raw default.
    assert client.get("/api/defaults").json() == {
        "top_k": 6,
        "mode": "blend",
        "recompute_ratio": 0.3,
        "selector": "query",
        "max_tokens": 8,
    }


def test_an_answer_without_sources_says_why(
    client: TestClient, corpus: dict[str, str], tmp_path: Path, tiny_llama_dir: Path
) -> None:
    from apitools import server_settings

    from app.main import create_app

    # Documents exist, but the filter excludes them all.
    body = {"question": "What is the capital of Zorblat?", "filters": {"tags": ["no-such-tag"]}, "stream": False}
    answer = client.post("/ask", json=body).json()
    assert (answer["sources"], answer["notice"]) == ([], "no documents match")
    events = ask_stream(client, question="What is the capital of Zorblat?", filters={"tags": ["nope"]})
    assert events[0][0] == "sources"
    assert (events[0][1]["sources"], events[0][1]["notice"]) == ([], "no documents match")
    assert events[-1][1]["notice"] == "no documents match"
    # A server with nothing ingested says so.
    empty_app = create_app(server_settings(tmp_path / "empty", tiny_llama_dir), load_in_background=False)
    with TestClient(empty_app) as empty:
        answer = empty.post("/ask", json={"question": "When is the launch?", "stream": False}).json()
    assert (answer["sources"], answer["notice"]) == ([], "nothing ingested yet")
