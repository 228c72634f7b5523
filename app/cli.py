"""`blendrag` command line: serve, ingest, ask, cache, doctor, db, worker, keys, models."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.datadir_lock import DataDirBusy, DataDirLock, LockOwner, lock_owner, server_url
from app.settings import Settings, SettingsError, load_settings
from engine.types import MODES, SELECTORS
from kvcache.config import STORAGE_DTYPES

if TYPE_CHECKING:
    from app.remote import RemoteServer

logger = logging.getLogger(__name__)

EXIT_USAGE = 2
EXIT_BUSY = 3  # another process owns the data dir and the work cannot be sent to it
NO_SERVER = (
    "no blendrag server found: start one with `make serve` (or `blendrag serve`), or name a running one with "
    "--server URL (or BLENDRAG_URL)"
)


class Refused(RuntimeError):
    """The command cannot run now; the message says what to do instead."""


def _settings(args: argparse.Namespace, **extra: Any) -> Settings:
    return load_settings(data_dir=getattr(args, "data_dir", None), **extra)


def _add_data_dir(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="where the catalog, index, KV store and converted models live (default ./data)",
    )


def _add_client(p: argparse.ArgumentParser) -> None:
    """How the command reaches a server that is not this data dir's owner, and the key it sends."""
    p.add_argument(
        "--server",
        default=os.environ.get("BLENDRAG_URL"),
        metavar="URL",
        help="send the work to the blendrag server at URL (default: $BLENDRAG_URL, the data dir's server, "
        "else a running one)",
    )
    p.add_argument(
        "--api-key",
        default=os.environ.get("BLENDRAG_API_KEY"),
        metavar="KEY",
        help="the key sent to the server (a collection key or the admin key; default: $BLENDRAG_API_KEY, "
        "else server.api_key)",
    )


def _client_key(args: argparse.Namespace, settings: Settings) -> str | None:
    """The client's own key (`--api-key` / BLENDRAG_API_KEY), else the server's own `server.api_key`."""
    return getattr(args, "api_key", None) or settings.server.api_key


def _busy_message(settings: Settings, owner: LockOwner | None, then: str) -> str:
    who = owner.describe() if owner is not None else "another blendrag process"
    if owner is not None and owner.url is not None:
        what = f"stop the server first (or use another --data-dir), then run `{then}` again"
    else:
        what = f"wait for it to finish, then run `{then}` again"
    return f"data dir {settings.data_dir} is in use by {who}: {what}"


def _take_data_dir(
    settings: Settings,
    command: str,
    then: str,
    *,
    remote: bool,
    args: argparse.Namespace | None = None,
    server_only: bool = False,
) -> tuple[RemoteServer | None, DataDirLock | None]:
    """Own the data dir for this command, or (remote=True) reach a server: the one `--server` names, the
    one that owns the data dir, or (the data dir holding no catalog) one that announced itself or answers
    on the configured port. `server_only`: never take (and so create) a data dir without a catalog.

    Returns (server client, None) when the work goes to the running server over HTTP, else (None, lock).
    Raises Refused naming the owner and what to do when neither is possible.
    """
    key = _client_key(args, settings) if args is not None else settings.server.api_key
    named = getattr(args, "server", None) if remote else None
    if named:
        from app.remote import RemoteServer, probe

        url = probe(named)
        if url is None:
            raise Refused(f"no blendrag server answers at {named} (check --server / BLENDRAG_URL)")
        return RemoteServer(url, key), None
    owner = lock_owner(settings.data_dir)
    if owner is None and remote and not _has_catalog(settings):
        # `blendrag ask` in another folder would create ./data and answer from nothing, while the user's
        # server runs elsewhere: a data dir without a catalog sends the work to a running server.
        from app.remote import RemoteServer, discover
        from app.server_registry import default_runtime_dir

        found = discover(settings.runtime_dir or default_runtime_dir(), settings.server.host, settings.server.port)
        if found is not None:
            url, which = found
            print(f"{settings.data_dir} holds no catalog; sending the work to {which}", file=sys.stderr)
            return RemoteServer(url, key), None
        if server_only:
            raise Refused(f"{NO_SERVER}; {settings.data_dir} holds no catalog to answer from")
    if owner is None:
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
    raise Refused(_busy_message(settings, owner, then))


