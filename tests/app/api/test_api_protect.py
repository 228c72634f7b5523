"""`server.protect_ask` closes the question routes to anonymous clients; per-key rate limits on them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from apitools import server_settings
from fastapi.testclient import TestClient

from app.main import create_app
from app.rate_limit import RateLimiter, client_id

KEY = "s3cret-key"
BEARER = {"Authorization": f"Bearer {KEY}"}
ASK = {"question": "Where is Quintaro?", "max_tokens": 2, "stream": False}
CHAT = {"messages": [{"role": "user", "content": "Where is Quintaro?"}], "max_tokens": 2}


@pytest.fixture(scope="module")
def protected(tmp_path_factory: pytest.TempPathFactory, tiny_llama_dir: Path) -> Iterator[TestClient]:
    settings = server_settings(
        tmp_path_factory.mktemp("protect") / "data",
        tiny_llama_dir,
        server={"api_key": KEY, "protect_ask": True, "ask_rate_per_minute": 6, "ask_burst": 3},
    )
    with TestClient(create_app(settings, load_in_background=False)) as client:
        yield client


def test_protect_ask_needs_the_key_on_ask_and_v1(protected: TestClient) -> None:
    denied = protected.post("/ask", json=ASK)
    assert denied.status_code == 401
    assert denied.json()["detail"].startswith("missing or wrong API key")
    chat = protected.post("/v1/chat/completions", json=CHAT, headers={"Authorization": "Bearer wrong"})
    assert chat.status_code == 401
    assert chat.json()["error"]["type"] == "authentication_error"
    assert protected.get("/v1/models").status_code == 401
    assert protected.get("/health").status_code == 200  # what stays open: health, ready, the UI pages
    assert protected.get("/ready").status_code == 200
    assert protected.post("/ask", json=ASK, headers=BEARER).status_code == 200


def test_question_routes_are_rate_limited_per_key(protected: TestClient) -> None:
    # Three at once (the burst; one was spent above), then 429 until the bucket refills (6 per minute).
    statuses = [protected.post("/v1/chat/completions", json=CHAT, headers=BEARER).status_code for _ in range(3)]
    assert statuses == [200, 200, 429]
    limited = protected.post("/ask", json=ASK, headers=BEARER)
    assert limited.status_code == 429
    assert limited.json()["detail"] == (
        "too many questions: at most 6 per minute, 3 at once, per API key (or IP address); retry later"
    )
    assert 1 <= int(limited.headers["retry-after"]) <= 10
    assert protected.get("/documents", headers=BEARER).status_code == 200  # admin routes are not limited


def test_rate_limiter_refills_and_keeps_clients_apart() -> None:
    now = [0.0]
    limiter = RateLimiter(per_minute=60, burst=2, clock=lambda: now[0])
    a, b = client_id("key-a", "10.0.0.1"), client_id(None, "10.0.0.1")
    assert a != b and b == "ip:10.0.0.1" and "key-a" not in a
    assert [limiter.acquire(a), limiter.acquire(a)] == [None, None]
    assert limiter.acquire(a) == pytest.approx(1.0)
    assert limiter.acquire(b) is None  # another client, another bucket
    now[0] = 0.5
    assert limiter.acquire(a) == pytest.approx(0.5)
    now[0] = 1.0
    assert limiter.acquire(a) is None
    now[0] = 100.0
    assert [limiter.acquire(a), limiter.acquire(a), limiter.acquire(a) is not None] == [None, None, True]


def test_a_collection_key_has_a_bucket_of_its_own(protected: TestClient) -> None:
    made = protected.post("/admin/keys", json={"name": "team", "collections": ["default"]}, headers=BEARER)
    assert made.status_code == 201, made.text
    team = {"Authorization": f"Bearer {made.json()['key']}"}
    # The admin key's bucket is spent by the tests above; the collection key starts with a full burst of 3.
    assert protected.get("/api/defaults", headers=BEARER).status_code == 429
    assert [protected.get("/api/defaults", headers=team).status_code for _ in range(4)] == [200, 200, 200, 429]
    assert protected.delete(f"/admin/keys/{made.json()['key_id']}", headers=BEARER).status_code == 204
