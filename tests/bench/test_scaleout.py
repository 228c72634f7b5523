from __future__ import annotations

import pytest

from bench.cluster import PG_BIN, REDIS_BIN


@pytest.mark.slow  # starts PostgreSQL, Redis, two replicas and three workers as processes
@pytest.mark.skipif(PG_BIN is None or REDIS_BIN is None, reason="needs Debian's postgresql and redis-server")
@pytest.mark.timeout(900)
def test_scaleout_end_to_end(run_bench, dataset_path, tmp_path) -> None:
    code, result, _ = run_bench(
        "scaleout",
        "--dataset",
        str(dataset_path),
        "--chunks",
        "2",
        "--jobs",
        "2",
        "--probes",
        "2",
        "--tmp-dir",
        str(tmp_path),
    )
    assert code == 0
    assert [(r["workers"], r["jobs"], r["documents"], r["chunks"]) for r in result["ingest"]] == [
        (1, 2, 2, 2),
        (2, 2, 2, 2),
    ]  # each short passage is one document of one chunk
    # The rate is chunks ÷ the unrounded time: within what rounding both figures allows, however long it took.
    for r in result["ingest"]:
        low, high = r["chunks"] / (r["seconds"] + 5e-5), r["chunks"] / max(r["seconds"] - 5e-5, 1e-9)
        assert low - 5e-4 <= r["chunks_per_s"] <= high + 5e-4, r
    latency = result["ready_to_searchable_s"]
    assert latency["probes"] == 2 and len(latency["all"]) == 2
    assert 0 <= latency["median"] <= latency["max"] < 5  # the bound
