"""`python -m bench ingest`: how fast this machine ingests, what the KV costs on disk, how well retrieval finds.

1. An ingest of --chunks passages (nq6_dev: one passage = one document = one chunk), or with --docs of a real
   docs corpus (Markdown pages the app chunks as it chunks an upload), through the app's own IngestService on a
   temp data dir: total time, chunks per second per stage (parse, chunk, embed, kv,
   commit; timed from the job's progress callbacks), KV bytes on disk and the FAISS index size.
2. KV bytes per chunk and per token for each storage dtype (fp16, bf16, int8), in memory and as entry
   files, on a sample of the ingested chunks (also timing a batched precompute, which the service does not
   use yet).
3. Retrieval recall@1/@5/@10 on the whole dataset: every passage of every question pooled into one corpus,
   a question hits at k when its gold passage (`"isgold": true`) is in the top k.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import harness
from bench.data import Passage, load_dataset, select_examples
from bench.docs_corpus import read_pages, write_corpus
from bench.inprocess import args_settings, dir_bytes, ingest_passages, running_app
from bench.prepared import STORAGE_DTYPES, PreparedPrompt

logger = logging.getLogger(__name__)

NAME = "ingest"
HELP = "ingest rate per stage, KV bytes per dtype, FAISS size, recall@k"
STAGES = ("parse", "chunk", "embed", "kv", "commit")
RECALL_KS = (1, 5, 10)


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.set_defaults(examples=None, passages=None)
    parser.add_argument(
        "--chunks", type=int, default=1000, help="passages to ingest (each is one chunk); with --docs, pages"
    )
    parser.add_argument(
        "--docs",
        nargs="?",
        const="stdlib",
        default=None,
        metavar="DIR",
        help="ingest a docs corpus instead of --dataset's passages: a folder of Markdown pages, or without DIR "
        "the standard library's reference pages (bench/docs_corpus.py, made in the temp dir)",
    )
    harness.add_kv_dtype_arg(parser, choices=STORAGE_DTYPES)
    parser.add_argument("--dtype-sample", type=int, default=24, help="chunks used to measure KV bytes per dtype")
    parser.add_argument("--no-recall", action="store_true", help="skip the recall@k part")
    parser.add_argument("--tmp-dir", type=Path, default=None, help="where the temp data dir goes")


def unique_passages(examples: list, num_passages: int | None) -> list[Passage]:
    """The passages of the examples (first num_passages of each), de-duplicated by (title, text)."""
    seen: set[tuple[str, str]] = set()
    out: list[Passage] = []
    for example in examples:
        for p in example.passages[:num_passages]:
            if (p.title, p.text) not in seen:
                seen.add((p.title, p.text))
                out.append(p)
    return out


def docs_passages(docs: str, tmp: Path) -> list[Passage]:
    """The pages of --docs as passages: the standard-library corpus written under tmp, or a folder's pages."""
    folder = write_corpus(tmp / "docs") if docs == "stdlib" else Path(docs)
    return [Passage(title=title, text=text) for title, text in read_pages(folder)]


def _ingest_part(state: Any, passages: list[Passage]) -> dict[str, Any]:
    services = state.services
    job, clock = ingest_passages(state, passages)
    status = getattr(job.status, "value", job.status)
    if status != "succeeded":
        raise RuntimeError(f"the benchmark's ingest job ended {status}: {job.errors[:3]}")
    chunks = services.catalog.iter_chunks()
    num_tokens = sum(len(c.token_ids) for c in chunks)
    total_s = clock.finished - clock.started  # type: ignore[operator]
    stage_s = clock.durations()
    settings = services.settings
    services.retriever.save()
    return {
        "documents": len(passages),
        "chunks": len(chunks),
        "tokens": num_tokens,
        "seconds": total_s,
        "chunks_per_s": len(chunks) / total_s,
        "stages": {
            s: {"seconds": stage_s[s], "chunks_per_s": len(chunks) / stage_s[s] if stage_s[s] > 0 else None}
            for s in STAGES
            if s in stage_s
        },
        "kv_storage_dtype": settings.kvcache.storage_dtype,
        "kv_bytes": dir_bytes(settings.kvcache.dir, "*.safetensors"),
        "faiss_index_bytes": dir_bytes(settings.index_dir, "vectors-*.bin"),
        "index_dir_bytes": dir_bytes(settings.index_dir),
        "catalog_bytes": dir_bytes(settings.data_dir, "catalog.db*"),
        "errors": job.errors,
        "_chunk_token_ids": [list(c.token_ids) for c in chunks],
    }


def _dtype_part(engine: Any, chunk_ids: list[list[int]]) -> dict[str, Any]:
    t0 = time.perf_counter()
    kvs = PreparedPrompt(engine, chunk_ids, engine.precompute_chunks(chunk_ids))
    batched_s = time.perf_counter() - t0
    num_tokens = kvs.num_tokens
    dtypes = {}
    for dtype in STORAGE_DTYPES:
        mem, file = kvs.stored_bytes(dtype), kvs.serialized_bytes(dtype)
        dtypes[dtype] = {
            "bytes_per_chunk": mem / len(chunk_ids),
            "bytes_per_token": mem / num_tokens,
            "file_bytes_per_chunk": file / len(chunk_ids),
            "file_bytes_per_token": file / num_tokens,
        }
    return {
        "sample_chunks": len(chunk_ids),
        "sample_tokens": num_tokens,
        "dtypes": dtypes,
        "kv_batched_chunks_per_s": len(chunk_ids) / batched_s,
    }


