"""A collection key revoked through one replica is refused by another within a second (PostgreSQL catalog)."""

from __future__ import annotations

import time

from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings

ADMIN = {"Authorization": "Bearer admin-secret"}


def _replica(settings: Settings, name: str) -> TestClient:
    data_dir = settings.data_dir.parent / name
    replica = settings.model_copy(update={"data_dir": data_dir})
    replica.kvcache = settings.kvcache.model_copy(update={"dir": data_dir / "kv"})
    replica.server = settings.server.model_copy(update={"api_key": "admin-secret", "ask_rate_per_minute": None})
    return TestClient(create_app(replica, load_in_background=False))


def test_a_key_revoked_on_one_replica_is_refused_by_the_other_within_a_second(pg_settings: Settings) -> None:
    with _replica(pg_settings, "replica-a") as a, _replica(pg_settings, "replica-b") as b:
        made = a.post("/admin/keys", json={"name": "team", "collections": ["team"]}, headers=ADMIN)
        assert made.status_code == 201, made.text
        key = {"Authorization": f"Bearer {made.json()['key']}"}
        assert b.get("/api/defaults", headers=key).status_code == 200  # B knows the key A made
        assert b.get("/api/defaults").status_code == 401  # and, keys existing, refuses anonymous questions
        assert [k["name"] for k in b.get("/admin/keys", headers=ADMIN).json()["keys"]] == ["team"]
        assert a.delete(f"/admin/keys/{made.json()['key_id']}", headers=ADMIN).status_code == 204
        revoked_at = time.monotonic()
        assert a.get("/api/defaults", headers=key).status_code == 401  # at once where it was revoked
        while b.get("/api/defaults", headers=key).status_code != 401:
            assert time.monotonic() - revoked_at < 1.0, "replica B still accepts the revoked key"
            time.sleep(0.02)
        # No key left: within the same second B is open to anonymous questions again.
        while b.get("/api/defaults").status_code != 200:
            assert time.monotonic() - revoked_at < 1.0, "replica B still counts the revoked key"
            time.sleep(0.02)
