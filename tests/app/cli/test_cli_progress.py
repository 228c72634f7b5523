"""`blendrag ingest` progress: every stage ends at its total, empty stages say so once, no TTY → plain lines."""

from __future__ import annotations

import io
import logging

from app.access_log import PollingFilter
from app.cli.progress import IngestProgress


def job(status: str, stage: str | None, **progress: tuple[int, int]) -> dict:
    stages = {k: {"done": d, "total": t} for k, (d, t) in progress.items()}
    return {"status": status, "stage": stage, "progress": stages}


ZERO = {"parse": (0, 0), "chunk": (0, 0), "embed": (0, 0), "kv": (0, 0), "commit": (0, 0)}

# What a real job reports: updates are throttled, so most stages are seen mid-way or not at all.
UPDATES = [
    job("running", "parse", **(ZERO | {"parse": (0, 1)})),
    job("running", "embed", **(ZERO | {"parse": (1, 1), "chunk": (1, 1), "embed": (0, 42)})),
    job("running", "kv", **(ZERO | {"parse": (1, 1), "chunk": (1, 1), "embed": (42, 42), "kv": (40, 42)})),
]
DONE = job("succeeded", None, parse=(1, 1), chunk=(1, 1), embed=(42, 42), kv=(42, 42), commit=(1, 1))


def test_without_a_terminal_each_stage_prints_one_line_at_its_total() -> None:
    out = io.StringIO()
    progress = IngestProgress(out, tty=False)
    for update in UPDATES:
        progress.update(update)
    progress.finish(DONE)
    assert out.getvalue().splitlines() == [
        " parse: 1/1",
        " chunk: 1/1",
        " embed: 42/42",
        "    kv: 42/42",
        "commit: 1/1",
    ]


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def final_bar_lines(text: str) -> list[str]:
    """The last state of each bar: tqdm redraws a line with \\r, so keep what follows the last \\r."""
    return [line.rsplit("\r", 1)[-1].strip() for line in text.split("\n") if line.strip()]


def test_in_a_terminal_finished_stages_end_at_their_totals() -> None:
    out = FakeTerminal()
    progress = IngestProgress(out)
    for update in UPDATES:
        progress.update(update)
    progress.finish(DONE)
    lines = final_bar_lines(out.getvalue())
    assert [line.split(":")[0].strip() for line in lines] == ["parse", "chunk", "embed", "kv", "commit"]
    for line, count in zip(lines, ("1/1", "1/1", "42/42", "42/42", "1/1"), strict=True):
        assert "100%" in line and count in line, line


def test_an_empty_stage_says_nothing_to_do_once() -> None:
    out = io.StringIO()
    progress = IngestProgress(out, tty=False)
    empty = job("running", "kv", parse=(1, 1), chunk=(1, 1), embed=(0, 0), kv=(0, 0), commit=(0, 0))
    for _ in range(3):
        progress.update(empty)
    progress.finish(job("succeeded", None, parse=(1, 1), chunk=(1, 1), embed=(0, 0), kv=(0, 0), commit=(0, 0)))
    assert out.getvalue().splitlines() == [
        " parse: 1/1",
        " chunk: 1/1",
        " embed: nothing to do",
        "    kv: nothing to do",
        "commit: nothing to do",
    ]


def test_a_failed_job_stops_at_the_stage_it_failed_in() -> None:
    out = io.StringIO()
    progress = IngestProgress(out, tty=False)
    progress.update(UPDATES[2])
    progress.finish(job("failed", None, parse=(1, 1), chunk=(1, 1), embed=(42, 42), kv=(40, 42), commit=(0, 0)))
    assert out.getvalue().splitlines() == [" parse: 1/1", " chunk: 1/1", " embed: 42/42", "    kv: 40/42 (failed)"]


def record(method: str, path: str, status: int) -> logging.LogRecord:
    args = ("127.0.0.1:5000", method, path, "1.1", status)
    return logging.LogRecord("uvicorn.access", logging.INFO, "", 0, '%s - "%s %s HTTP/%s" %d', args, None)


def test_polling_is_kept_out_of_the_access_log() -> None:
    keep = PollingFilter().filter
    assert not keep(record("GET", "/ingest/jobs/abc", 200))
    assert not keep(record("GET", "/ingest/jobs?limit=10", 200))
    assert not keep(record("GET", "/api/stats", 200))
    assert keep(record("GET", "/ingest/jobs/abc", 404))  # a failing poll is worth a line
    assert keep(record("POST", "/ingest", 202))
    assert keep(record("POST", "/ingest/jobs/abc/cancel", 200))
    assert keep(record("GET", "/documents", 200))
