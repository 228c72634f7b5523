"""`blendrag` command line: serve, ingest, sync, ask, mcp, cache, doctor, db, worker, keys, models.

One module per command group; each registers its subcommands (`add_parsers`) and builds what it needs
through `app.build.build_services`.
"""

from __future__ import annotations

import argparse
import logging
import sys

from app.cli.common import EXIT_BUSY, EXIT_USAGE, NO_SERVER, Refused, human_bytes
from app.settings import SettingsError

__all__ = ["EXIT_BUSY", "EXIT_USAGE", "NO_SERVER", "build_parser", "human_bytes", "main"]


def build_parser() -> argparse.ArgumentParser:
    from app.cli import ask, cache, calibrate, doctor, ingest, keys, mcp, models, scaleout, serve, sync

    parser = argparse.ArgumentParser(prog="blendrag", description=__doc__.split("\n")[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    # In the order `blendrag --help` lists them.
    serve.add_parsers(sub)  # serve
    ingest.add_parsers(sub)  # ingest
    sync.add_parsers(sub)  # sync
    ask.add_parsers(sub)  # ask
    mcp.add_parsers(sub)  # mcp
    cache.add_parsers(sub)  # cache stats|verify|prune|convert
    doctor.add_parsers(sub)  # purge-failed, doctor
    scaleout.add_parsers(sub)  # db upgrade|current, worker
    keys.add_parsers(sub)  # keys create|list|revoke
    models.add_parsers(sub)  # models [list|install NAME]
    calibrate.add_parsers(sub)  # calibrate
    return parser


def _remote_error() -> type[Exception]:
    from app.remote import RemoteError

    return RemoteError


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(args.func(args))
    except SettingsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except Refused as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BUSY
    except _remote_error() as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
