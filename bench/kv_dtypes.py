"""`python -m bench kv`: what each KV storage dtype costs and keeps, whether disk keeps up with memory,
and what the disk tier's eviction policy keeps.

1. Per storage dtype (fp16, bf16, int8, int4): bytes per token (in memory and as an entry file, scales
   included), the share of fp16's, what lossless compression of the entry file would save (zlib level 6
   and lzma preset 6 for int8 / int4, stdlib stand-ins for zstd; on the first example's entries), and,
   against the engine's own fp32 KV, the first-token KL, first-token agreement and greedy-answer
   agreement at reuse and at blend@--ratio.
2. TTFT at blend@--ratio (open the entries, prompt pass, first token) with the entries only in the memory
   tier (in --ttft-memory-dtype), and only on disk (in --ttft-dtype; a disk-only TieredKVStore in a temp
   dir, memory tier off): `disk` with the OS page cache as it is (the entries were just written, so it
   usually holds them), `disk_cold` with the entry files evicted from the page cache before each
   measurement (fsync + POSIX_FADV_DONTNEED, only these files), each also without the layer-wise
   prefetch, and `disk_one_miss`: the first chunk's entry was evicted, so the question recomputes it,
   stores it again and then answers (the question-time cost of a miss; `miss_cost_s`). Variants are
   interleaved within each example and their order rotates between repeats, so machine-load drift hits
   all of them alike. `--skip-ttft` leaves the timings out (they need a quiet machine).
3. Disk-tier hit rate per eviction policy under a Zipf question stream over a corpus four times the
   budget (`bench.kv_hitrate`; not a timing). `--skip-zipf` leaves it out.
"""

from __future__ import annotations

import argparse
import logging
import lzma
import os
import tempfile
import time
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from bench import harness
from bench.kv_hitrate import add_zipf_args, zipf_setup
from bench.kv_hitrate import evaluate as evaluate_hit_rates
from bench.metrics import kl_divergence, mean, percentile
from bench.passes import blend_name, mode_specs, run_pass
from bench.prepared import STORAGE_DTYPES, PreparedPrompt, bench_prompts, put_chunks

if TYPE_CHECKING:
    from engine.engine import Engine
    from engine.types import BlendConfig, PromptLayout
    from kvcache.store import TieredKVStore

logger = logging.getLogger(__name__)

NAME = "kv"
HELP = "KV storage dtypes (bytes, KL vs fp32) and disk vs memory TTFT"
COMPRESSION_EXAMPLES = 1  # examples whose entry files are compressed to measure the saving (lzma is slow)
TTFT_VARIANTS = ("memory", "disk", "disk_no_prefetch", "disk_cold", "disk_cold_no_prefetch", "disk_one_miss")
# name -> (store, prefetch, evict the entry files from the page cache first, drop the first chunk's entry)
_VARIANTS = {
    "memory": ("memory", True, False, False),
    "disk": ("disk", True, False, False),
    "disk_no_prefetch": ("disk", False, False, False),
    "disk_cold": ("disk", True, True, False),
    "disk_cold_no_prefetch": ("disk", False, True, False),
    "disk_one_miss": ("disk", True, False, True),
}


def add_args(parser: argparse.ArgumentParser) -> None:
    harness.add_order_arg(parser)
    parser.add_argument("--ratio", type=float, default=0.15, help="blend recompute ratio")
    parser.add_argument("--dtypes", default=",".join(STORAGE_DTYPES), help="storage dtypes, comma-separated")
    parser.add_argument("--max-tokens", type=int, default=32, help="greedy answer length cap (agreement)")
    parser.add_argument(
        "--ttft-dtype", default="int4", choices=list(STORAGE_DTYPES), help="storage dtype of the disk TTFT runs"
    )
    parser.add_argument(
        "--ttft-memory-dtype",
        default="fp16",
        choices=list(STORAGE_DTYPES),
        help="storage dtype of the memory-tier TTFT baseline",
    )
    parser.add_argument("--repeats", type=int, default=3, help="TTFT measurements per variant and example")
    parser.add_argument("--skip-ttft", action="store_true", help="no timings (quality, bytes and hit rates only)")
    parser.add_argument("--tmp-dir", type=Path, default=None, help="where the disk tier goes (default: $TMPDIR)")
    parser.add_argument("--skip-zipf", action="store_true", help="leave out the eviction hit-rate comparison")
    add_zipf_args(parser)


