"""The machine's model cache: a conversion runs once under a file lock, however many threads or processes
ask for it at once; older models dirs are read, never written; a removal frees the directory."""

from __future__ import annotations

import logging
import multiprocessing
import threading
import time
from pathlib import Path

import pytest

from engine.models.cache import LOCKS_DIR, cached_models, conversion_lock, ensure_converted, remove_cached

WAIT_S = 60.0  # a bound on every wait below, so a deadlock fails instead of hanging


def _ready(target: Path) -> bool:
    return (target / "done").is_file()


def _make(target: Path) -> None:
    target.mkdir(parents=True)
    (target / "weights.bin").write_bytes(b"w" * 1000)
    (target / "done").write_text("")


def test_two_threads_convert_once_and_the_second_says_it_waits(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="engine.models.cache")
    started, release = threading.Event(), threading.Event()
    calls: list[str] = []

    def slow_make(target: Path) -> None:
        calls.append(threading.current_thread().name)
        started.set()
        assert release.wait(WAIT_S)
        _make(target)

    results: dict[str, Path] = {}

    def run() -> None:
        name = threading.current_thread().name
        results[name] = ensure_converted("m", tmp_path, is_ready=_ready, make=slow_make)

    first = threading.Thread(target=run, name="first")
    first.start()
    assert started.wait(WAIT_S)
    second = threading.Thread(target=run, name="second")
    second.start()
    deadline = time.monotonic() + WAIT_S
    while not any("waiting for it" in r.getMessage() for r in caplog.records):
        assert time.monotonic() < deadline, "the second thread never waited on the lock"
        time.sleep(0.01)
    release.set()
    first.join(WAIT_S)
    second.join(WAIT_S)
    assert calls == ["first"]  # the second found it made once the lock was free
    assert results == {"first": tmp_path / "m", "second": tmp_path / "m"}
    waits = [r.getMessage() for r in caplog.records if "waiting for it" in r.getMessage()]
    assert waits == [f"model m is being converted by another process into {tmp_path}; waiting for it"]


def _convert_in_process(models_dir: str, log: str, go: multiprocessing.synchronize.Event) -> None:
    def make(target: Path) -> None:
        with open(log, "a") as fh:
            fh.write("converted\n")
        go.set()
        time.sleep(1.0)  # long enough for the other process to reach the lock
        _make(target)

    ensure_converted("m", Path(models_dir), is_ready=_ready, make=make)


def test_two_processes_convert_once(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    log = tmp_path / "log"
    go = ctx.Event()
    first = ctx.Process(target=_convert_in_process, args=(str(tmp_path / "cache"), str(log), go))
    first.start()
    assert go.wait(WAIT_S)  # the first holds the lock and is converting
    second = ctx.Process(target=_convert_in_process, args=(str(tmp_path / "cache"), str(log), go))
    second.start()
    for proc in (first, second):
        proc.join(WAIT_S)
        assert proc.exitcode == 0
    assert log.read_text() == "converted\n"
    assert _ready(tmp_path / "cache" / "m")


def test_a_failed_conversion_releases_the_lock_and_the_next_caller_converts(tmp_path: Path) -> None:
    def broken(target: Path) -> None:
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        ensure_converted("m", tmp_path, is_ready=_ready, make=broken)
    assert ensure_converted("m", tmp_path, is_ready=_ready, make=_make) == tmp_path / "m"
    assert _ready(tmp_path / "m")


def test_an_older_models_dir_is_read_first_and_never_written(tmp_path: Path) -> None:
    legacy, cache = tmp_path / "data" / "models", tmp_path / "cache"
    _make(legacy / "m")

    def must_not_run(target: Path) -> None:
        raise AssertionError("converted again")

    assert ensure_converted("m", cache, is_ready=_ready, make=must_not_run, read_also=(legacy,)) == legacy / "m"
    assert not cache.exists()  # not even a lock file
    # A model the older dir lacks is made in the cache, not there.
    assert ensure_converted("n", cache, is_ready=_ready, make=_make, read_also=(legacy,)) == cache / "n"
    assert sorted(p.name for p in legacy.iterdir()) == ["m"]


def test_cached_models_lists_converted_dirs_and_remove_frees_them(tmp_path: Path) -> None:
    from engine.models.convert import MARKER

    target = tmp_path / "gguf-tiny-abc"
    target.mkdir()
    (target / "config.json").write_text("{}")
    (target / "model.safetensors").write_bytes(b"x" * 500)
    (target / MARKER).write_text('{"gguf_path": "/models/tiny.gguf"}')
    (tmp_path / "half-written").mkdir()  # no marker: not a conversion
    listed = cached_models(tmp_path)
    assert [(m.name, m.source) for m in listed] == [("gguf-tiny-abc", "tiny.gguf")]
    size = 2 + 500 + len('{"gguf_path": "/models/tiny.gguf"}')
    assert listed[0].num_bytes == size
    assert remove_cached(tmp_path, "gguf-tiny-abc") == size
    assert not target.exists() and cached_models(tmp_path) == []
    assert remove_cached(tmp_path, "gguf-tiny-abc") == 0
    for bad in ("", "../etc", ".locks"):
        with pytest.raises(ValueError, match="not a model directory name"):
            remove_cached(tmp_path, bad)


def test_remove_waits_for_a_conversion_in_progress(tmp_path: Path) -> None:
    _make(tmp_path / "m")
    removed = threading.Event()
    with conversion_lock(tmp_path, "m"):
        worker = threading.Thread(target=lambda: (remove_cached(tmp_path, "m"), removed.set()))
        worker.start()
        assert not removed.wait(0.2)  # held back by the lock
        assert (tmp_path / "m" / "done").is_file()
    worker.join(WAIT_S)
    assert removed.is_set() and not (tmp_path / "m").exists()
    assert (tmp_path / LOCKS_DIR / "m.lock").is_file()
