"""A full engine answers 503 (before any stream starts), over a real socket with concurrent requests.

The engine runs one request at a time and queues one more (max_running=1, max_queue=1): a long answer
holds the running slot, a second question waits in the queue, and a third is refused.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from apitools import LiveServer, server_settings

from app.main import create_app
from app.sse_reader import iter_sse, parse_sse
from app.state import AppState


@pytest.fixture(scope="module")
def busy_server(tmp_path_factory: pytest.TempPathFactory, tiny_llama_dir: Path) -> Iterator[LiveServer]:
    settings = server_settings(
        tmp_path_factory.mktemp("busy") / "data", tiny_llama_dir, engine={"max_queue": 1, "max_running": 1}
    )
    with LiveServer(create_app(settings, load_in_background=False)) as server:
        yield server


def first_event(lines: Iterator[str]) -> str | None:
    """The name of the next event on a line stream (reads up to its end, not beyond)."""
    message = next(iter_sse(lines), None)
    assert message is not None, "stream ended without an event"
    return message.event


def wait_until(condition, timeout_s: float = 30) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        time.sleep(0.01)


def test_full_engine_answers_503_then_recovers(busy_server: LiveServer) -> None:
    state: AppState = busy_server.server.config.app.state.blendrag
    scheduler = state.scheduler
    assert scheduler is not None
    long = {"question": "Tell me everything.", "max_tokens": 4096, "mode": "full"}
    short = {"question": "And briefly?", "max_tokens": 2, "mode": "full"}
    with httpx.Client(base_url=busy_server.url, timeout=60) as http:
        running = http.send(http.build_request("POST", "/ask", json=long), stream=True)
        lines = running.iter_lines()
        assert first_event(lines) == "sources"
        assert first_event(lines) == "token"  # decoding: it holds the only running slot
        queued = http.send(http.build_request("POST", "/ask", json=short), stream=True)
        queued_lines = queued.iter_lines()
        assert first_event(queued_lines) == "sources"
        wait_until(lambda: scheduler.num_waiting == 1)

        refused = http.post("/ask", json=short)
        assert refused.status_code == 503
        assert refused.json() == {"detail": "the engine is busy, retry shortly"}
        # The engine's estimate of when the queued question starts (tests/app/api/test_api_retry_after.py checks
        # exact values on a stubbed estimate): whole seconds, at least one.
        assert int(refused.headers["retry-after"]) >= 1
        assert http.post("/ask", json={**short, "stream": False}).status_code == 503
        chat = http.post(
            "/v1/chat/completions",
            json={"model": "blendrag", "messages": [{"role": "user", "content": "q"}], "stream": True},
        )
        assert chat.status_code == 503 and int(chat.headers["retry-after"]) >= 1
        assert chat.json()["error"] == {
            "message": "the engine is busy, retry shortly",
            "type": "server_error",
            "param": None,
            "code": "engine_busy",
        }
        assert "blendrag_engine_queue_depth 2.0" in http.get("/metrics").text
        # The busy check comes before the conversation is opened: an id nobody has is not even looked up.
        unknown = http.post("/ask", json={**short, "conversation_id": "nope"})
        assert (unknown.status_code, unknown.json()) == (503, {"detail": "the engine is busy, retry shortly"})
        chat = http.post(
            "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "q"}], "conversation_id": "nope"},
        )
        assert (chat.status_code, chat.json()["error"]["code"]) == (503, "engine_busy")

        # Closing the first stream cancels its request; the queued one runs to the end.
        running.close()
        rest = parse_sse("\n".join(queued_lines) + "\n\n")
        queued.close()
        assert rest[-1][0] == "done"
        assert rest[-1][1]["usage"]["completion_tokens"] <= 2
        wait_until(lambda: scheduler.num_waiting == 0 and scheduler.num_running == 0)
        assert http.post("/ask", json={**short, "stream": False}).status_code == 200
