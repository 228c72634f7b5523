"""`blendrag doctor` and `blendrag purge-failed`: the library's consistency and its failed leftovers."""

from __future__ import annotations

import argparse
import sys

from app.cli.common import add_client, add_data_dir, human_bytes, settings_of, take_data_dir


def cmd_doctor(args: argparse.Namespace) -> int:
    settings = settings_of(args)
    then = "blendrag doctor" + (" --repair" if args.repair else "")
    # Doctor compares the catalog with the index as saved on disk; a running server holds newer state
    # in memory and saves over any repair, so it only runs on a data dir nobody else owns.
    _, lock = take_data_dir(settings, "doctor", then, remote=False)
    assert lock is not None
    with lock:
        from app.build import build_services
        from app.services.doctor import run_doctor

        services = build_services(settings, {"doctor"})
        try:
            report = run_doctor(services.doctor_parts(), repair=args.repair)
        finally:
            services.close()
    verb = "repaired" if args.repair else "found"
    print(f"{report.num_documents} documents, {report.num_chunks} committed chunks")
    if report.index_repair_note:
        print(f"  index: {report.index_repair_note}")
    print(f"  stranded pending documents: {len(report.stranded_document_ids)} {verb}")
    print(f"  index entries without a committed chunk: {len(report.orphan_index_ids)} {verb}")
    print(f"  committed chunks missing from the index: {len(report.unindexed_chunk_ids)} {verb}")
    print(f"  committed chunks without fresh KV: {len(report.kv_missing_chunk_ids)} {verb}")
    print(f"  corrupt KV entries among {report.num_kv_checked} read whole: {len(report.kv_corrupt_keys)} {verb}")
    if report.kv_unwritten_chunk_ids:
        print(f"  of those, KV the store could not keep: {len(report.kv_unwritten_chunk_ids)} (disk full?)")
    leftover = "removed" if args.repair else "found (--repair removes them)"
    print(f"  KV entries no chunk or stored conversation uses: {report.num_unreferenced_kv_entries} {leftover}")
    print(
        f"  uploads no job needs: {len(report.unreferenced_upload_paths)} "
        f"({human_bytes(report.num_unreferenced_upload_bytes)}) {leftover}"
    )
    if report.problems and not args.repair:
        print("run `blendrag doctor --repair` to fix these", file=sys.stderr)
        return 1
    return 0


def cmd_purge_failed(args: argparse.Namespace) -> int:
    settings = settings_of(args)
    remote, lock = take_data_dir(settings, "purge-failed", "blendrag purge-failed", remote=True, args=args)
    if remote is not None:
        with remote:
            num_deleted = remote.purge_failed()
    else:
        assert lock is not None
        with lock:
            from app.build import build_services

            services = build_services(settings, {"documents"})  # the catalog, index and KV store: no model
            try:
                assert services.documents is not None
                num_deleted = services.documents.purge_failed()
            finally:
                services.close()
    print(f"deleted {num_deleted} failed document(s)")
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:

    p = sub.add_parser("purge-failed", help="delete every failed document (what failed ingests left behind)")
    add_data_dir(p)
    add_client(p)
    p.set_defaults(func=cmd_purge_failed)

    p = sub.add_parser("doctor", help="check that catalog, index and KV store agree (with the server stopped)")
    p.add_argument("--repair", action="store_true", help="fix what is found")
    add_data_dir(p)
    p.set_defaults(func=cmd_doctor)