def _has_catalog(settings: Settings) -> bool:
    """Whether the data dir has been used: its SQLite catalog exists (a PostgreSQL catalog always does)."""
    url = settings.catalog.url or ""
    if not url.startswith("sqlite:///"):
        return True
    return Path(url.removeprefix("sqlite:///")).exists()


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from app.main import create_app

    settings = _settings(args)
    host = args.host or settings.server.host
    port = args.port or settings.server.port
    # The server records this address in the data-dir lock, for the CLI to find it.
    settings.server.host, settings.server.port = host, port
    owner = lock_owner(settings.data_dir)
    if owner is not None:
        raise Refused(_busy_message(settings, owner, "blendrag serve"))
    from app.ports import PortInUse, check_port_free

    try:  # before anything loads: a port in use fails now, not after the model
        check_port_free(host, port)
    except PortInUse as exc:
        raise Refused(str(exc)) from exc
    # Start-up steps (model, embedder, "ready at …") are logged at info by our own packages.
    level = getattr(logging, settings.server.log_level.upper())
    for package in ("app", "engine", "kvcache", "retrieval", "ingest"):
        logging.getLogger(package).setLevel(min(level, logging.getLogger(package).getEffectiveLevel()))
    logger.info("starting the server for %s on %s", settings.data_dir, server_url(host, port))
    from app.access_log import install_polling_filter

    install_polling_filter()
    # proxy_headers off: the app applies X-Forwarded-For itself, trusting server.forwarded_allow_ips only.
    uvicorn.run(create_app(settings), host=host, port=port, log_level=settings.server.log_level, proxy_headers=False)
    return 0


def _print_kv_added(progress: dict[str, Any]) -> None:
    """What the job added to the KV store: the cost of the cache, shown with the result."""
    kv = progress.get("kv") or {}
    num_bytes, num_tokens = kv.get("bytes") or 0, kv.get("tokens") or 0
    per_token = f", {human_bytes(round(num_bytes / num_tokens))} per token" if num_tokens else ""
    print(f"KV cache: +{human_bytes(num_bytes)} for {num_tokens} new chunk tokens{per_token}")


def _print_job(
    job_id: str, status: str, document_ids: list[str], errors: list[dict[str, Any]], num_files: int, seconds: float
) -> int:
    num_ok = len(document_ids) - len({e.get("source") for e in errors})
    print(f"job {job_id}: {status}; {max(num_ok, 0)} of {num_files} file(s) ingested in {_duration(seconds)}")
    for err in errors:
        print(f"  {err.get('source')}: {err.get('error')}", file=sys.stderr)
    return 0 if status == "succeeded" else 1


def cmd_ingest(args: argparse.Namespace) -> int:
    from app.cli_progress import IngestProgress
    from ingest.loaders import find_files

    settings = _settings(args)
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
    remote, lock = _take_data_dir(settings, "ingest", "blendrag ingest", remote=True, args=args)
    progress = IngestProgress()
    if remote is not None:
        with remote:
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


