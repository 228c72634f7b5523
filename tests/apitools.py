"""Helpers for the HTTP API and browser tests: settings for a tiny-model server, SSE parsing, waiting for
jobs, and a real uvicorn server on 127.0.0.1."""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

from app.settings import Settings, load_settings

CORPUS = [
    {
        "title": "Zorblat facts",
        "tags": ["planets"],
        "source": "corpus:zorblat",
        "text": "Quintaro is the capital of the planet Zorblat. It has purple rivers and a kite festival in May.",
    },
    {
        "title": "Baking notes",
        "tags": ["food"],
        "source": "corpus:bread",
        "text": "Sourdough needs flour, water, salt and a starter. Bake it at 250 degrees for forty minutes.",
    },
    {
        "title": "Moon notes",
        "tags": ["planets"],
        "source": "corpus:moon",
        "text": "The Moon orbits the Earth every 27.3 days and always shows the same face to us.",
    },
]
MAX_FILE_BYTES = 64 * 1024
# Browser contexts of the UI tests: Playwright's wait_for_function evaluates its expression with eval, which
# the pages' CSP (script-src 'self') refuses; those tests bypass it, and test_ui_csp.py checks the pages under it.
BYPASS_CSP = {"bypass_csp": True}


def server_settings(data_dir: Path, tiny_llama_dir: Path, **overrides: Any) -> Settings:
    """Like the shared `tiny_settings`, for a module-scoped data dir, plus overrides per section."""
    sections: dict[str, dict[str, Any]] = {
        "engine": {"model": str(tiny_llama_dir), "max_new_tokens": 8, "num_threads": 2, "dtype": "float32"},
        "kvcache": {"memory_bytes": 64 * 1024 * 1024},
        "ingest": {"max_file_bytes": MAX_FILE_BYTES},
        # One test client asks far more often than a person: rate limits are tested where they are set.
        "server": {"ask_rate_per_minute": None},
    }
    for section, values in overrides.items():
        sections.setdefault(section, {}).update(values)
    return load_settings(data_dir=data_dir, **sections)


def wait_for_job(
    client: Any, job_id: str, timeout_s: float = 60, headers: dict[str, str] | None = None
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    job: dict[str, Any] = {}
    while time.monotonic() < deadline:
        job = client.get(f"/ingest/jobs/{job_id}", headers=headers).json()
        if job["status"] in ("succeeded", "failed", "cancelled"):
            return job
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} did not finish: {job}")


def ingest_corpus(client: Any, headers: dict[str, str] | None = None) -> dict[str, str]:
    """Ingest CORPUS; returns {title: document id}."""
    accepted = client.post("/ingest", json={"documents": CORPUS}, headers=headers)
    assert accepted.status_code == 202, accepted.text
    body = accepted.json()
    job = wait_for_job(client, body["job_id"], headers=headers)
    assert job["status"] == "succeeded", job
    return {doc["title"]: doc_id for doc, doc_id in zip(CORPUS, body["document_ids"], strict=True)}


class LiveServer:
    """uvicorn serving an app on 127.0.0.1 in a thread, on a socket bound before start (no port race)."""

    def __init__(self, app: Any) -> None:
        import uvicorn

        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on", proxy_headers=False))
        self._thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self._sock]}, daemon=True)

    def __enter__(self) -> LiveServer:
        self._thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=30)
        self._sock.close()


def fuzz_settings(max_examples: int) -> Any:
    """Hypothesis settings of the Schemathesis hunts: generated cases only, no deadline, no example database, and
    the same cases every run (CI must not fail by chance); BLENDRAG_FUZZ_RANDOM=1 explores new ones."""
    from hypothesis import HealthCheck, Phase, settings

    return settings(
        max_examples=max_examples,
        deadline=None,
        database=None,
        derandomize=not os.environ.get("BLENDRAG_FUZZ_RANDOM"),
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
