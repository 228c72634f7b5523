"""`python -m bench scaleout`: ingest rate with 1 and 2 `blendrag worker`s, and ready→searchable latency.

Starts a real scale-out deployment on 127.0.0.1 (bench/cluster.py: PostgreSQL and Redis from Debian's
packages, two `blendrag serve` replicas A and B, workers as separate processes).

1. Ingest rate, end to end: --chunks nq6 passages (one passage = one document = one chunk), split into
   --jobs jobs submitted at once through replica A; the clock runs from the first POST /ingest to the last
   job `succeeded` (parse, chunk, embed, KV precompute into Redis, commit to PostgreSQL). Once with 1 worker,
   once with 2 (new passages each round, so nothing is a duplicate).
2. Ready → searchable: --probes single documents ingested through A; for each, the time from A first
   reporting the document `ready` (GET /documents/{id}, polled every 10 ms) to replica B's index holding
   its chunks (GET /api/index, polled every 10 ms). B polls the catalog's change log every
   catalog.index_sync_interval_s (0.5 s by default), which bounds this.

Timing figures: run it alone on the machine. The JSON records the load average at start and end.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench import harness
from bench.cluster import Cluster, Process, ingest, wait_job
from bench.data import load_dataset
from bench.inprocess import resolve_model

logger = logging.getLogger(__name__)

NAME = "scaleout"
HELP = "ingest rate with 1 and 2 workers; ready→searchable latency"


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset", type=Path, default=harness.DEFAULT_NQ6, help="nq6-shaped passages JSON")
    parser.add_argument("--chunks", type=int, default=96, help="passages ingested per round (one chunk each)")
    parser.add_argument("--jobs", type=int, default=8, help="jobs each round's passages are split into")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="worker counts to measure")
    parser.add_argument("--probes", type=int, default=10, help="documents timed for ready→searchable")
    parser.add_argument(
        "--model", default="builtin", help="a catalogue name (builtin = smollm2-135m), a GGUF file or an HF dir"
    )
    parser.add_argument(
        "--models-dir", type=Path, default=None, help="where the model is converted once (default: the model cache)"
    )
    parser.add_argument("--threads", type=int, default=None, help="torch threads per process")
    parser.add_argument("--tmp-dir", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=harness.DEFAULT_OUT_DIR / "scaleout.json")


def passages(dataset: Path) -> list[dict[str, str]]:
    seen: set[tuple[str, str]] = set()
    out = []
    for example in load_dataset(dataset):
        for p in example.passages:
            if (p.title, p.text) not in seen:
                seen.add((p.title, p.text))
                out.append({"title": p.title, "text": p.text})
    return out


def ingest_round(
    cluster: Cluster, replica: Process, docs: list[dict[str, str]], num_jobs: int, num_workers: int
) -> dict[str, Any]:
    workers = [cluster.add_worker() for _ in range(num_workers)]
    try:
        # Workers load their models first: an idle queue is not part of the ingest rate.
        deadline = time.monotonic() + 600
        while not all("waiting for ingest jobs" in w.log.read_text(errors="replace") for w in workers):
            if time.monotonic() > deadline or any(w.proc.poll() is not None for w in workers):
                raise RuntimeError("workers did not start; see " + ", ".join(str(w.log) for w in workers))
            time.sleep(0.2)
        size = -(-len(docs) // num_jobs)
        start = time.perf_counter()
        job_ids = [ingest(replica, docs[i : i + size])["job_id"] for i in range(0, len(docs), size)]
        finished = [wait_job(replica, job_id) for job_id in job_ids]
        elapsed = time.perf_counter() - start
    finally:
        for w in workers:
            w.stop()
    bad = [j for j in finished if j["status"] != "succeeded"]
    if bad:
        raise RuntimeError(f"{len(bad)} job(s) did not succeed: {bad[0]['errors'][:3]}")
    num_chunks = sum(
        httpx.get(f"{replica.url}/documents/{d}", timeout=30).json()["num_chunks"]
        for j in finished
        for d in j["document_ids"]
    )
    return {
        "workers": num_workers,
        "jobs": len(job_ids),
        "documents": len(docs),
        "chunks": num_chunks,
        "seconds": round(elapsed, 4),  # four places: two made a sub-second round's rate disagree with it by 2%
        "chunks_per_s": round(num_chunks / elapsed, 3),
        "load_avg": harness.load_avg(),
    }


def probe_latency(a: Process, b: Process, docs: list[dict[str, str]]) -> list[float]:
    def index_chunks(replica: Process) -> int:
        return httpx.get(f"{replica.url}/api/index", timeout=30).json()["chunks"]

    latencies = []
    for doc in docs:
        before = index_chunks(b)
        document_id = ingest(a, [doc])["document_ids"][0]
        while (got := httpx.get(f"{a.url}/documents/{document_id}", timeout=30).json())["status"] != "ready":
            if got["status"] == "failed":
                raise RuntimeError(f"probe document failed: {got['error']}")
            time.sleep(0.01)
        ready_at = time.perf_counter()
        deadline = ready_at + 60
        while index_chunks(b) < before + got["num_chunks"]:
            if time.perf_counter() > deadline:
                raise RuntimeError("replica B never indexed the probe document")
            time.sleep(0.01)
        latencies.append(time.perf_counter() - ready_at)
    return latencies


def main(args: argparse.Namespace) -> int:
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per poll otherwise
    record = harness.RunRecord.start(args)
    pool = passages(args.dataset)
    needed = args.chunks * len(args.workers) + args.probes
    if len(pool) < needed:
        raise SystemExit(f"{args.dataset} has {len(pool)} distinct passages; this run needs {needed}")
    env = {"BLENDRAG_ENGINE__MODEL": resolve_model(args.model, args.models_dir)}
    if args.threads:
        env["BLENDRAG_ENGINE__NUM_THREADS"] = str(args.threads)
    root = Path(tempfile.mkdtemp(prefix="blendrag-scaleout-", dir=args.tmp_dir))
    cluster = Cluster.start(root, settings_env=env)
    try:
        a, b = cluster.add_replica(wait=False), cluster.add_replica(wait=False)
        cluster.wait_ready(a)
        cluster.wait_ready(b)
        rounds = []
        for n, num_workers in enumerate(args.workers):
            docs = pool[n * args.chunks : (n + 1) * args.chunks]
            rounds.append(ingest_round(cluster, a, docs, args.jobs, num_workers))
            logger.info("%d worker(s): %.3f chunks/s", num_workers, rounds[-1]["chunks_per_s"])
        probe_docs = pool[len(args.workers) * args.chunks : needed]
        worker = cluster.add_worker()
        latencies = probe_latency(a, b, probe_docs)
        worker.stop()
    finally:
        cluster.stop()
    result = harness.result_header(
        NAME,
        args,
        model=args.model,
        chunks_per_round=args.chunks,
        jobs_per_round=args.jobs,
        ingest=rounds,
        ready_to_searchable_s={
            "probes": len(latencies),
            "median": round(statistics.median(latencies), 3),
            "max": round(max(latencies), 3),
            "all": [round(x, 3) for x in latencies],
        },
    )
    harness.write_result(args, result, record)
    for r in rounds:
        print(
            f"ingest, {r['workers']} worker(s): {r['chunks']} chunks in {r['seconds']} s = "
            f"{r['chunks_per_s']} chunks/s (load avg {r['load_avg']})"
        )
    lat = result["ready_to_searchable_s"]
    print(f"ready on A -> searchable on B: median {lat['median']} s, max {lat['max']} s over {lat['probes']} docs")
    print(
        f"load average at start {result['run']['load_avg_start']}, end {result['run']['load_avg_end']}; "
        f"wrote {args.out}"
    )
    return 0
