"""The parse server of app/services/ingest/parse_process.py: `python -m ingest.parse_child REQUESTS_FD REPLIES_FD
MEMORY_BYTES`. Reads (path, ingest settings) requests one at a time and answers each with its documents, then
"end" or the loader's error. Its address space is capped at MEMORY_BYTES (`ingest.max_parse_memory_bytes`).

It imports the loaders only: a parse cannot reach the server's state, and the parent kills it at will."""

from __future__ import annotations

import logging
import resource
import sys
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from ingest.config import IngestSettings
from ingest.errors import DocumentTooLarge, LoaderError
from ingest.loaders import iter_documents

logger = logging.getLogger("ingest.parse_child")


def serve(requests: Connection, replies: Connection, memory_bytes: int) -> None:
    while True:
        try:
            path, settings = requests.recv()
        except EOFError:  # the server closed its end: done
            return
        _parse(replies, Path(path), IngestSettings.model_validate(settings), memory_bytes)


def _parse(replies: Connection, path: Path, settings: IngestSettings, memory_bytes: int) -> None:
    try:
        for document in iter_documents(path, settings):
            replies.send(("document", document))
        replies.send(("end", None))
    except LoaderError as exc:
        replies.send(("error", _error(type(exc).__name__, exc.message, exc.path)))
    except MemoryError:
        message = f"parsing needed more than {memory_bytes} bytes of memory, the limit (ingest.max_parse_memory_bytes)"
        replies.send(("error", _error(DocumentTooLarge.__name__, message, str(path))))


def _error(kind: str, message: str, path: str | None) -> dict[str, Any]:
    return {"type": kind, "message": message, "path": path}


def main(argv: list[str]) -> int:
    requests_fd, replies_fd, memory_bytes = (int(a) for a in argv)
    try:
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    except (ValueError, OSError) as exc:  # a hard limit already lower: it holds
        logger.warning("could not cap the parse process's memory: %s", exc)
    serve(Connection(requests_fd, writable=False), Connection(replies_fd, readable=False), memory_bytes)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
