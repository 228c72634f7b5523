"""Every 429 and 503 the app sends carries Retry-After, and the OpenAPI document says so.

* Before start-up every route of the OpenAPI document is asked once: each 503 (the models are loading) says
  `Retry-After: 5`, and each route that can answer it documents it with the header.
* On a loaded server with a scheduler whose queue is full, /ask and /v1 (streaming or not) answer 503 with the
  scheduler's estimate, rounded up: the estimate is stubbed, so the header is exact; the MCP `ask` tool, whose
  refusals travel in a 200, says the same seconds in its error text.
* The rate limits' 429s carry their bucket's refill time, on a stopped clock: a wrong key's on every route that
  checks keys (before start-up: the check needs nothing loaded), a question's on /ask and /v1.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from apitools import server_settings
from fastapi.testclient import TestClient

from app.main import create_app
from app.rate_limit import RateLimiter
from app.sse_reader import parse_sse
from engine.admission import AdmissionEstimate

QUESTION = {"question": "What is Quintaro?", "max_tokens": 2}
CHAT = {"model": "blendrag", "messages": [{"role": "user", "content": "What is Quintaro?"}]}


def call_tool(client: TestClient, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """One MCP `tools/call` as a JSON-RPC POST to /mcp (stateless: no session to open first); its result."""
    response = client.post(
        "/mcp",
        json={"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": name, "arguments": arguments}},
        headers={"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-06-18"},
    )
    assert response.status_code == 200, response.text
    if response.headers["content-type"].startswith("text/event-stream"):
        return parse_sse(response.text)[-1][1]["result"]
    return response.json()["result"]


def _routes_answering(
    client: TestClient, spec: dict, status: int, *, retry_after: str, headers: dict[str, str] | None = None
) -> list[tuple[str, str]]:
    """Call every API route of `spec` (path parameters "x", body {}); each answering `status` must carry this
    Retry-After and document `status` with a required Retry-After header. Returns those (METHOD, template)."""
    answered = []
    for template, operations in spec["paths"].items():  # every API route
        path = re.sub(r"\{[^}]+\}", "x", template)
        for method, operation in operations.items():
            response = client.request(method.upper(), path, json={}, headers=headers)
            if response.status_code != status:
                continue
            answered.append((method.upper(), template))
            assert response.headers.get("retry-after") == retry_after, (method, path)
            documented = operation["responses"].get(str(status))
            assert documented is not None, f"{method} {template} answers {status} without documenting it"
            assert documented["headers"]["Retry-After"]["required"] is True, (method, template)
    return answered


def test_every_503_before_start_up_says_when_to_retry(tmp_path: Path, tiny_llama_dir: Path) -> None:
    app = create_app(server_settings(tmp_path / "data", tiny_llama_dir))
    client = TestClient(app)  # no `with`: the lifespan never runs, as in the seconds while models load
    spec = client.get("/openapi.json").json()
    refused = _routes_answering(client, spec, 503, retry_after="5")
    # The routes whose services are not built yet (and /ready itself) refuse: the walk saw them.
    assert ("POST", "/ask") in refused and ("POST", "/v1/chat/completions") in refused
    assert ("GET", "/ready") in refused and ("POST", "/ingest") in refused
    mcp = client.post("/mcp", json={})
    assert (mcp.status_code, mcp.headers.get("retry-after")) == (503, "5")


def test_every_429_for_a_wrong_key_says_when_to_retry(tmp_path: Path, tiny_llama_dir: Path) -> None:
    app = create_app(server_settings(tmp_path / "data", tiny_llama_dir, server={"api_key": "admin-key"}))
    client = TestClient(app)  # the key checks answer before start-up too
    # A stopped clock: the address's wrong-key budget (one) is spent at once and never refills during the test.
    app.state.blendrag.wrong_key_limiter = RateLimiter(per_minute=4, burst=1, clock=lambda: 0.0)  # one per 15 s
    wrong = {"Authorization": "Bearer not-the-key"}
    assert client.get("/documents", headers=wrong).status_code == 401
    spec = client.get("/openapi.json").json()
    limited = _routes_answering(client, spec, 429, retry_after="15", headers=wrong)
    # Every route that checks a key: all but /health, /ready and /api/render.
    assert len(limited) == sum(len(ops) for ops in spec["paths"].values()) - 3


def test_the_openapi_document_gives_every_429_and_503_a_retry_after(tmp_path: Path, tiny_llama_dir: Path) -> None:
    spec = TestClient(create_app(server_settings(tmp_path / "data", tiny_llama_dir))).get("/openapi.json").json()
    seen = 0
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            for status in ("429", "503"):
                response = operation["responses"].get(status)
                if response is None:
                    continue
                seen += 1
                assert response["headers"]["Retry-After"]["schema"] == {"type": "integer", "minimum": 1}, (
                    method,
                    path,
                    status,
                )
    assert seen > 20


@pytest.fixture(scope="module")
def busy_client(tmp_path_factory: pytest.TempPathFactory, tiny_llama_dir: Path) -> Iterator[TestClient]:
    """A loaded server whose scheduler refuses everything (max_queue 0) and estimates a place free in 12.2 s."""
    settings = server_settings(tmp_path_factory.mktemp("retry-after") / "data", tiny_llama_dir)
    with TestClient(create_app(settings, load_in_background=False)) as client:
        scheduler = client.app.state.blendrag.scheduler
        scheduler.max_queue = 0
        estimate = AdmissionEstimate(wait_s=30.0, slot_s=12.2, num_waiting=0, num_running=0)
        scheduler._estimate = lambda: estimate  # the queue the estimate would read is empty on this idle server
        yield client


@pytest.mark.parametrize("stream", [True, False])
def test_a_busy_engine_answers_503_with_its_estimate(busy_client: TestClient, stream: bool) -> None:
    ask = busy_client.post("/ask", json={**QUESTION, "stream": stream})
    assert (ask.status_code, ask.headers["retry-after"]) == (503, "13")
    assert ask.json() == {"detail": "the engine is busy, retry shortly"}
    chat = busy_client.post("/v1/chat/completions", json={**CHAT, "stream": stream})
    assert (chat.status_code, chat.headers["retry-after"]) == (503, "13")
    assert chat.json()["error"]["code"] == "engine_busy"


def test_a_busy_engine_tells_an_mcp_agent_when_to_retry(busy_client: TestClient) -> None:
    result = call_tool(busy_client, "ask", {"question": "What is Quintaro?"})
    assert result["isError"] is True, result
    assert result["content"][0]["text"] == "the engine is busy, retry shortly; retry after 13 s"


def test_a_wait_over_max_queue_wait_s_is_refused_until_it_would_fit(busy_client: TestClient) -> None:
    scheduler = busy_client.app.state.blendrag.scheduler
    scheduler.max_queue, scheduler.max_queue_wait_s = 16, 20.0
    try:
        ask = busy_client.post("/ask", json=QUESTION)
        # The estimated wait (30 s) is 10 s over the limit: a place in the queue is free, the time is not.
        assert (ask.status_code, ask.headers["retry-after"]) == (503, "10")
    finally:
        scheduler.max_queue, scheduler.max_queue_wait_s = 0, None


def test_the_question_rate_limit_answers_429_with_the_refill_time(tmp_path: Path, tiny_llama_dir: Path) -> None:
    limits = {"api_key": "admin-key", "ask_rate_per_minute": 6, "ask_burst": 1}  # one question per 10 s
    settings = server_settings(tmp_path / "data", tiny_llama_dir, server=limits)
    with TestClient(create_app(settings, load_in_background=False)) as client:
        state = client.app.state.blendrag
        # The same bucket on a stopped clock: it never refills while the test runs, so the wait is exact.
        state.rate_limiter = RateLimiter(per_minute=6, burst=1, clock=lambda: 0.0)
        admin = {"Authorization": "Bearer admin-key"}
        assert client.post("/ask", json={**QUESTION, "stream": False}, headers=admin).status_code == 200
        limited = client.post("/ask", json=QUESTION, headers=admin)
        assert (limited.status_code, limited.headers["retry-after"]) == (429, "10")
        chat = client.post("/v1/chat/completions", json=CHAT, headers=admin)
        assert (chat.status_code, chat.headers["retry-after"]) == (429, "10")
        assert chat.json()["error"]["type"] == "rate_limit_error"
        # /mcp checks keys like every route (its tools' own refusals travel in a 200).
        state.wrong_key_limiter = RateLimiter(per_minute=4, burst=1, clock=lambda: 0.0)  # one per 15 s
        wrong = {"Authorization": "Bearer not-the-key", "Accept": "application/json, text/event-stream"}
        assert client.post("/mcp", json={}, headers=wrong).status_code == 401
        mcp = client.post("/mcp", json={}, headers=wrong)
        assert (mcp.status_code, mcp.headers["retry-after"]) == (429, "15")
