"""What every `blendrag` command shares: its settings, the `--data-dir` and client flags, owning the data
dir or reaching the server that owns it, exit codes and number formats."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.datadir_lock import DataDirBusy, DataDirLock, LockOwner, lock_owner
from app.settings import Settings, load_settings

if TYPE_CHECKING:
    from app.remote import RemoteServer

EXIT_USAGE = 2
EXIT_BUSY = 3  # another process owns the data dir and the work cannot be sent to it
NO_SERVER = (
    "no blendrag server found: start one with `make serve` (or `blendrag serve`), or name a running one with "
    "--server URL (or BLENDRAG_URL)"
)


class Refused(RuntimeError):
    """The command cannot run now; the message says what to do instead."""


def settings_of(args: argparse.Namespace, **extra: Any) -> Settings:
    """The settings, on the command's `--data-dir` when it has one."""
    return load_settings(data_dir=getattr(args, "data_dir", None), **extra)


def add_data_dir(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="where the catalog, index and KV store live (default ./data; converted models live in the "
        "machine's cache, models_dir)",
    )


# How a command reaches a server that is not this data dir's owner: (flag, metavar, the environment variable
# its default comes from, help).
_CLIENT_OPTIONS = (
    (
        "--server",
        "URL",
        "BLENDRAG_URL",
        "send the work to the blendrag server at URL (default: $BLENDRAG_URL, the data dir's server, else the "
        "running one started from this folder, or the only one running)",
    ),
    (
        "--api-key",
        "KEY",
        "BLENDRAG_API_KEY",
        "the key sent to the server (a collection key or the admin key; default: $BLENDRAG_API_KEY, "
        "else server.api_key)",
    ),
)


def add_client(p: argparse.ArgumentParser) -> None:
    """How the command reaches a server that is not this data dir's owner, and the key it sends."""
    for flag, metavar, env, help_text in _CLIENT_OPTIONS:
        p.add_argument(flag, default=os.environ.get(env), metavar=metavar, help=help_text)


def client_key(args: argparse.Namespace, settings: Settings) -> str | None:
    """The client's own key (`--api-key` / BLENDRAG_API_KEY), else the server's own `server.api_key`."""
    return getattr(args, "api_key", None) or settings.server.api_key


def busy_message(settings: Settings, owner: LockOwner | None, then: str) -> str:
    who = owner.describe() if owner is not None else "another blendrag process"
    if owner is not None and owner.url is not None:
        what = f"stop the server first (or use another --data-dir), then run `{then}` again"
    else:
        what = f"wait for it to finish, then run `{then}` again"
    return f"data dir {settings.data_dir} is in use by {who}: {what}"


def take_data_dir(
    settings: Settings,
    command: str,
    then: str,
    *,
    remote: bool,
    args: argparse.Namespace | None = None,
    server_only: bool = False,
    local: bool = True,
) -> tuple[RemoteServer | None, DataDirLock | None]:
    """Own the data dir for this command, or (remote=True) reach a server: the one `--server` names, the
    one that owns the data dir, or (the data dir holding no catalog) one that announced itself (the one started
    from this folder, else the only one; several and none of them this folder's: Refused, listing them) or
    answers on the configured port. `server_only`: never take (and so create) a data dir without a catalog.
    `local=False` (with remote=True): never take the data dir, and look for a server as if it held no catalog
    (`blendrag mcp`, which relays a server's tools).

    Returns (server client, None) when the work goes to the running server over HTTP, else (None, lock).
    Raises Refused naming the owner and what to do when neither is possible.
    """
    key = client_key(args, settings) if args is not None else settings.server.api_key
    named = getattr(args, "server", None) if remote else None
    if named:
        from app.remote import RemoteServer, probe

        url = probe(named)
        if url is None:
            raise Refused(f"no blendrag server answers at {named} (check --server / BLENDRAG_URL)")
        return RemoteServer(url, key), None
    owner = lock_owner(settings.data_dir)
    if owner is None and remote and not (local and _has_catalog(settings)):
        # `blendrag ask` in another folder would create ./data and answer from nothing, while the user's
        # server runs elsewhere: a data dir without a catalog sends the work to a running server.
        from app.remote import RemoteServer, SeveralServers, discover
        from app.server_registry import default_runtime_dir

        why = f"{settings.data_dir} holds no catalog" if local else f"`{then}` needs a running server"
        runtime_dir = settings.runtime_dir or default_runtime_dir()
        try:
            found = discover(runtime_dir, settings.server.host, settings.server.port, Path.cwd())
        except SeveralServers as exc:  # never the newest of several: it may serve another checkout's corpus
            raise Refused(f"{why} and {exc}") from exc
        if found is not None:
            url, which = found
            print(f"{why}; sending the work to {which}", file=sys.stderr)
            return RemoteServer(url, key), None
        if not local:
            raise Refused(f"{NO_SERVER}; `{then}` works through a running server only")
        if server_only:
            raise Refused(f"{NO_SERVER}; {settings.data_dir} holds no catalog to answer from")
    if owner is None and local:
        lock = DataDirLock(settings.data_dir)
        try:
            lock.acquire(command)
            return None, lock
        except DataDirBusy as exc:  # taken since we looked
            owner = exc.owner
    if remote and owner is not None and owner.url is not None:
        from app.remote import RemoteServer

        print(f"the server at {owner.url} owns {settings.data_dir}: sending the work to it", file=sys.stderr)
        return RemoteServer(owner.url, key), None
    raise Refused(busy_message(settings, owner, then))


def _has_catalog(settings: Settings) -> bool:
    """Whether the data dir has been used: its SQLite catalog exists (a PostgreSQL catalog always does)."""
    url = settings.catalog.url or ""
    if not url.startswith("sqlite:///"):
        return True
    return Path(url.removeprefix("sqlite:///")).exists()


def human_bytes(n: int | None) -> str:
    """1536 -> "1.5 KiB"; None -> "-"."""
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def duration(seconds: float) -> str:
    """3.24 -> "3.2 s"; 125 -> "2 min 5 s"."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest} s"
