"""Is the port free? Checked before `blendrag serve` loads anything, so a port in use fails in a second
with one line naming what holds it, instead of after loading the model for half a minute."""

from __future__ import annotations

import errno
import logging
import os
import socket
from pathlib import Path

logger = logging.getLogger(__name__)


class PortInUse(RuntimeError):
    """The address cannot be bound; the message names the port and, when it can tell, what holds it."""


def check_port_free(host: str, port: int) -> None:
    """Bind and release (host, port) the way uvicorn will (SO_REUSEADDR); PortInUse if that fails."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise PortInUse(f"cannot listen on {host}:{port}: {exc.strerror}") from exc
            holder = port_holder(host, port)
            message = f"port {port} on {host} is already in use by {holder} (use --port to pick another)"
            raise PortInUse(message) from exc


def port_holder(host: str, port: int) -> str:
    """What listens on the port: a blendrag server (it answers /health), else the process found in /proc,
    else "another process"."""
    from app.remote import find_server

    url = find_server(host, port)
    if url is not None:
        return f"a blendrag server ({url})"
    pid = _listening_pid(port)
    if pid is not None:
        try:
            name = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            name = "?"
        return f"process {pid} ({name})"
    return "another process"


def _listening_pid(port: int) -> int | None:
    """Linux only: the pid owning a socket listening on `port` (from /proc/net/tcp*), None if unknown."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            # local_address is HEXIP:HEXPORT; state 0A is LISTEN
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    if not inodes:
        return None
    targets = {f"socket:[{inode}]" for inode in inodes}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            for fd in os.scandir(f"/proc/{entry.name}/fd"):
                if os.readlink(fd.path) in targets:
                    return int(entry.name)
        except OSError:
            continue
    return None
