from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pgserver import pg_server, pg_url, redis_url  # noqa: F401  (real servers, see tests/pgserver.py)

from app.build import Services, build_services
from app.settings import Settings, load_settings


@pytest.fixture
def pg_settings(tmp_path: Path, tiny_llama_dir: Path, pg_url: str, redis_url: str) -> Settings:  # noqa: F811
    """A scale-out deployment on the tiny model: PostgreSQL catalog + queue, Redis KV tier, fast heartbeats."""
    return load_settings(
        data_dir=tmp_path / "server",
        engine={"model": str(tiny_llama_dir), "max_new_tokens": 8, "num_threads": 1},
        kvcache={"memory_bytes": 64 * 1024 * 1024, "redis_url": redis_url},
        catalog={"url": pg_url, "index_sync_interval_s": 0.2},
        worker={"heartbeat_timeout_s": 3.0, "poll_interval_s": 0.5},
    )


@pytest.fixture
def server_services(pg_settings: Settings) -> Iterator[Services]:
    c = build_services(pg_settings, {"doctor", "ingest"})
    yield c
    c.close()
