"""`blendrag sync --watch`: a sync after every settled burst of changes under the folder (watchfiles)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

logger = logging.getLogger(__name__)

DEBOUNCE_MS = 1600  # changes closer together than this are one burst: an editor's save, a `git checkout`


def is_watched(root: Path, path: str) -> bool:
    """A change the sync cares about: not under a hidden file or folder (.git among them)."""
    try:
        parts = Path(path).resolve().relative_to(root).parts
    except ValueError:
        return False
    return not any(part.startswith(".") for part in parts)


def watch_folder(
    root: Path,
    sync_once: Callable[[], object],
    *,
    debounce_ms: int = DEBOUNCE_MS,
    stop: threading.Event | None = None,
) -> None:
    """Run `sync_once` after each burst of changes under `root` until `stop` is set (or Ctrl-C). A change made
    while a sync runs is seen after it and gives one more sync."""
    from watchfiles import watch

    root = root.resolve()
    for changes in watch(
        root,
        watch_filter=lambda _change, path: is_watched(root, path),
        debounce=debounce_ms,
        stop_event=stop,
        raise_interrupt=False,
    ):
        logger.info("%d change(s) under %s: syncing", len(changes), root)
        sync_once()
