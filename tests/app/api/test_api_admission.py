"""Honest admission and abandoned requests, over a real socket on 127.0.0.1.

* A request is queued in the engine scheduler before its response starts: concurrent clients get either a
  503 with Retry-After or a 200 whose stream ends in `done` — never "200, then an SSE `error: busy`".
* A client that gives up cancels its engine request, streaming or not, on /ask and /v1.
* A short, bounded load test: many clients, some hanging up early, no 200-then-busy, the engine drains.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from apitools import LiveServer, server_settings

from app.main import create_app
from app.sse_reader import parse_sse
from app.state import AppState
from engine.generation import RequestStatus


@pytest.fixture(scope="module")
def tight_server(tmp_path_factory: pytest.TempPathFactory, tiny_llama_dir: Path) -> Iterator[LiveServer]:
    """One request decodes at a time and one more may wait: everything else must be refused with 503."""
    settings = server_settings(
        tmp_path_factory.mktemp("admission") / "data",
        tiny_llama_dir,
        engine={"max_queue": 1, "max_running": 1},
        server={"ask_rate_per_minute": None},
    )  # one IP sends them all
    with LiveServer(create_app(settings, load_in_background=False)) as server:
        yield server


def scheduler_of(server: LiveServer) -> Any:
    state: AppState = server.server.config.app.state.blendrag
    assert state.scheduler is not None
    return state.scheduler


def wait_until(condition: Any, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        time.sleep(0.01)


@dataclass
class Outcome:
    status: int
    retry_after: str | None
    events: list[str]  # SSE event names (or "json" for a non-streaming 200)
    error_codes: list[str]


def ask_once(url: str, body: dict[str, Any], hang_up_after_first_token: bool = False, timeout_s: float = 60) -> Outcome:
    with httpx.Client(base_url=url, timeout=timeout_s) as http, http.stream("POST", "/ask", json=body) as resp:
        if resp.status_code != 200 or not body.get("stream", True):
            resp.read()
            return Outcome(resp.status_code, resp.headers.get("retry-after"), ["json"], [])
        names: list[str] = []
        codes: list[str] = []
        text = ""
        for line in resp.iter_lines():
            text += line + "\n"
            if line.startswith("event: "):
                names.append(line.removeprefix("event: "))
                if hang_up_after_first_token and names[-1] == "token":
                    break
        for name, data in parse_sse(text + "\n"):
            if name == "error":
                codes.append(data["code"])
        return Outcome(200, None, names, codes)


def test_concurrent_asks_are_503_or_a_whole_answer_never_200_then_busy(tight_server: LiveServer) -> None:
    scheduler = scheduler_of(tight_server)
    long = {"question": "Tell me everything.", "max_tokens": 4096, "mode": "full"}
    with httpx.Client(base_url=tight_server.url, timeout=60) as http:
        holder = http.send(http.build_request("POST", "/ask", json=long), stream=True)
        lines = holder.iter_lines()
        for line in lines:
            if line == "event: token":
                break  # it decodes: it holds the only running slot; the queue (1 place) is free
        wait_until(lambda: scheduler.num_running == 1 and scheduler.num_waiting == 0)
        short = {"question": "Where is Quintaro?", "max_tokens": 2, "mode": "full"}
        with ThreadPoolExecutor(8) as pool:
            futures = [pool.submit(ask_once, tight_server.url, short) for _ in range(8)]
            # Every client has its status line once the scheduler has decided; then free the engine.
            wait_until(lambda: scheduler.num_waiting == 1)
            time.sleep(0.5)
            holder.close()
            outcomes = [f.result() for f in futures]
    refused = [o for o in outcomes if o.status == 503]
    answered = [o for o in outcomes if o.status == 200]
    assert len(refused) + len(answered) == 8
    assert len(answered) >= 1 and len(refused) >= 1
    assert all(o.retry_after is not None and int(o.retry_after) >= 1 for o in refused)  # the engine's estimate
    for o in answered:
        assert o.error_codes == [], o  # no "200, then error: busy"
        assert o.events[0] == "sources" and o.events[-1] == "done"
    wait_until(lambda: scheduler.queue_depth == 0)


def test_metrics_queue_depth_counts_the_request_in_its_prompt_pass(tight_server: LiveServer) -> None:
    scheduler = scheduler_of(tight_server)
    release = threading.Event()
    engine = scheduler.engine
    original = engine.prompt_pass

    def slow_prompt_pass(*args: Any, **kwargs: Any) -> Any:
        release.wait(30)  # the worker holds this request in its prompt pass until released
        return original(*args, **kwargs)

    engine.prompt_pass = slow_prompt_pass  # type: ignore[method-assign]
    try:
        with ThreadPoolExecutor(1) as pool:
            future = pool.submit(ask_once, tight_server.url, {"question": "q?", "max_tokens": 2, "mode": "full"})
            wait_until(lambda: scheduler.num_prompt_passes == 1)
            metrics = httpx.get(f"{tight_server.url}/metrics").text
            assert "blendrag_engine_queue_depth 1.0" in metrics
            release.set()
            assert future.result().events[-1] == "done"
    finally:
        engine.prompt_pass = original  # type: ignore[method-assign]
        release.set()


@contextlib.contextmanager
def decode_held(server: LiveServer) -> Iterator[tuple[threading.Event, threading.Event, list[Any]]]:
    """Hold the engine's decode steps until released: (decoding, release, runs seen). While held, a request
    cannot finish on its own however fast the machine is, so what ends it is what the test is about."""
    scheduler = scheduler_of(server)
    engine = scheduler.engine
    original = engine.decode
    decoding, release = threading.Event(), threading.Event()
    runs: list[Any] = []

    def held_decode(active: list[Any]) -> Any:
        runs.extend(run for run in active if run not in runs)
        decoding.set()
        release.wait(30)
        return original(active)

    engine.decode = held_decode  # type: ignore[method-assign]
    try:
        yield decoding, release, runs
    finally:
        release.set()
        engine.decode = original  # type: ignore[method-assign]


def _raw_post(url: str, path: str, body: dict[str, Any]) -> socket.socket:
    """Send a POST on a plain socket and read nothing: closing the socket is a client giving up."""
    parsed = httpx.URL(url)
    payload = json.dumps(body).encode()
    sock = socket.create_connection((parsed.host, parsed.port))
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {parsed.host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n"
    )
    sock.sendall(head.encode() + payload)
    return sock


def _assert_cancelled_by_the_client(server: LiveServer, runs: list[Any], release: threading.Event) -> None:
    scheduler = scheduler_of(server)
    assert len(runs) == 1
    # Decode is held, so only the server noticing the closed connection can end the request.
    wait_until(lambda: runs[0].cancel_requested.is_set())
    release.set()
    wait_until(lambda: scheduler.queue_depth == 0 and runs[0].finished)
    assert runs[0].status == RequestStatus.CANCELLED
    # The first token came from the prompt pass, the second from the held step: then the cancel, not 4,096.
    assert runs[0].num_completion_tokens == 2
    assert scheduler.engine is not None


@pytest.mark.parametrize("path", ["/ask", "/v1/chat/completions"])
def test_non_streaming_client_that_gives_up_cancels_its_request(tight_server: LiveServer, path: str) -> None:
    scheduler = scheduler_of(tight_server)
    wait_until(lambda: scheduler.queue_depth == 0)
    if path == "/ask":
        body: dict[str, Any] = {"question": "Tell me everything.", "max_tokens": 4096, "mode": "full", "stream": False}
    else:
        body = {
            "messages": [{"role": "user", "content": "Tell me everything."}],
            "max_tokens": 4096,
            "mode": "full",
            "stream": False,
        }
    with decode_held(tight_server) as (decoding, release, runs):
        sock = _raw_post(tight_server.url, path, body)
        assert decoding.wait(30), "the request never reached its decode steps"
        sock.close()  # the client gives up before any byte of the answer
        _assert_cancelled_by_the_client(tight_server, runs, release)


def test_streaming_client_that_hangs_up_cancels_its_request(tight_server: LiveServer) -> None:
    scheduler = scheduler_of(tight_server)
    wait_until(lambda: scheduler.queue_depth == 0)
    body = {
        "messages": [{"role": "user", "content": "Tell me everything."}],
        "max_tokens": 4096,
        "mode": "full",
        "stream": True,
    }
    with (
        decode_held(tight_server) as (decoding, release, runs),
        httpx.Client(base_url=tight_server.url, timeout=30) as http,
    ):
        with http.stream("POST", "/v1/chat/completions", json=body) as resp:
            assert resp.status_code == 200
            for line in resp.iter_lines():
                if '"content": "' in line and '"content": ""' not in line:
                    break  # the first token arrived
            assert decoding.wait(30)
        _assert_cancelled_by_the_client(tight_server, runs, release)


def test_short_load_no_200_then_busy_and_the_engine_drains(tight_server: LiveServer) -> None:
    """Bounded load: 12 clients × 3 asks (36 requests, a third hanging up after the first token), 120 s cap."""
    scheduler = scheduler_of(tight_server)
    wait_until(lambda: scheduler.queue_depth == 0)
    started = time.monotonic()

    def client(i: int) -> list[Outcome]:
        results = []
        for j in range(3):
            body = {
                "question": f"Question {i}.{j} about Zorblat?",
                "max_tokens": 4,
                "mode": "full",
                "stream": (i + j) % 4 != 0,
            }
            results.append(ask_once(tight_server.url, body, hang_up_after_first_token=(i + j) % 3 == 0))
        return results

    with ThreadPoolExecutor(12) as pool:
        outcomes = [o for batch in pool.map(client, range(12), timeout=120) for o in batch]
    assert time.monotonic() - started < 120
    assert len(outcomes) == 36
    assert {o.status for o in outcomes} <= {200, 503}
    assert all(o.retry_after == "1" for o in outcomes if o.status == 503)
    assert [o for o in outcomes if "busy" in o.error_codes] == []
    assert any(o.status == 200 for o in outcomes)
    wait_until(lambda: scheduler.queue_depth == 0, timeout_s=30)
