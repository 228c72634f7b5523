"""`blendrag ingest`: files and folders into the library, in this process or through the server."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from app.cli.common import EXIT_USAGE, add_client, add_data_dir, duration, human_bytes, settings_of, take_data_dir


def _print_kv_added(progress: dict[str, Any]) -> None:
    """What the job added to the KV store: the cost of the cache, shown with the result."""
    kv = progress.get("kv") or {}
    num_bytes, num_tokens = kv.get("bytes") or 0, kv.get("tokens") or 0
    per_token = f", {human_bytes(round(num_bytes / num_tokens))} per token" if num_tokens else ""
    # Chunk tokens, not text tokens: each chunk repeats the overlap of the one before, so they are more than the
    # estimate's tokens of text; chunks the store held already are not computed, nor counted.
    print(
        f"KV cache: +{human_bytes(num_bytes)} for {num_tokens:,} chunk tokens new to the store (overlap "
        f"included){per_token}"
    )


def _print_job(
    job_id: str, status: str, document_ids: list[str], errors: list[dict[str, Any]], num_files: int, seconds: float
) -> int:
    num_ok = len(document_ids) - len({e.get("source") for e in errors})
    print(f"job {job_id}: {status}; {max(num_ok, 0)} of {num_files} file(s) ingested in {duration(seconds)}")
    for err in errors:
        print(f"  {err.get('source')}: {err.get('error')}", file=sys.stderr)
    return 0 if status == "succeeded" else 1


def _server_rate(remote: Any) -> float | None:
    """The prefill rate the server measured (None: none yet, or a server that does not say)."""
    try:
        rate = remote.stats().get("prefill_tokens_per_s")
    except Exception:  # the estimate is advice: the ingest goes on without it
        return None
    return float(rate) if rate else None


def _print_estimate(paths: list[Path], settings: Any, server_rate: float | None, *, remote: bool) -> None:
    """Before a folder's ingest starts: its token count and the time it takes at the measured rate."""
    from app.cli.ingest_estimate import estimate

    print(estimate(paths, settings, server_rate, remote).message(), flush=True)


def cmd_ingest(args: argparse.Namespace) -> int:
    from app.cli.progress import IngestProgress
    from ingest.loaders import find_files

    settings = settings_of(args)
    paths = [Path(p) for p in args.paths]
    for p in paths:
        if not p.exists():
            print(f"error: {p}: no such file or directory", file=sys.stderr)
            return EXIT_USAGE
    found = find_files(paths, settings.ingest.allowed_extensions)
    if not found.paths:
        print("error: no ingestible files found under the given paths", file=sys.stderr)
        _print_skipped(found.skipped, settings.ingest.allowed_extensions)
        return EXIT_USAGE
    tags = [t for t in (args.tags or "").split(",") if t]
    from app.services.key_service import KeyRequestError, check_collection

    try:
        collection = None if args.collection is None else check_collection(args.collection)
    except KeyRequestError as exc:
        print(f"error: --collection: {exc}", file=sys.stderr)
        return EXIT_USAGE
    started = time.monotonic()
    remote, lock = take_data_dir(settings, "ingest", "blendrag ingest", remote=True, args=args)
    progress = IngestProgress()
    if remote is not None:
        with remote:
            _print_estimate(found.paths, settings, _server_rate(remote), remote=True)
            accepted = remote.ingest_files(found.paths, tags, names=found.names, collection=collection)
            job = remote.wait_job(accepted["job_id"], progress.update)
        progress.finish(job)
        _print_kv_added(job.get("progress") or {})
        seconds = time.monotonic() - started
        code = _print_job(job["job_id"], job["status"], job["document_ids"], job["errors"], len(found.paths), seconds)
        _print_skipped(found.skipped, settings.ingest.allowed_extensions)
        return code
    assert lock is not None
    with lock:
        _print_estimate(found.paths, settings, None, remote=False)
        from app.build import build_services
        from app.catalog.models import DEFAULT_COLLECTION
        from app.services.ingest import IngestSource

        services = build_services(settings, {"ingest"}, role="worker")  # PostgreSQL: only embeds; replicas index
        try:
            service = services.ingest
            assert service is not None
            sources = [
                IngestSource(kind="file", title=Path(name).name, path=str(f.resolve()), source_path=name, tags=tags)
                for f, name in zip(found.paths, found.names, strict=True)
            ]
            submitted = service.submit(sources, enqueue=False, collection=collection or DEFAULT_COLLECTION)
            local_job = service.run_job(submitted.job_id, on_progress=progress.update)
            progress.finish(local_job)
        finally:
            services.close()
    _print_kv_added(local_job.progress)
    code = _print_job(
        local_job.id,
        local_job.status.value,
        local_job.document_ids,
        local_job.errors,
        len(found.paths),
        time.monotonic() - started,
    )
    _print_skipped(found.skipped, settings.ingest.allowed_extensions)
    return code


def _print_skipped(skipped: list[str], extensions: Any) -> None:
    """One line for the files of the named folders that were left out for their type."""
    if not skipped:
        return
    shown = ", ".join(skipped[:8]) + (f", … ({len(skipped) - 8} more)" if len(skipped) > 8 else "")
    print(
        f"skipped {len(skipped)} file(s): unsupported type (ingestible: {', '.join(sorted(extensions))}): {shown}",
        file=sys.stderr,
    )


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ingest", help="ingest files and folders (txt, md, html, pdf, docx, json, jsonl)")
    p.add_argument("paths", nargs="+")
    p.add_argument("--tags", default=None, help="comma-separated tags for every ingested document")
    p.add_argument(
        "--collection",
        default=None,
        metavar="NAME",
        help="the collection they join (default: a key's own collection when it has exactly one, else default)",
    )
    add_data_dir(p)
    add_client(p)
    p.set_defaults(func=cmd_ingest)