def _ttft_once(
    engine: Engine,
    layout: PromptLayout,
    store: TieredKVStore,
    keys: list[str],
    blend: BlendConfig,
    prefetch: bool,
    chunk_ids: list[list[int]] | None = None,
) -> tuple[float, float]:
    """(seconds from opening the entries to the first token, seconds the layer loop waited on KV).

    With `chunk_ids`, missing entries are recomputed and stored again first, as a question does."""
    from kvcache.errors import KVEntryMissing
    from kvcache.space import KVSpace

    t0 = time.perf_counter()
    try:
        source = store.open_layers(keys, device=engine.device, dtype=engine.dtype, prefetch=prefetch)
    except KVEntryMissing as exc:
        if chunk_ids is None:
            raise
        # Through the one KV writer, as a question's recompute does.
        KVSpace.of_engine(store, engine).ensure(chunk_ids, compute=engine.precompute_chunks, missing_keys=exc.keys)
        source = store.open_layers(keys, device=engine.device, dtype=engine.dtype, prefetch=prefetch)
    try:
        result = engine.prompt_pass(layout, source, "blend", blend)
    finally:
        source.close()
    int(torch.argmax(result.logits))  # the first token: what a client sees first
    return time.perf_counter() - t0, result.timings.kv_wait_s


def evict_from_page_cache(paths: list[Path]) -> bool:
    """Ask the OS to drop these files' cached pages (after writing back dirty ones). False if unsupported."""
    if not hasattr(os, "posix_fadvise"):
        return False
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)  # dirty pages cannot be dropped
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return True


def _ttft_stores(tmp: Path, storage_dtype: str, memory_dtype: str, budget: int) -> dict[str, TieredKVStore]:
    from kvcache.config import KVCacheSettings
    from kvcache.store import TieredKVStore

    disk = TieredKVStore(
        KVCacheSettings(
            dir=tmp / "kv",
            storage_dtype=storage_dtype,
            memory_bytes=0,  # type: ignore[arg-type]
            disk_bytes=4 * budget + (64 << 20),
            fsync=False,
        )
    )
    memory = TieredKVStore(
        KVCacheSettings(
            dir=None,
            storage_dtype=memory_dtype,  # type: ignore[arg-type]
            memory_bytes=2 * budget + (64 << 20),
        )
    )
    return {"disk": disk, "memory": memory}


