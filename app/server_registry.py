"""Running servers announce themselves in a per-user file, so `blendrag ask` finds one on any port or data dir.

`<runtime dir>/servers.json` (`runtime_dir`, default `$XDG_RUNTIME_DIR/blendrag`, else
`~/.cache/blendrag`) lists each running server's URL, data dir, pid and the folder it was started from (the
checkout whose `make serve` or `blendrag serve` it is). A server adds itself once it holds
its data dir and removes itself when it stops; a server that died without removing itself is skipped by
readers (its pid is gone) and dropped at the next write. Writes go through a lock file and an atomic
rename, so two servers starting together both end up listed.

A CLI with no server named and no catalog of its own picks one with `choose`: the server started from its own
folder, else the only one running; never the newest of several (that asked another checkout's corpus and
printed its answer), which the CLI lists instead.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from fsio.atomic import write_text_atomic

logger = logging.getLogger(__name__)

SERVERS_FILE = "servers.json"


def default_runtime_dir() -> Path:
    """Where servers announce themselves when `runtime_dir` is not set."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and Path(runtime).is_dir():
        return Path(runtime) / "blendrag"
    return Path.home() / ".cache" / "blendrag"


@dataclass(frozen=True)
class Announced:
    url: str
    data_dir: str  # absolute
    pid: int
    started_at: float
    started_in: str | None = None  # the server's working directory at start (absolute); None: not recorded


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def _read(path: Path) -> list[Announced]:
    try:
        data = json.loads(path.read_text(encoding="utf-8") or "[]")
    except (OSError, ValueError):
        return []
    servers = []
    for item in data if isinstance(data, list) else []:
        try:
            started_in = item.get("started_in")
            servers.append(
                Announced(
                    str(item["url"]),
                    str(item["data_dir"]),
                    int(item["pid"]),
                    float(item["started_at"]),
                    None if started_in is None else str(started_in),
                )
            )
        except (KeyError, TypeError, ValueError):
            continue
    return servers


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[Path]:
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    with open(directory / (SERVERS_FILE + ".lock"), "a+", encoding="utf-8") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            yield directory / SERVERS_FILE
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)


def _write(path: Path, servers: list[Announced]) -> None:
    # Owner-only, as its directory is: it names the user's data dirs.
    write_text_atomic(path, json.dumps([asdict(s) for s in servers], indent=1), mode=0o600)


def announce(directory: Path, url: str, data_dir: Path) -> Announced:
    """List this process's server at `url` (serving `data_dir`); returns its entry."""
    entry = Announced(
        url=url,
        data_dir=str(Path(data_dir).resolve()),
        pid=os.getpid(),
        started_at=time.time(),
        started_in=_working_dir(),
    )
    try:
        with _locked(directory) as path:
            kept = [s for s in _read(path) if _alive(s.pid) and s.pid != entry.pid and s.url != entry.url]
            _write(path, [*kept, entry])
    except OSError as exc:  # announcing helps the CLI find us; a server runs without it
        logger.warning("could not announce the server in %s: %s", directory, exc)
    return entry


def withdraw(directory: Path, entry: Announced) -> None:
    """Remove `entry` (and any server that died without removing itself)."""
    try:
        with _locked(directory) as path:
            _write(path, [s for s in _read(path) if s != entry and _alive(s.pid)])
    except OSError as exc:
        logger.warning("could not remove the server from %s: %s", directory, exc)


def announced(directory: Path) -> list[Announced]:
    """The servers listed whose process is alive, the most recently started first."""
    servers = [s for s in _read(directory / SERVERS_FILE) if _alive(s.pid)]
    return sorted(servers, key=lambda s: -s.started_at)


def _working_dir() -> str | None:
    """This process's working directory, resolved: where `make serve` (or `blendrag serve`) was run."""
    try:
        return str(Path.cwd().resolve())
    except OSError:  # deleted under us: nothing to match a CLI's folder with
        return None


def started_here(servers: Sequence[Announced], here: Path) -> list[Announced]:
    """Those of `servers` started from folder `here` (the checkout a CLI runs in)."""
    folder = str(Path(here).resolve())
    return [s for s in servers if s.started_in == folder]


def choose(servers: Sequence[Announced], here: Path) -> Announced | None:
    """The server a CLI in folder `here` asks among the running `servers`: the one started from `here`, else the
    only one running. None when none runs, or several do and not exactly one of them was started here: the
    caller lists them rather than guess (the newest of several was another data dir's server)."""
    mine = started_here(servers, here)
    if len(mine) == 1:
        return mine[0]
    return servers[0] if len(servers) == 1 else None
