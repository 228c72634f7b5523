"""The question rate limit cannot be dodged with made-up keys or a forged X-Forwarded-For; wrong keys are
401 and limited per address."""

from __future__ import annotations

from pathlib import Path

from apitools import server_settings
from fastapi.testclient import TestClient

from app.main import create_app

ASK = {"question": "Where is Quintaro?", "max_tokens": 1, "stream": False}
LIMITS = {"ask_rate_per_minute": 6, "ask_burst": 3, "wrong_key_per_minute": 6, "wrong_key_burst": 4}


def _client(tmp_path: Path, tiny_llama_dir: Path, **server: object) -> TestClient:
    settings = server_settings(tmp_path / "data", tiny_llama_dir, server={**LIMITS, **server})
    return TestClient(create_app(settings, load_in_background=False))


def test_without_a_key_configured_any_key_shares_the_address_bucket(tmp_path: Path, tiny_llama_dir: Path) -> None:
    with _client(tmp_path, tiny_llama_dir) as client:
        statuses = [client.post("/ask", json=ASK, headers={"X-API-Key": f"r{n}"}).status_code for n in range(5)]
        assert statuses == [200, 200, 200, 429, 429]
        # X-Forwarded-For from a peer not in server.forwarded_allow_ips (loopback only) is ignored
        forged = client.post("/ask", json=ASK, headers={"X-Forwarded-For": "203.0.113.9"})
        assert forged.status_code == 429


def test_wrong_keys_are_401_then_429_and_valid_key_has_its_own_bucket(tmp_path: Path, tiny_llama_dir: Path) -> None:
    key = {"Authorization": "Bearer right-key"}
    with _client(tmp_path, tiny_llama_dir, api_key="right-key", forwarded_allow_ips="*") as client:
        wrong = [client.post("/ask", json=ASK, headers={"X-API-Key": f"r{n}"}).status_code for n in range(6)]
        assert wrong == [401, 401, 401, 401, 429, 429]
        limited = client.post("/ask", json=ASK, headers={"X-API-Key": "r99"})
        assert limited.json()["detail"].startswith("too many requests with a wrong API key from this address")
        assert client.get("/documents", headers={"X-API-Key": "r100"}).status_code == 429  # every keyed route
        # the right key still works from that address, in a bucket of its own
        assert [client.post("/ask", json=ASK, headers=key).status_code for _ in range(4)] == [200, 200, 200, 429]
        # anonymous clients are their address; behind a trusted proxy, the address X-Forwarded-For names
        anonymous = [
            client.post("/ask", json=ASK, headers={"X-Forwarded-For": "198.51.100.7"}).status_code for _ in range(4)
        ]
        assert anonymous == [200, 200, 200, 429]
        assert client.post("/ask", json=ASK, headers={"X-Forwarded-For": "198.51.100.8"}).status_code == 200


def test_a_local_client_cannot_name_other_addresses_without_a_proxy_configured(
    tmp_path: Path, tiny_llama_dir: Path
) -> None:
    """A real server on 127.0.0.1 (the peer every local client has): with the default settings a varying
    X-Forwarded-For buys no fresh wrong-key bucket; configured as a proxy, 127.0.0.1 may name clients."""
    import httpx
    from apitools import LiveServer

    def wrong_key_statuses(**server: object) -> list[int]:
        settings = server_settings(tmp_path / f"data{len(server)}", tiny_llama_dir, server={**LIMITS, **server})
        with LiveServer(create_app(settings, load_in_background=False)) as live, httpx.Client(base_url=live.url) as c:
            return [
                c.get("/documents", headers={"X-API-Key": "wrong", "X-Forwarded-For": f"203.0.113.{n}"}).status_code
                for n in range(6)
            ]

    assert wrong_key_statuses(api_key="right-key") == [401, 401, 401, 401, 429, 429]
    assert wrong_key_statuses(api_key="right-key", forwarded_allow_ips="127.0.0.1") == [401] * 6
