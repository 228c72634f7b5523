"""`blendrag db …` and `blendrag worker`: the scale-out commands (registered by app/cli/__init__.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from app.cli.common import EXIT_USAGE, add_data_dir
from app.settings import load_settings


def _settings(args: argparse.Namespace):  # -> Settings
    return load_settings(data_dir=getattr(args, "data_dir", None))


def _redact(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def cmd_db(args: argparse.Namespace) -> int:
    from sqlalchemy import create_engine

    from app.catalog import migrate as migrations

    settings = _settings(args)
    url = settings.catalog.url or ""
    if url.startswith("sqlite:///"):
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url)
    try:
        match args.db_command:
            case "upgrade":
                before, after = migrations.upgrade(engine)
                print(f"catalog {_redact(url)}: revision {before or '(empty)'} -> {after}")
            case "current":
                current, head = migrations.current_revision(engine), migrations.head_revision()
                state = "up to date" if current == head else f"behind {head}: run `blendrag db upgrade`"
                print(f"catalog {_redact(url)}: revision {current or '(empty)'}, {state}")
                return 0 if current == head else 1
    except Exception as exc:  # a database that cannot be reached: say which, not a traceback
        print(f"error: catalog {_redact(url)}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    finally:
        engine.dispose()
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    settings = _settings(args)
    if not settings.catalog.is_postgres:
        print(
            "error: `blendrag worker` needs a PostgreSQL catalog (catalog.url / BLENDRAG_CATALOG__URL = "
            "postgresql+psycopg://…); with SQLite the server runs ingest jobs itself",
            file=sys.stderr,
        )
        return EXIT_USAGE
    from app.jobs.worker import run_worker

    return run_worker(settings)


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("db", help="catalog schema migrations (SQLite or PostgreSQL)")
    dsub = p.add_subparsers(dest="db_command", required=True)
    for name, help_text in (("upgrade", "apply pending migrations"), ("current", "show the schema revision")):
        dp = dsub.add_parser(name, help=help_text)
        add_data_dir(dp)
    p.set_defaults(func=cmd_db)

    p = sub.add_parser("worker", help="process ingest jobs from the PostgreSQL queue (scale-out)")
    add_data_dir(p)
    p.set_defaults(func=cmd_worker)