def _recall_part(dataset: Path, state: Any) -> dict[str, Any]:
    from retrieval.eval import evaluate_recall

    retriever = state.services.retriever
    report = evaluate_recall(dataset, state.services.settings.retrieval, ks=RECALL_KS, embedder=retriever.embedder)
    return {
        "recall": {str(k): v for k, v in report.recall.items()},
        "questions": report.num_questions,
        "passages": report.num_passages,
        "embed_batched_chunks_per_s": report.passages_per_second,
        "search_s": report.search_seconds,
    }


async def _run(args: argparse.Namespace, passages: list[Passage], data_dir: Path) -> dict[str, Any]:
    settings = args_settings(
        data_dir,
        args,
        kvcache={"storage_dtype": args.kv_dtype},
        engine={"dtype": args.dtype},
    )
    async with running_app(settings) as state:
        engine = state.services.engine
        # The embedder loads lazily; its one-time load is not part of any ingest rate.
        await asyncio.to_thread(state.services.retriever.embedder.load)
        ingest = await asyncio.to_thread(_ingest_part, state, passages)
        chunk_ids = ingest.pop("_chunk_token_ids")[: args.dtype_sample]
        kv = await asyncio.to_thread(_dtype_part, engine, chunk_ids)
        out: dict[str, Any] = {
            "ingest": ingest,
            "kv_bytes": kv["dtypes"],
            "kv_sample": {k: v for k, v in kv.items() if k != "dtypes"},
            "model": harness.model_name(engine),
            "machine": harness.machine_info(engine),
            "embedder": settings.retrieval.embedder,
        }
        if not args.no_recall:
            out["retrieval"] = await asyncio.to_thread(_recall_part, args.dataset, state)
        return out


def plot(result: dict[str, Any], path: Path) -> None:
    fig, (ax_rate, ax_bytes, ax_recall) = harness.new_figure(3)
    stages = result["ingest"]["stages"]
    names = [s for s in STAGES if s in stages and stages[s]["chunks_per_s"]]
    ax_rate.bar(names, [stages[s]["chunks_per_s"] for s in names], color="tab:blue")
    ax_rate.set_yscale("log")
    ax_rate.set_title(f"ingest chunks/s per stage ({result['ingest']['chunks']} chunks)")
    dtypes = list(result["kv_bytes"])
    ax_bytes.bar(dtypes, [result["kv_bytes"][d]["file_bytes_per_token"] / 1024 for d in dtypes], color="tab:purple")
    ax_bytes.set_title("KV KiB per token (entry file)")
    if "retrieval" in result:
        recall = result["retrieval"]["recall"]
        ax_recall.bar([f"@{k}" for k in recall], list(recall.values()), color="tab:green")
        ax_recall.set_ylim(0, 1.05)
        ax_recall.set_title(f"recall ({result['retrieval']['questions']} questions)")
    harness.finish_figure(fig, path, result, f"{result['embedder']} embedder")


def main(args: argparse.Namespace) -> int:
    run = harness.RunRecord.start(args)
    examples = select_examples(load_dataset(args.dataset), args.examples, args.seed)
    with tempfile.TemporaryDirectory(prefix="blendrag-bench-ingest-", dir=args.tmp_dir) as tmp:
        if args.docs:
            try:
                passages = docs_passages(args.docs, Path(tmp))[: args.chunks]
            except (OSError, ValueError) as exc:
                logger.error("--docs %s: %s", args.docs, exc)
                return 2
            logger.info("ingest: %d docs pages (%s)", len(passages), args.docs)
            corpus = "stdlib docs (bench/docs_corpus.py)" if args.docs == "stdlib" else "docs folder"
        else:
            passages = unique_passages(examples, args.passages)[: args.chunks]
            logger.info("ingest: %d passages from %d examples", len(passages), len(examples))
            corpus = "dataset passages"
        measured = asyncio.run(_run(args, passages, Path(tmp) / "data"))
    result = harness.result_header(
        NAME,
        args,
        examples=len(examples),
        passages=args.passages,
        chunks_requested=args.chunks,
        corpus=corpus,
        **measured,
    )
    harness.write_result(args, result, run, plot)
    ing = result["ingest"]
    logger.info(
        "ingested %d chunks (%d tokens) in %.1fs: %s; KV %.1f MiB, FAISS %.1f KiB",
        ing["chunks"],
        ing["tokens"],
        ing["seconds"],
        ", ".join(f"{s} {v['chunks_per_s'] or 0:.1f}/s" for s, v in ing["stages"].items()),
        ing["kv_bytes"] / 2**20,
        ing["faiss_index_bytes"] / 1024,
    )
    if "retrieval" in result:
        logger.info("recall %s", result["retrieval"]["recall"])
    return 0
