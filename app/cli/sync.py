"""`blendrag sync PATH`: keep a collection equal to a folder (or a git work tree), in this process or through
the server; `--watch` keeps following it."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from app.cli.common import EXIT_USAGE, add_client, add_data_dir, duration, human_bytes, settings_of, take_data_dir

if TYPE_CHECKING:
    from app.services.folder_sync.runner import SyncReport, SyncTarget
    from app.settings import Settings

MAX_LISTED = 10  # skipped / failed files listed one per line before "… n more"


def collection_for(folder: Path) -> str:
    """The collection a folder is synced into by default: its own, named after it ("My Docs" -> "My-Docs"),
    so a sync never deletes documents it did not bring, and two folders' `README.md` never replace each other."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", folder.resolve().name).strip("-._")[:64].rstrip("-._")
    return name or "folder"


def _listed(lines: list[str]) -> list[str]:
    return lines[:MAX_LISTED] + ([f"… {len(lines) - MAX_LISTED} more"] if len(lines) > MAX_LISTED else [])


def print_report(report: SyncReport, collection: str) -> int:
    """The sync's summary; 1 when a file's new version failed, else 0."""
    c = report.outcome.changes
    print(
        f"synced {report.scan.root} into collection {collection!r}"
        f"{' (git: ignored files left out)' if report.scan.git else ''}: {c.added} added, {c.changed} changed, "
        f"{c.removed} removed, {c.unchanged} unchanged, {c.failed} failed, {c.skipped} skipped in "
        f"{duration(report.seconds)}"
    )
    kv = report.ingest.kv
    if report.ingest.job_ids:
        print(
            f"KV: {int(kv.get('computed', 0))} of {int(kv.get('total', 0))} chunk(s) computed in "
            f"{kv.get('seconds', 0.0):.2f} s (the rest were stored already), +{human_bytes(int(kv.get('bytes', 0)))}"
        )
    notes = [f"  skipped {s.source}: {s.reason}" for s in report.skipped]
    notes += [f"  failed {e.get('source')}: {e.get('error')}" for e in report.ingest.errors]
    notes += [f"  {s}: still being ingested by another job; the next sync removes it" for s in report.outcome.busy]
    notes += [f"  {s}: changed during the sync; the next sync takes it" for s in report.changed_during]
    for line in _listed(notes):
        print(line, file=sys.stderr)
    return 1 if c.failed else 0


def _sync_loop(args: argparse.Namespace, settings: Settings, target: SyncTarget, collection: str) -> int:
    from app.services.folder_sync.runner import run_sync
    from app.services.folder_sync.scan import FolderError
    from app.services.folder_sync.service import SyncRefused

    root = Path(args.path)

    def once() -> int:
        report = run_sync(
            root,
            target,
            collection,
            extensions=settings.ingest.allowed_extensions,
            max_file_bytes=settings.ingest.max_file_bytes,
            replace_collection=args.replace,
        )
        return print_report(report, collection)

    try:
        code = once()
    except (FolderError, SyncRefused) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if not args.watch:
        return code
    from app.services.folder_sync.watch import watch_folder

    print(f"watching {root.resolve()} (Ctrl-C stops)", flush=True)

    def again() -> None:
        try:
            once()
        except FolderError as exc:  # the folder went away: say so, keep watching for it to come back
            print(f"error: {exc}", file=sys.stderr)
        sys.stdout.flush()

    watch_folder(root, again, debounce_ms=args.debounce_ms)
    return code


def cmd_sync(args: argparse.Namespace) -> int:
    from app.services.key_service import KeyRequestError, check_collection

    settings = settings_of(args)
    root = Path(args.path)
    if not root.exists():
        print(f"error: {root}: no such folder", file=sys.stderr)
        return EXIT_USAGE
    if not root.is_dir():
        print(f"error: {root}: not a folder (`blendrag ingest` takes files)", file=sys.stderr)
        return EXIT_USAGE
    try:
        collection = check_collection(args.collection or collection_for(root))
    except KeyRequestError as exc:
        print(f"error: --collection: {exc}", file=sys.stderr)
        return EXIT_USAGE
    remote, lock = take_data_dir(settings, "sync", "blendrag sync", remote=True, args=args)
    if remote is not None:
        from app.services.folder_sync.targets import RemoteTarget

        with remote:
            return _sync_loop(args, settings, RemoteTarget(remote), collection)
    assert lock is not None
    with lock:
        from app.build import build_services
        from app.services.folder_sync.service import FolderSyncService
        from app.services.folder_sync.targets import LocalTarget

        services = build_services(settings, {"ingest"}, role="worker")
        try:
            assert services.ingest is not None and services.catalog is not None and services.documents is not None
            sync = FolderSyncService(services.catalog, services.documents)
            target = LocalTarget(sync, services.ingest, settings.uploads_dir)
            return _sync_loop(args, settings, target, collection)
        finally:
            services.close()


def add_parsers(sub: argparse._SubParsersAction) -> None:
    from app.services.folder_sync.watch import DEBOUNCE_MS

    p = sub.add_parser(
        "sync",
        help="keep a collection equal to a folder or git work tree: new files ingested, changed ones re-ingested "
        "(unchanged chunks keep their KV), deleted ones removed",
    )
    p.add_argument("path", help="the folder (in a git work tree, files git ignores are left out)")
    p.add_argument(
        "--collection",
        default=None,
        metavar="NAME",
        help="the collection kept equal to the folder (default: one of its own, named after the folder)",
    )
    p.add_argument(
        "--replace",
        action="store_true",
        help="let the collection follow this folder although it follows another, or holds documents the folder "
        "lacks (they are deleted)",
    )
    p.add_argument("--watch", action="store_true", help="keep following the folder, syncing after each change")
    p.add_argument(
        "--debounce-ms",
        type=int,
        default=DEBOUNCE_MS,
        metavar="MS",
        help=f"with --watch: changes this close together are one sync (default {DEBOUNCE_MS})",
    )
    add_data_dir(p)
    add_client(p)
    p.set_defaults(func=cmd_sync)
