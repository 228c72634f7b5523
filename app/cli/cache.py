"""`blendrag cache stats|verify|prune|convert`: the KV store, with the server stopped (stats also through it)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

from app.cli.common import EXIT_USAGE, add_client, add_data_dir, human_bytes, settings_of, take_data_dir
from kvcache.config import STORAGE_DTYPES


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

    settings = settings_of(args)
    command = f"blendrag cache {args.cache_command}"
    remote, lock = take_data_dir(
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


def add_parsers(sub: argparse._SubParsersAction) -> None:

    p = sub.add_parser("cache", help="inspect and maintain the KV store")
    csub = p.add_subparsers(dest="cache_command", required=True)
    for name, help_text in (
        ("stats", "entries, bytes, hits and faults per tier"),
        ("verify", "check every entry; remove bad ones"),
    ):
        cp = csub.add_parser(name, help=help_text)
        add_data_dir(cp)
        if name == "stats":
            add_client(cp)
    cp = csub.add_parser("prune", help="evict disk entries (the eviction policy's victims first) down to a size")
    cp.add_argument("--max-bytes", type=int, required=True)
    add_data_dir(cp)
    cp = csub.add_parser(
        "convert",
        help="rewrite stored entries in another storage dtype, in place (atomic per entry; rerun to resume)",
    )
    cp.add_argument("--to", required=True, choices=list(STORAGE_DTYPES), help="target storage dtype")
    add_data_dir(cp)
    p.set_defaults(func=cmd_cache)
