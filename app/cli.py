"""`blendrag` command line: serve, ingest, ask, cache, doctor, db, worker."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path
from typing import Any

from app.settings import Settings, SettingsError, load_settings
from engine.types import MODES, SELECTORS

EXIT_USAGE = 2


def _settings(args: argparse.Namespace, **extra: Any) -> Settings:
    return load_settings(data_dir=getattr(args, "data_dir", None), **extra)


def _add_data_dir(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data-dir", type=Path, default=None,
                   help="where the catalog, index, KV store and converted models live (default ./data)")


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from app.main import create_app

    settings = _settings(args)
    host = args.host or settings.server.host
    port = args.port or settings.server.port
    uvicorn.run(create_app(settings), host=host, port=port, log_level=settings.server.log_level)
    return 0


def cmd_ingest(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from app.components import build_components
    from app.services.ingest_service import IngestService, IngestSource
    from ingest.loaders import iter_paths

    settings = _settings(args)
    paths = [Path(p) for p in args.paths]
    for p in paths:
        if not p.exists():
            print(f"error: {p}: no such file or directory", file=sys.stderr)
            return EXIT_USAGE
    files = list(iter_paths(paths, settings.ingest.allowed_extensions))
    if not files:
        print("error: no ingestible files found under the given paths", file=sys.stderr)
        return EXIT_USAGE
    tags = [t for t in (args.tags or "").split(",") if t]
    components = build_components(settings, role="worker")  # PostgreSQL: only embeds; replicas index
    try:
        service = IngestService(components)
        sources = [IngestSource(kind="file", title=f.name, path=str(f.resolve()), source_path=str(f.resolve()),
                                tags=tags) for f in files]
        submitted = service.submit(sources, enqueue=False)
        bars: dict[str, tqdm] = {}

        def on_progress(job: Any) -> None:
            stage = job.stage
            if stage is None:
                return
            p = job.progress.get(stage, {})
            bar = bars.get(stage)
            if bar is None:
                for other in bars.values():
                    other.close()
                bar = bars[stage] = tqdm(total=p.get("total", 0), desc=f"{stage:>6}", unit="item",
                                         file=sys.stderr, leave=True)
            bar.total = p.get("total", 0)
            bar.n = p.get("done", 0)
            bar.refresh()

        job = service.run_job(submitted.job_id, on_progress=on_progress)
        for bar in bars.values():
            bar.close()
    finally:
        components.close()
    num_ok = len(job.document_ids) - len({e.get("source") for e in job.errors})
    print(f"job {job.id}: {job.status.value}; {max(num_ok, 0)} of {len(files)} file(s) ingested")
    for err in job.errors:
        print(f"  {err.get('source')}: {err.get('error')}", file=sys.stderr)
    return 0 if job.status.value == "succeeded" else 1


def cmd_ask(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from app.api.schemas import AskIn
    from app.components import build_components, build_scheduler
    from app.services.ask_service import AskService, DoneEvent, ErrorEvent, SourcesEvent, TokenDelta

    settings = _settings(args)
    try:  # the same validation (and limits) as POST /ask, before any model is loaded
        body = AskIn(question=args.question, top_k=args.top_k, mode=args.mode, recompute_ratio=args.ratio,
                     selector=args.selector, max_tokens=args.max_tokens)
    except ValidationError as exc:
        flags = {"recompute_ratio": "--ratio", "top_k": "--top-k", "max_tokens": "--max-tokens", "mode": "--mode"}
        for err in exc.errors():
            name = str(err["loc"][0]) if err["loc"] else "question"
            print(f"error: {flags.get(name, name)}: {err['msg']}", file=sys.stderr)
        return EXIT_USAGE
    request = body.to_request(body.question)
    components = build_components(settings)

    async def run() -> int:
        scheduler = build_scheduler(components)
        scheduler.start()
        service = AskService(components, scheduler)
        sources: list[Any] = []
        code = 0
        try:
            async for event in service.ask(request):
                match event:
                    case SourcesEvent():
                        sources = event.sources
                    case TokenDelta():
                        sys.stdout.write(event.text)
                        sys.stdout.flush()
                    case DoneEvent():
                        t = event.timings
                        print("\n")
                        print("Sources:")
                        for s in sources:
                            page = f", p. {s.page}" if s.page else ""
                            print(f"  [{s.rank}] {s.title}{page} (score {s.score:.3f})")
                        how = f"{event.mode} ({event.selector})" if event.selector else event.mode
                        print(f"\nmode {how}, recompute ratio {event.recompute_ratio:.2f}; "
                              f"retrieval {t.retrieval_ms:.0f} ms, KV load {t.kv_load_ms:.0f} ms, "
                              f"TTFT {t.ttft_ms:.0f} ms, total {t.total_ms:.0f} ms; "
                              f"KV hits {event.kv_hits}, misses {event.kv_misses}")
                    case ErrorEvent():
                        print(f"\nerror: {event.message}", file=sys.stderr)
                        code = 1
        finally:
            await asyncio.to_thread(scheduler.stop)
        return code

    try:
        return asyncio.run(run())
    finally:
        components.close()


def cmd_cache(args: argparse.Namespace) -> int:
    from kvcache import admin
    from kvcache.store import TieredKVStore

    settings = _settings(args)
    store = TieredKVStore(settings.kvcache)
    try:
        match args.cache_command:
            case "stats":
                st = admin.stats(store)
                print(f"{'tier':<8}{'entries':>10}{'bytes':>16}{'hits':>10}{'misses':>10}{'evictions':>11}"
                      f"{'faults':>8}")
                for t in st.tiers:
                    print(f"{t.name:<8}{t.num_entries:>10}{t.num_bytes:>16}{t.num_hits:>10}{t.num_misses:>10}"
                          f"{t.num_evictions:>11}{t.num_faults:>8}")
                return 0
            case "verify":
                report = admin.verify(store)
                print(f"checked {report.num_checked} entries: {report.num_ok} ok, "
                      f"{len(report.problems)} bad (removed)")
                for problem in report.problems:
                    print(f"  {problem.tier} {problem.key[:16]}: {problem.reason}")
                return 0
            case "prune":
                pr = admin.prune(store, args.max_bytes)
                print(f"pruned {pr.num_removed} entries ({pr.bytes_removed} bytes); "
                      f"disk tier now {pr.bytes_after} bytes")
                return 0
    finally:
        store.close()
    return EXIT_USAGE


def cmd_doctor(args: argparse.Namespace) -> int:
    from app.components import build_components
    from app.services.doctor import run_doctor

    components = build_components(_settings(args))
    try:
        report = run_doctor(components, repair=args.repair)
    finally:
        components.close()
    verb = "repaired" if args.repair else "found"
    print(f"{report.num_documents} documents, {report.num_chunks} committed chunks")
    print(f"  stranded pending documents: {len(report.stranded_document_ids)} {verb}")
    print(f"  index entries without a committed chunk: {len(report.orphan_index_ids)} {verb}")
    print(f"  committed chunks missing from the index: {len(report.unindexed_chunk_ids)} {verb}")
    print(f"  committed chunks without fresh KV: {len(report.kv_missing_chunk_ids)} {verb}")
    print(f"  KV entries no chunk uses (kept): {report.num_unreferenced_kv_entries}")
    if report.problems and not args.repair:
        print("run `blendrag doctor --repair` to fix these", file=sys.stderr)
        return 1
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
    _add_data_dir(p)
    p.set_defaults(func=cmd_ingest)

    p = sub.add_parser("ask", help="ask a question; prints the answer as it streams")
    p.add_argument("question")
    p.add_argument("--mode", choices=MODES, default=None)
    p.add_argument("--ratio", type=float, default=None, help="recompute ratio in [0, 1]")
    p.add_argument("--selector", choices=SELECTORS, default=None,
                   help="which context tokens blend recomputes (default: settings)")
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--max-tokens", type=int, default=None)
    _add_data_dir(p)
    p.set_defaults(func=cmd_ask)

    p = sub.add_parser("cache", help="inspect and maintain the KV store")
    csub = p.add_subparsers(dest="cache_command", required=True)
    for name, help_text in (("stats", "entries, bytes, hits and faults per tier"),
                            ("verify", "check every entry; remove bad ones")):
        cp = csub.add_parser(name, help=help_text)
        _add_data_dir(cp)
    cp = csub.add_parser("prune", help="evict least-recently-used disk entries down to a size")
    cp.add_argument("--max-bytes", type=int, required=True)
    _add_data_dir(cp)
    p.set_defaults(func=cmd_cache)

    p = sub.add_parser("doctor", help="check that catalog, index and KV store agree (server stopped)")
    p.add_argument("--repair", action="store_true", help="fix what is found")
    _add_data_dir(p)
    p.set_defaults(func=cmd_doctor)

    from app.cli_scaleout import add_parsers

    add_parsers(sub, _add_data_dir)  # db upgrade|current, worker
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args))
    except SettingsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