def evaluate(
    engine: Engine,
    prompts: list,
    dtypes: list[str],
    ratio: float,
    max_tokens: int,
    ttft_dtype: str,
    memory_dtype: str,
    repeats: int,
    tmp_root: Path | None,
) -> dict[str, Any]:
    specs = mode_specs(engine, [ratio], baselines=("reuse",))
    blend_spec = specs[-1]
    assert blend_spec.blend is not None
    per_example: list[dict[str, Any]] = []
    for n, bp in enumerate(prompts, 1):
        t0 = time.perf_counter()
        kvs = PreparedPrompt.compute(engine, bp)
        record: dict[str, Any] = {
            "index": bp.example.index,
            "num_context_tokens": kvs.num_tokens,
            "chunk_tokens": [kv.num_tokens for kv in kvs.kvs],
            "dtypes": {},
            "ttft": {v: [] for v in TTFT_VARIANTS},
            "kv_wait": {v: [] for v in TTFT_VARIANTS},
        }
        refs = {s.name: run_pass(engine, bp.layout, kvs.source("fp32"), s, [], max_tokens) for s in specs}
        for dtype in dtypes:
            entry_files = kvs.serialized_entries(dtype)
            row: dict[str, Any] = {
                "bytes": kvs.stored_bytes(dtype),
                "file_bytes": sum(len(f) for f in entry_files),
                "modes": {},
            }
            if n <= COMPRESSION_EXAMPLES:  # a sample: lzma takes seconds per entry
                row["zlib_bytes"] = sum(len(zlib.compress(f, 6)) for f in entry_files)
                # lzma only where compression is in question (the quantized formats): seconds per fp16 entry
                if dtype in ("int8", "int4"):
                    row["lzma_bytes"] = sum(len(lzma.compress(f, preset=6)) for f in entry_files)
                row["compressed_sample_bytes"] = row["file_bytes"]
            for spec in specs:
                out = run_pass(engine, bp.layout, kvs.source(dtype), spec, [], max_tokens)
                ref = refs[spec.name]
                row["modes"][spec.name] = {
                    "kl": kl_divergence(ref.first_logits, out.first_logits),
                    "same_first_token": out.first_token == ref.first_token,
                    "same_answer": out.answer_ids == ref.answer_ids,
                    # share of the fp32 run's recomputed tokens this dtype's run also picks (1 when none)
                    "selection_overlap": (
                        len(set(out.selected_positions) & set(ref.selected_positions)) / len(ref.selected_positions)
                        if ref.selected_positions
                        else 1.0
                    ),
                }
            record["dtypes"][dtype] = row
        if repeats <= 0:
            per_example.append(record)
            logger.info("kv %d/%d (example %d) in %.1fs", n, len(prompts), bp.example.index, time.perf_counter() - t0)
            continue
        record["ttft_dtype_bytes"] = kvs.stored_bytes(ttft_dtype)
        with tempfile.TemporaryDirectory(prefix="blendrag-bench-kv-", dir=tmp_root) as tmp:
            budget = max(record["ttft_dtype_bytes"], kvs.stored_bytes(memory_dtype))
            stores = _ttft_stores(Path(tmp), ttft_dtype, memory_dtype, budget)
            keys = {name: put_chunks(store, engine, bp.chunk_ids, kvs.kvs) for name, store in stores.items()}
            assert all(store.contains(k) == name for name, store in stores.items() for k in keys[name])
            disk_tier = stores["disk"].disk
            assert disk_tier is not None
            files = [disk_tier.path_for(k) for k in keys["disk"]]
            variants = list(_VARIANTS.items())
            _ttft_once(engine, bp.layout, stores["memory"], keys["memory"], blend_spec.blend, True)  # warm-up
            for rep in range(repeats):
                shift = rep % len(variants)
                for name, (store_name, prefetch, cold, miss) in variants[shift:] + variants[:shift]:
                    if cold and not evict_from_page_cache(files):
                        continue
                    if miss:
                        stores[store_name].delete(keys[store_name][0])
                    ttft, wait = _ttft_once(
                        engine,
                        bp.layout,
                        stores[store_name],
                        keys[store_name],
                        blend_spec.blend,
                        prefetch,
                        chunk_ids=bp.chunk_ids if miss else None,
                    )
                    record["ttft"][name].append(ttft)
                    record["kv_wait"][name].append(wait)
            for store in stores.values():
                store.close()
        per_example.append(record)
        logger.info(
            "kv %d/%d (example %d) in %.1fs: ttft median memory %.3fs disk %.3fs",
            n,
            len(prompts),
            bp.example.index,
            time.perf_counter() - t0,
            percentile(record["ttft"]["memory"], 50),
            percentile(record["ttft"]["disk"], 50),
        )
    return summarize(per_example, dtypes, [s.name for s in specs], engine) | {"per_example": per_example}


