"""The whole scale-out deployment as real processes on 127.0.0.1: PostgreSQL, Redis, two `blendrag serve`
replicas (own data dirs, same catalog.url and kvcache.redis_url) and `blendrag worker`s (tiny Llama, MiniLM).

Ingest through replica A, follow the job and ask through replica B; delete through B, gone from A;
kill -9 the worker mid-job and the job still completes with `blendrag doctor` clean.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import httpx
import pytest

from bench.cluster import PG_BIN, REDIS_BIN, Cluster, ask, ingest, job, sse_events, wait_job

pytestmark = [
    pytest.mark.slow,  # three model-loading processes at once: minutes on 2 cores
    pytest.mark.skipif(
        PG_BIN is None or REDIS_BIN is None,
        reason="needs Debian's postgresql and redis-server packages (the Makefile installs them)",
    ),
]

DOCS = [
    {
        "title": "Vellmar harbour",
        "text": "The harbour of Vellmar shelters forty fishing boats.\n\n"
        "Its lighthouse, painted red and white, was built in 1871.",
    },
    {
        "title": "Sourdough",
        "text": "Sourdough bread needs flour, water, salt and a lively starter. Bake it at 250 degrees.",
    },
    {"title": "Zorblat", "text": "Quintaro is the capital of Zorblat. Purple rivers cross the city."},
]


def until(predicate, timeout: float, what: str) -> float:  # noqa: ANN001
    start = time.monotonic()
    while not predicate():
        assert time.monotonic() - start < timeout, f"{what}: not within {timeout} s"
        time.sleep(0.05)
    return time.monotonic() - start


@pytest.fixture
def cluster(tmp_path: Path, tiny_llama_dir: Path) -> Cluster:
    c = Cluster.start(
        tmp_path,
        settings_env={
            "BLENDRAG_ENGINE__MODEL": str(tiny_llama_dir),
            "BLENDRAG_ENGINE__NUM_THREADS": "1",
            "BLENDRAG_ENGINE__MAX_NEW_TOKENS": "4",
            "BLENDRAG_WORKER__HEARTBEAT_TIMEOUT_S": "3",
            "BLENDRAG_WORKER__POLL_INTERVAL_S": "0.5",
        },
    )
    try:
        yield c
    finally:
        c.stop()


@pytest.mark.timeout(1800)
def test_two_replicas_one_worker(cluster: Cluster) -> None:
    a = cluster.add_replica(wait=False)
    b = cluster.add_replica(wait=False)
    worker = cluster.add_worker()
    cluster.wait_ready(a)
    cluster.wait_ready(b)

    accepted = ingest(a, DOCS)
    ids = dict(zip([d["title"] for d in DOCS], accepted["document_ids"], strict=True))
    # progress over SSE, from the replica that did not take the request
    with httpx.stream("GET", f"{b.url}/ingest/jobs/{accepted['job_id']}/events", timeout=300) as r:
        events = list(sse_events(r))
    assert events[-1][0] == "done"
    assert events[-1][1]["status"] == "succeeded" and events[-1][1]["errors"] == []
    assert {name for name, _ in events[:-1]} <= {"progress"}

    # searchable on B within 5 s of "ready"
    def b_finds_it() -> bool:
        got = ask(b, "Which city is the capital of Zorblat?", top_k=1)
        return bool(got.get("sources")) and got["sources"][0]["document_id"] == ids["Zorblat"]

    until(b_finds_it, 5, "document ready through A searchable on B")
    answer = ask(b, "What colour is the lighthouse of Vellmar harbour?", top_k=2)
    assert answer["sources"][0]["title"] == "Vellmar harbour"
    done = answer["done"]
    # the worker's KV reached B through Redis: every source is a hit
    assert (done["kv_hits"], done["kv_misses"]) == (len(answer["sources"]), 0)

    # both replicas hold the same index, built from the catalog
    def index_of(replica) -> dict:  # noqa: ANN001
        return httpx.get(f"{replica.url}/api/index", timeout=30).json()

    until(lambda: index_of(a) == index_of(b), 5, "both replicas at the same change log position")
    assert index_of(a)["source"] == "catalog" and index_of(a)["chunks"] >= len(DOCS)

    # coverage is the shared state, the same from both replicas
    cov_a, cov_b = (httpx.get(f"{r.url}/api/coverage", timeout=30).json() for r in (a, b))
    assert cov_a == cov_b and cov_a["coverage"] == 1.0

    # delete through B: gone from A within 5 s
    assert httpx.delete(f"{b.url}/documents/{ids['Zorblat']}", timeout=30).status_code in (200, 204)
    assert httpx.get(f"{a.url}/documents/{ids['Zorblat']}", timeout=30).status_code == 404

    def a_lost_it() -> bool:
        got = ask(a, "Which city is the capital of Zorblat?", top_k=3)
        return ids["Zorblat"] not in {s["document_id"] for s in got["sources"]}

    until(a_lost_it, 5, "document deleted through B gone from A")

    # kill -9 the worker mid-job; a new worker finishes it
    paragraphs = [
        f"Log {i} of the Vellmar lighthouse: lamp {i} lit at {i % 12} o'clock by keeper {i * 3}." for i in range(40)
    ]
    big = [
        {"title": f"Log book {d}", "text": "\n\n".join(paragraphs[d:] + paragraphs[:d]) + f" Book {d}."}
        for d in range(12)
    ]
    job_id = ingest(a, big)["job_id"]
    until(lambda: job(b, job_id)["stage"] in ("embed", "kv"), 300, "the worker mid-job")
    worker.stop(signal.SIGKILL)
    assert job(b, job_id)["status"] == "running"
    cluster.add_worker()
    finished = wait_job(a, job_id, timeout=600)
    assert finished["status"] == "succeeded", finished
    assert finished["document_ids"] and finished["errors"] == []
    until(
        lambda: all(
            httpx.get(f"{r.url}/documents/{d}", timeout=30).json()["status"] == "ready"
            for r in (a, b)
            for d in finished["document_ids"]
        ),
        5,
        "re-run documents ready everywhere",
    )
    doctor = cluster.run("doctor", "--data-dir", str(cluster.root / "doctor"))
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    assert "stranded pending documents: 0" in doctor.stdout
    assert "committed chunks without fresh KV: 0" in doctor.stdout
