"""`BackgroundThread`: one daemon thread running a loop until stopped (the memory trimmer, the index sync)."""

from __future__ import annotations

import threading
from collections.abc import Callable


class BackgroundThread:
    """Runs `target` on a daemon thread: `start` starts it unless it runs, `stop` sets `stopping` (which
    `target` waits on between rounds) and joins it for at most `join_timeout_s`; it may be started again."""

    def __init__(self, target: Callable[[], None], name: str, join_timeout_s: float) -> None:
        self._target = target
        self._name = name
        self._join_timeout_s = join_timeout_s
        self.stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self.stopping.clear()
            self._thread = threading.Thread(target=self._target, name=self._name, daemon=True)
            self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self.stopping.set()
            self._thread.join(timeout=self._join_timeout_s)
            self._thread = None