def summarize(
    per_example: list[dict[str, Any]], dtypes: list[str], mode_names: list[str], engine: Engine
) -> dict[str, Any]:
    num_tokens = sum(r["num_context_tokens"] for r in per_example)
    out_dtypes: dict[str, Any] = {}
    for dtype in dtypes:
        rows = [r["dtypes"][dtype] for r in per_example]
        modes = {}
        for name in mode_names:
            cells = [row["modes"][name] for row in rows]
            modes[name] = {
                "kl": mean(c["kl"] for c in cells),
                "kl_max": max(c["kl"] for c in cells),
                "first_token_agreement": mean(float(c["same_first_token"]) for c in cells),
                "answer_agreement": mean(float(c["same_answer"]) for c in cells),
                "selection_overlap": mean(c["selection_overlap"] for c in cells),
            }
        file_bytes = sum(row["file_bytes"] for row in rows)
        sampled = [row for row in rows if "zlib_bytes" in row]
        out_dtypes[dtype] = {
            "bytes_per_token": sum(row["bytes"] for row in rows) / num_tokens,
            "file_bytes_per_token": file_bytes / num_tokens,
            # fp16 K and V of every layer for one token
            "share_of_fp16": sum(row["bytes"] for row in rows) / num_tokens / (2 * kv_elements_per_token(engine)),
            # what lossless compression of the entry files would save on top (stand-ins for zstd), on the
            # first COMPRESSION_EXAMPLES examples' entries
            "zlib_saving": 1.0
            - sum(r["zlib_bytes"] for r in sampled) / sum(r["compressed_sample_bytes"] for r in sampled),
            "lzma_saving": (
                1.0 - sum(r["lzma_bytes"] for r in sampled) / sum(r["compressed_sample_bytes"] for r in sampled)
                if sampled and all("lzma_bytes" in r for r in sampled)
                else None
            ),
            "modes": modes,
        }
    out: dict[str, Any] = {"dtypes": out_dtypes, "kv_elements_per_token": kv_elements_per_token(engine)}
    if not per_example or not per_example[0]["ttft"]["memory"]:
        return out  # no timings (--skip-ttft)
    ttft: dict[str, Any] = {}
    for variant in TTFT_VARIANTS:
        # per example the median over repeats, then statistics over examples
        medians = [percentile(r["ttft"][variant], 50) for r in per_example]
        ttft[variant] = {
            "p50_s": percentile(medians, 50),
            "mean_s": mean(medians),
            "p90_s": percentile(medians, 90),
            "kv_wait_s": mean(percentile(r["kv_wait"][variant], 50) for r in per_example),
        }
    for variant in TTFT_VARIANTS[1:]:
        # median over examples of (variant / memory) − 1, each side the median over repeats
        ratios = [percentile(r["ttft"][variant], 50) / percentile(r["ttft"]["memory"], 50) for r in per_example]
        ttft[f"{variant}_overhead"] = percentile(ratios, 50) - 1.0
    # what a question pays for one evicted chunk: recompute it, store it again (median over examples)
    ttft["miss_cost_s"] = percentile(
        [percentile(r["ttft"]["disk_one_miss"], 50) - percentile(r["ttft"]["disk"], 50) for r in per_example], 50
    )
    return out | {"ttft": ttft}


def kv_elements_per_token(engine: Engine) -> int:
    """K and V of every layer for one token, before any storage overhead."""
    cfg = engine.config
    return 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim


