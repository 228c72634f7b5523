"""The machine's model cache: converted checkpoints shared by every data dir, each made once under a file lock.

Converting a catalogue model or a GGUF file costs minutes of CPU and gigabytes of disk. One copy per machine
(as Ollama keeps ~/.ollama/models and Hugging Face one cache per user) serves every data dir, server, worker,
CLI command and bench run. Two processes that need the same model at the same time convert it once: the
first takes an exclusive `flock` on `<cache>/.locks/<name>.lock` and converts, the others wait on that lock
(and log that they wait), then find the model converted and load it. The kernel holds the lock for the open
file, so a process that dies mid-conversion releases it and the next one converts (the conversion itself
writes under a staging name, engine/models/convert.py, so nothing half-written is ever trusted).

A data dir made before the cache existed kept its own `models/`; it is still read (`read_also`), never written.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from engine.models.convert import is_converted, read_marker

logger = logging.getLogger(__name__)

LOCKS_DIR = ".locks"


@dataclass(frozen=True)
class CachedModel:
    """One converted checkpoint directory in a models dir, as `blendrag models` lists it."""

    name: str  # the directory's name: a catalogue entry's converted_dir, or gguf-<stem>-<key>
    path: Path
    num_bytes: int
    # the catalogue name, GGUF file or ollama:NAME:TAG it was converted from ("" when the marker is unreadable)
    source: str


def dir_bytes(path: Path) -> int:
    """Bytes of the files under `path` (0 when it is not a directory)."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else 0


@contextlib.contextmanager
def conversion_lock(models_dir: Path, name: str, *, doing: str | None = None) -> Iterator[None]:
    """Hold the cache's lock on `name` (exclusive across threads and processes: each holder opens its own file
    description, which is what `flock` locks); waits, and says so in the log, while another holder converts.
    `doing`: what the log says the other holder does (default "model `name` is being converted"); decode's
    compact weights (engine/decode_weights.py) are made once under the same kind of lock."""
    locks = Path(models_dir) / LOCKS_DIR
    locks.mkdir(parents=True, exist_ok=True)
    with open(locks / f"{name}.lock", "a+b") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            # A warning, so that a CLI command (which logs warnings only) says why it sits still for minutes.
            doing = doing or f"model {name} is being converted"
            logger.warning("%s by another process into %s; waiting for it", doing, models_dir)
            t0 = time.perf_counter()
            fcntl.flock(fh, fcntl.LOCK_EX)
            logger.info("waited %.1f s for the other conversion of %s", time.perf_counter() - t0, name)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def ensure_converted(
    name: str,
    models_dir: Path,
    *,
    is_ready: Callable[[Path], bool],
    make: Callable[[Path], object],
    read_also: Sequence[Path] = (),
) -> Path:
    """The directory `name`: found ready in `read_also` (older data dirs' models/) or in the cache, else made
    there by `make(target)` under the cache's lock. A process that waited on the lock re-checks before making
    it: the holder it waited for has usually just made it."""
    for other in read_also:
        if Path(other) != Path(models_dir) and is_ready(Path(other) / name):
            return Path(other) / name
    target = Path(models_dir) / name
    if is_ready(target):
        return target
    with conversion_lock(models_dir, name):
        if not is_ready(target):
            make(target)
    return target


def cached_models(models_dir: Path) -> list[CachedModel]:
    """The converted checkpoints in `models_dir`, by name."""
    root = Path(models_dir)
    if not root.is_dir():
        return []
    found = []
    for path in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        if not is_converted(path):
            continue
        marker = read_marker(path)
        ollama = f"ollama:{marker['ollama_model']}" if marker.get("ollama_model") else ""
        source = str(marker.get("model") or ollama or Path(str(marker.get("gguf_path") or "")).name)
        found.append(CachedModel(path.name, path, dir_bytes(path), source))
    return found


def remove_cached(models_dir: Path, name: str) -> int:
    """Delete the converted directory `name` (and a joined GGUF `name`.gguf left beside it) under its lock, so
    a conversion in progress is never cut short. Returns the bytes freed (0: there was nothing)."""
    if not name or "/" in name or name.startswith("."):
        raise ValueError(f"not a model directory name: {name!r}")
    root = Path(models_dir)
    target = root / name
    joined = root / f"{name}.gguf"
    if not target.exists() and not joined.exists():
        return 0
    with conversion_lock(root, name):
        freed = dir_bytes(target)
        shutil.rmtree(target, ignore_errors=True)
        if joined.is_file():
            freed += joined.stat().st_size
            joined.unlink()
    logger.info("removed %s from %s (%d bytes)", name, root, freed)
    return freed
