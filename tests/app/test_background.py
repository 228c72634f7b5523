from __future__ import annotations

import threading

from app.background import BackgroundThread


def test_runs_until_stopped_and_starts_again() -> None:
    rounds: list[str] = []
    started = threading.Event()

    def loop() -> None:
        started.set()
        while not worker.stopping.wait(0.001):
            pass
        rounds.append(threading.current_thread().name)

    worker = BackgroundThread(loop, "test-loop", join_timeout_s=10)
    worker.stop()  # never started: nothing to stop
    worker.start()
    worker.start()  # already running: still one thread
    assert started.wait(10)
    worker.stop()
    assert rounds == ["test-loop"]
    started.clear()
    worker.start()  # a stopped loop starts again (stopping cleared)
    assert started.wait(10)
    worker.stop()
    assert rounds == ["test-loop", "test-loop"]