def _duration(seconds: float) -> str:
    """3.24 -> "3.2 s"; 125 -> "2 min 5 s"."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest} s"


def _print_skipped(skipped: list[str], extensions: Any) -> None:
    """One line for the files of the named folders that were left out for their type."""
    if not skipped:
        return
    shown = ", ".join(skipped[:8]) + (f", … ({len(skipped) - 8} more)" if len(skipped) > 8 else "")
    print(
        f"skipped {len(skipped)} file(s): unsupported type (ingestible: {', '.join(sorted(extensions))}): {shown}",
        file=sys.stderr,
    )


def _print_sources(sources: list[dict[str, Any]], notice: str | None = None) -> None:
    print("\n")
    if not sources:
        print(f"Sources: none ({notice or 'no documents match'}: the answer comes from the model alone)")
        return
    print("Sources:")
    for s in sources:
        page = f", p. {s['page']}" if s.get("page") else ""
        print(f"  [{s['rank']}] {s['title']}{page} (score {s['score']:.3f})")


def cut_off_note(done: dict[str, Any]) -> str | None:
    """The line that says an answer hit its length cap (finish_reason "length"), else None."""
    if done.get("finish_reason") != "length":
        return None
    tokens = (done.get("usage") or {}).get("completion_tokens")
    return f"answer cut off at {tokens} tokens (raise it with --max-tokens)"


def _print_done(done: dict[str, Any]) -> None:
    note = cut_off_note(done)
    if note is not None:
        print(f"\n[{note}]")
    t = done["timings"]
    how = f"{done['mode']} ({done['selector']})" if done.get("selector") else done["mode"]
    print(
        f"\nmode {how}, recompute ratio {done['recompute_ratio']:.2f}; "
        f"retrieval {t['retrieval_ms']:.0f} ms, KV load {t['kv_load_ms']:.0f} ms, "
        f"TTFT {t['ttft_ms']:.0f} ms, total {t['total_ms']:.0f} ms; "
        f"KV hits {done['kv_hits']}, misses {done['kv_misses']}"
    )
    usage = done.get("usage") or {}
    if usage.get("history_tokens"):
        print(
            f"history: {done.get('history_turns', 0)} earlier turn(s), {usage['history_tokens']} tokens, "
            f"{usage.get('history_reused_tokens', 0)} from stored KV"
            + (f"; {done['history_dropped_turns']} oldest left out" if done.get("history_dropped_turns") else "")
        )
    if done.get("conversation_id"):
        print(
            f"conversation {done['conversation_id']} "
            f"(continue it: blendrag ask --conversation {done['conversation_id']} …)"
        )


def _ask_remote(remote: RemoteServer, args: argparse.Namespace) -> int:
    body = {
        k: v
        for k, v in {
            "question": args.question,
            "top_k": args.top_k,
            "mode": args.mode,
            "recompute_ratio": args.ratio,
            "selector": args.selector,
            "max_tokens": args.max_tokens,
            "conversation_id": args.conversation,
            "collections": args.collections,
        }.items()
        if v is not None
    }
    from app.cli_answer import AnswerPrinter

    sources: list[dict[str, Any]] = []
    printer = AnswerPrinter()
    code = 0
    with remote:
        for event, data in remote.ask(body):
            match event:
                case "sources":
                    sources = data["sources"]
                case "token":
                    printer.token(data["text"])
                case "done":
                    printer.done(data.get("answer"), data.get("citations") or [])
                    _print_sources(sources, data.get("notice"))
                    _print_done(data)
                case "error":
                    printer.done(None, [])
                    print(f"\nerror: {data.get('message')}", file=sys.stderr)
                    code = 1
    return code


def cmd_ask(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from app.api.schemas import AskIn

    settings = _settings(args)
    try:  # the same validation (and limits) as POST /ask, before any model is loaded
        body = AskIn(
            question=args.question,
            top_k=args.top_k,
            mode=args.mode,
            recompute_ratio=args.ratio,
            selector=args.selector,
            max_tokens=args.max_tokens,
            conversation_id=args.conversation,
            collections=args.collections,
        )
    except ValidationError as exc:
        flags = {
            "recompute_ratio": "--ratio",
            "top_k": "--top-k",
            "max_tokens": "--max-tokens",
            "mode": "--mode",
            "conversation_id": "--conversation",
            "collections": "--collection",
        }
        for err in exc.errors():
            name = str(err["loc"][0]) if err["loc"] else "question"
            print(f"error: {flags.get(name, name)}: {err['msg']}", file=sys.stderr)
        return EXIT_USAGE
    # A question never creates a data dir: without a catalog here, it goes to a running server or nowhere.
    remote, lock = _take_data_dir(settings, "ask", "blendrag ask", remote=True, args=args, server_only=True)
    if remote is not None:
        return _ask_remote(remote, args)
    assert lock is not None
    with lock:
        request = body.to_request(body.question)
        if body.collections is not None:
            request = dataclasses.replace(
                request, filters=dataclasses.replace(request.filters, collections=frozenset(body.collections))
            )
        return _ask_local(settings, request, body.conversation_id)


def _ask_local(settings: Settings, request: Any, conversation_id: str | None) -> int:
    from app.build import build_services
    from app.cli_answer import AnswerPrinter
    from app.services.ask import ConversationRef, DoneEvent, ErrorEvent, SourcesEvent, TokenDelta
    from app.services.conversation_service import ConversationNotFound, owner_of

    if conversation_id is not None:
        # The owner is the one a request with this server's key would be, so the CLI and HTTP see the same
        # conversations; in-process, the CLI reads every collection (it owns the data dir), like the admin.
        ref = ConversationRef(conversation_id, owner=owner_of(settings.server.api_key), readable=None)
        request = dataclasses.replace(request, conversation=ref)
        # Before the model loads: an unknown conversation is a quick usage error.
        first = build_services(settings, {"conversations"})
        try:
            assert first.conversations is not None
            first.conversations.open(conversation_id, ref.owner, None, request.filters.collections)
        except ConversationNotFound as exc:
            print(f"error: --conversation: {exc}", file=sys.stderr)
            return EXIT_USAGE
        finally:
            first.close()
    services = build_services(settings, {"ask"})

    async def run() -> int:
        service, scheduler = services.ask, services.scheduler
        assert service is not None and scheduler is not None
        scheduler.start()
        sources: list[Any] = []
        printer = AnswerPrinter()
        code = 0
        try:
            async for event in service.ask(request):
                match event:
                    case SourcesEvent():
                        sources = event.sources
                    case TokenDelta():
                        printer.token(event.text)
                    case DoneEvent():
                        done = dataclasses.asdict(event)
                        printer.done(done.get("answer"), done.get("citations") or [])
                        _print_sources([dataclasses.asdict(s) for s in sources], event.notice)
                        _print_done(done)
                    case ErrorEvent():
                        printer.done(None, [])
                        print(f"\nerror: {event.message}", file=sys.stderr)
                        code = 1
        finally:
            await asyncio.to_thread(scheduler.stop)
        return code

    try:
        return asyncio.run(run())
    finally:
        services.close()


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


def _print_tiers(tiers: list[dict[str, Any]], where: str) -> None:
    """One row per KV tier: entries, size against budget, hit rate, evictions, faults."""
    print(f"KV cache tiers ({where})")
    print(
        f"{'tier':<8}{'entries':>9}{'size':>12}{'budget':>12}{'hits':>8}{'misses':>8}{'hit rate':>10}"
        f"{'evictions':>11}{'faults':>8}"
    )
    for t in tiers:
        lookups = t["num_hits"] + t["num_misses"]
        rate = f"{100 * t['num_hits'] / lookups:.1f}%" if lookups else "-"
        name = t["name"] if t.get("available", True) else f"{t['name']}!"
        print(
            f"{name:<8}{t['num_entries']:>9}{human_bytes(t['num_bytes']):>12}{human_bytes(t['budget_bytes']):>12}"
            f"{t['num_hits']:>8}{t['num_misses']:>8}{rate:>10}{t['num_evictions']:>11}{t['num_faults']:>8}"
        )
    if any(not t.get("available", True) for t in tiers):
        print("(!: tier unreachable)")


def cmd_cache(args: argparse.Namespace) -> int:
    from kvcache import admin

    settings = _settings(args)
    command = f"blendrag cache {args.cache_command}"
    remote, lock = _take_data_dir(
        settings, f"cache {args.cache_command}", command, remote=args.cache_command == "stats", args=args
    )
    if remote is not None:
        with remote:
            stats = remote.stats()
        _print_tiers(stats["kv_tiers"], f"server at {remote.url}")
        return 0
    assert lock is not None
    with lock:
        from app.build import build_services

        services = build_services(settings, {"kv_store"})
        store = services.store
        assert store is not None
        try:
            match args.cache_command:
                case "stats":
                    st = admin.stats(store)
                    _print_tiers([dataclasses.asdict(t) for t in st.tiers], f"{settings.data_dir}, no server running")
                    return 0
                case "verify":
                    report = admin.verify(store)
                    print(
                        f"checked {report.num_checked} entries: {report.num_ok} ok, "
                        f"{len(report.problems)} bad (removed)"
                    )
                    for problem in report.problems:
                        print(f"  {problem.tier} {problem.key[:16]}: {problem.reason}")
                    return 0
                case "prune":
                    pr = admin.prune(store, args.max_bytes)
                    print(
                        f"pruned {pr.num_removed} entries ({human_bytes(pr.bytes_removed)}); "
                        f"disk tier now {human_bytes(pr.bytes_after)}"
                    )
                    return 0
                case "convert":
                    cr = admin.convert(store, args.to)
                    print(
                        f"converted {cr.num_converted} entries to {cr.to} "
                        f"({human_bytes(cr.num_bytes_before)} -> {human_bytes(cr.num_bytes_after)}); "
                        f"{cr.num_already} already {cr.to}, {cr.num_removed} unreadable removed"
                    )
                    if args.to != settings.kvcache.storage_dtype:
                        print(
                            f"note: kvcache.storage_dtype is {settings.kvcache.storage_dtype}: new entries are "
                            f"still written in it; set it to {args.to} to keep the store in one format",
                            file=sys.stderr,
                        )
                    return 0
        finally:
            services.close()
    return EXIT_USAGE


def cmd_doctor(args: argparse.Namespace) -> int:
    settings = _settings(args)
    then = "blendrag doctor" + (" --repair" if args.repair else "")
    # Doctor compares the catalog with the index as saved on disk; a running server holds newer state
    # in memory and saves over any repair, so it only runs on a data dir nobody else owns.
    _, lock = _take_data_dir(settings, "doctor", then, remote=False)
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
    print(f"  KV entries no chunk uses: {report.num_unreferenced_kv_entries} {leftover}")
    print(
        f"  uploads no job needs: {len(report.unreferenced_upload_paths)} "
        f"({human_bytes(report.num_unreferenced_upload_bytes)}) {leftover}"
    )
    if report.problems and not args.repair:
        print("run `blendrag doctor --repair` to fix these", file=sys.stderr)
        return 1
    return 0


def cmd_purge_failed(args: argparse.Namespace) -> int:
    settings = _settings(args)
    remote, lock = _take_data_dir(settings, "purge-failed", "blendrag purge-failed", remote=True, args=args)
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="blendrag", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("serve", help="run the HTTP server")
    p.add_argument("--host", default=None)
    p.add_argument("--port", type=int, default=None)
    _add_data_dir(p)
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("ingest", help="ingest files and folders (txt, md, html, pdf, docx, json, jsonl)")
    p.add_argument("paths", nargs="+")
    p.add_argument("--tags", default=None, help="comma-separated tags for every ingested document")
    p.add_argument(
        "--collection",
        default=None,
        metavar="NAME",
        help="the collection they join (default: a key's own collection when it has exactly one, else default)",
    )
    _add_data_dir(p)
    _add_client(p)
    p.set_defaults(func=cmd_ingest)

    p = sub.add_parser("ask", help="ask a question; prints the answer as it streams")
    p.add_argument("question")
    p.add_argument("--mode", choices=MODES, default=None)
    p.add_argument("--ratio", type=float, default=None, help="recompute ratio in [0, 1]")
    p.add_argument(
        "--selector", choices=SELECTORS, default=None, help="which context tokens blend recomputes (default: settings)"
    )
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--max-tokens", type=int, default=None)
    p.add_argument(
        "--conversation",
        default=None,
        metavar="ID",
        help='store the turn: "new" starts a conversation, an ID continues one (an earlier answer names it); '
        "without it nothing is stored",
    )
    p.add_argument(
        "--collection",
        action="append",
        default=None,
        dest="collections",
        metavar="NAME",
        help="only search this collection (repeat for several; default: every collection)",
    )
    _add_data_dir(p)
    _add_client(p)
    p.set_defaults(func=cmd_ask)

    p = sub.add_parser("cache", help="inspect and maintain the KV store")
    csub = p.add_subparsers(dest="cache_command", required=True)
    for name, help_text in (
        ("stats", "entries, bytes, hits and faults per tier"),
        ("verify", "check every entry; remove bad ones"),
    ):
        cp = csub.add_parser(name, help=help_text)
        _add_data_dir(cp)
        if name == "stats":
            _add_client(cp)
    cp = csub.add_parser("prune", help="evict disk entries (the eviction policy's victims first) down to a size")
    cp.add_argument("--max-bytes", type=int, required=True)
    _add_data_dir(cp)
    cp = csub.add_parser(
        "convert",
        help="rewrite stored entries in another storage dtype, in place (atomic per entry; rerun to resume)",
    )
    cp.add_argument("--to", required=True, choices=list(STORAGE_DTYPES), help="target storage dtype")
    _add_data_dir(cp)
    p.set_defaults(func=cmd_cache)

    p = sub.add_parser("purge-failed", help="delete every failed document (what failed ingests left behind)")
    _add_data_dir(p)
    _add_client(p)
    p.set_defaults(func=cmd_purge_failed)

    p = sub.add_parser("doctor", help="check that catalog, index and KV store agree (with the server stopped)")
    p.add_argument("--repair", action="store_true", help="fix what is found")
    _add_data_dir(p)
    p.set_defaults(func=cmd_doctor)

    from app.cli_scaleout import add_parsers

    add_parsers(sub, _add_data_dir)  # db upgrade|current, worker
    from app.cli_keys import add_parsers as add_key_parsers

    add_key_parsers(sub, _add_data_dir)  # keys create|list|revoke
    from app.cli_models import add_parsers as add_model_parsers

    add_model_parsers(sub, _add_data_dir)  # models [list|install NAME]
    from app.cli_calibrate import add_parsers as add_calibrate_parsers

    add_calibrate_parsers(sub, _add_data_dir)  # calibrate
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


if __name__ == "__main__":
    sys.exit(main())