def plot(result: dict[str, Any], path: Path) -> None:
    dtypes = list(result["dtypes"])
    names = list(result["dtypes"][dtypes[0]]["modes"])
    fig, (ax_bytes, ax_kl, ax_ttft) = harness.new_figure(3)
    ttft = result.get("ttft")
    ax_bytes.bar(dtypes, [result["dtypes"][d]["bytes_per_token"] / 1024 for d in dtypes], color="tab:purple")
    ax_bytes.set_title("KV KiB per token")
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        xs = [j + i * width for j in range(len(dtypes))]
        ax_kl.bar(xs, [max(result["dtypes"][d]["modes"][name]["kl"], 1e-12) for d in dtypes], width, label=name)
    ax_kl.set_xticks([j + width * (len(names) - 1) / 2 for j in range(len(dtypes))], dtypes)
    ax_kl.set_yscale("log")
    ax_kl.legend(fontsize=8)
    ax_kl.set_title("first-token KL vs fp32 KV")
    if ttft is not None:
        ax_ttft.bar(list(TTFT_VARIANTS), [ttft[v]["p50_s"] for v in TTFT_VARIANTS], color="tab:orange")
        ax_ttft.set_title(
            f"TTFT p50 at blend@{result['ratio']} (disk {result['ttft_dtype']}, memory {result['ttft_memory_dtype']})"
        )
        ax_ttft.set_ylabel("s")
        ax_ttft.tick_params(axis="x", rotation=30)
    elif result.get("hit_rates"):
        policies = result["hit_rates"]["policies"]
        ax_ttft.bar(list(policies), [100 * p["hit_rate"] for p in policies.values()], color="tab:green")
        ax_ttft.set_title(f"disk hit rate, Zipf({result['hit_rates']['setup']['zipf_s']}), corpus 4x budget")
        ax_ttft.set_ylabel("%")
    harness.finish_figure(fig, path, result)


def main(args: argparse.Namespace) -> int:
    run = harness.RunRecord.start(args)
    dtypes = [d for d in args.dtypes.split(",") if d]
    if unknown := [d for d in dtypes if d not in STORAGE_DTYPES]:
        raise SystemExit(f"unknown storage dtype(s) {unknown}; choose from {list(STORAGE_DTYPES)}")
    engine = harness.build_engine(args)
    prompts = bench_prompts(engine, args.dataset, args.examples, args.passages, args.seed, order=args.order)
    repeats = 0 if args.skip_ttft else args.repeats
    evaluated = evaluate(
        engine,
        prompts,
        dtypes,
        args.ratio,
        args.max_tokens,
        args.ttft_dtype,
        args.ttft_memory_dtype,
        repeats,
        args.tmp_dir,
    )
    if not args.skip_zipf:
        setup = zipf_setup(args)
        evaluated["hit_rates"] = evaluate_hit_rates(setup, ["frequency", "lru"], args.ttft_dtype, args.tmp_dir)
    result = harness.result_header(
        NAME,
        args,
        engine,
        examples=len(prompts),
        ratio=args.ratio,
        blend_mode=blend_name(args.ratio),
        reference="fp32",
        ttft_dtype=args.ttft_dtype,
        ttft_memory_dtype=args.ttft_memory_dtype,
        repeats=repeats,
        max_tokens=args.max_tokens,
        **evaluated,
    )
    harness.write_result(args, result, run, plot)
    harness.log_rows(logger, result["dtypes"], _dtype_line)
    if (t := result.get("ttft")) is not None:
        logger.info(
            "TTFT p50: memory (%s) %.3fs; %s; miss cost %.3fs",
            args.ttft_memory_dtype,
            t["memory"]["p50_s"],
            ", ".join(f"{v} {t[v]['p50_s']:.3f}s ({100 * t[f'{v}_overhead']:+.1f}%)" for v in TTFT_VARIANTS[1:]),
            t["miss_cost_s"],
        )
    if (h := result.get("hit_rates")) is not None:
        logger.info(
            "disk hit rate: %s",
            ", ".join(f"{name} {100 * p['hit_rate']:.1f}%" for name, p in h["policies"].items()),
        )
    return 0


def _dtype_line(dtype: str, d: dict[str, Any]) -> str:
    """A storage dtype's size (raw and what a general compressor would save) and each mode's KL and agreement."""
    lzma = "-" if d["lzma_saving"] is None else f"{100 * d['lzma_saving']:.1f}%"
    modes = ", ".join(f"{k} kl={v['kl']:.2e} agree={v['answer_agreement']:.2f}" for k, v in d["modes"].items())
    return (
        f"{dtype}: {d['bytes_per_token']:.0f} B/token ({100 * d['share_of_fp16']:.1f}% of fp16; "
        f"zlib would save {100 * d['zlib_saving']:.1f}%, lzma {lzma}), {modes}"
    )
