"""Disk-tier hit rate under a skewed question stream, per eviction policy (part of `python -m bench kv`).

A corpus of `num_chunks` chunks, larger than the disk budget (`budget_share` of the corpus's bytes),
is asked about by `num_questions` questions. Each question retrieves `top_k` distinct chunks drawn
from a Zipf(`zipf_s`) popularity over the corpus (rank r has weight r^-s; which chunk has which rank
is shuffled). A question opens its chunks through a real disk-only `TieredKVStore`, exactly as /ask
does; a chunk it misses is "recomputed" (its entry built from the same small KV) and stored again,
as /ask does, evicting by the store's policy. The hit rate is counted over the questions after the
first `warmup_share` of the stream (the cache starts empty). Every policy sees the same stream.

Entry sizes do not change the comparison (the budget is a share of the corpus's bytes), so the
entries are small (`entry_tokens` tokens of a 2-layer model) to keep the run short: this is not a
timing.
"""

from __future__ import annotations

import argparse
import bisect
import random
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch


@dataclass(frozen=True)
class ZipfSetup:
    num_chunks: int = 2000
    num_questions: int = 4000
    top_k: int = 6
    zipf_s: float = 1.1
    budget_share: float = 0.25  # disk budget / corpus bytes: the corpus is four times the budget
    warmup_share: float = 0.2
    entry_tokens: int = 32
    seed: int = 0


def add_zipf_args(parser: argparse.ArgumentParser) -> None:
    """The options of a run that compares the policies; their defaults are ZipfSetup's."""
    default = ZipfSetup()
    parser.add_argument("--zipf-chunks", type=int, default=default.num_chunks, help="hit rate: corpus size in chunks")
    parser.add_argument(
        "--zipf-questions", type=int, default=default.num_questions, help="hit rate: questions in the stream"
    )
    parser.add_argument(
        "--zipf-s", type=float, default=default.zipf_s, help="hit rate: Zipf exponent of chunk popularity"
    )
    parser.add_argument(
        "--zipf-top-k", type=int, default=default.top_k, help="hit rate: chunks each question retrieves"
    )


def zipf_setup(args: argparse.Namespace) -> ZipfSetup:
    """The setup `add_zipf_args`' options and `--seed` name (the rest: ZipfSetup's defaults)."""
    # num_chunks, num_questions, top_k, zipf_s: the first fields, in order
    return ZipfSetup(args.zipf_chunks, args.zipf_questions, args.zipf_top_k, args.zipf_s, seed=args.seed)


def question_stream(setup: ZipfSetup) -> list[list[int]]:
    """The chunk indices each question retrieves (distinct within a question), reproducible by seed."""
    rng = random.Random(setup.seed)
    ranks = list(range(setup.num_chunks))
    rng.shuffle(ranks)  # chunk ranks[r] has popularity rank r
    cumulative: list[float] = []
    total = 0.0
    for r in range(setup.num_chunks):
        total += (r + 1) ** -setup.zipf_s
        cumulative.append(total)
    stream = []
    for _ in range(setup.num_questions):
        picked: list[int] = []
        while len(picked) < setup.top_k:
            r = bisect.bisect_left(cumulative, rng.random() * total)
            chunk = ranks[min(r, setup.num_chunks - 1)]
            if chunk not in picked:
                picked.append(chunk)
        stream.append(picked)
    return stream


def _chunk_kv(i: int, num_tokens: int) -> Any:
    from kvcache.types import ChunkKV

    g = torch.Generator().manual_seed(i)
    shape = (2, 1, num_tokens, 8)  # (layers, kv_heads, tokens, head_dim): small on purpose
    return ChunkKV(k=torch.randn(shape, generator=g), v=torch.randn(shape, generator=g))


def run_policy(
    setup: ZipfSetup, policy: str, stream: list[list[int]], storage_dtype: str, tmp_root: Path | None
) -> dict[str, Any]:
    """Play the stream against a disk-only store evicting by `policy`."""
    from kvcache.config import KVCacheSettings
    from kvcache.errors import KVEntryMissing
    from kvcache.space import KVSpace
    from kvcache.store import TieredKVStore

    with tempfile.TemporaryDirectory(prefix="blendrag-bench-zipf-", dir=tmp_root) as tmp:
        store = TieredKVStore(
            KVCacheSettings(
                dir=Path(tmp) / "kv",
                storage_dtype=storage_dtype,  # type: ignore[arg-type]
                memory_bytes=0,  # the disk tier alone: what its policy keeps is what is measured
                disk_bytes=1,  # replaced below once the entry size is known
                eviction=policy,  # type: ignore[arg-type]
                fsync=False,
                prefetch=False,
            )
        )
        assert store.disk is not None
        space = KVSpace(store, "zipf-bench", [1])
        keys = [space.key([10_000 + i]) for i in range(setup.num_chunks)]  # chunk i: token 10_000+i
        entry_bytes = _file_bytes(store, keys, setup)  # every entry has the same shape, hence size
        store.disk.budget_bytes = int(setup.budget_share * setup.num_chunks * entry_bytes)
        warmup = int(setup.warmup_share * len(stream))
        num_hits = num_lookups = 0
        for q, chunks in enumerate(stream):
            wanted = [keys[i] for i in chunks]
            try:
                space.open(wanted).close()
                missing: tuple[str, ...] = ()
            except KVEntryMissing as exc:
                missing = exc.keys
            if missing:  # recomputed at question time and stored again, through the one KV writer
                space.ensure(
                    [[10_000 + i] for i in chunks],
                    compute=lambda todo: [_chunk_kv(ids[0] - 10_000, setup.entry_tokens) for ids in todo],
                    missing_keys=missing,
                )
            if q >= warmup:
                num_lookups += len(wanted)
                num_hits += len(wanted) - len(missing)
        st = store.disk.stats()
        store.close()
    return {
        "hit_rate": num_hits / num_lookups if num_lookups else 0.0,
        "num_lookups": num_lookups,
        "num_evictions": st.num_evictions,
        "budget_bytes": st.budget_bytes,
        "entry_bytes": entry_bytes,
        "num_bytes_held": st.num_bytes,
        "num_entries_held": st.num_entries,
    }


def _file_bytes(store: Any, keys: list[str], setup: ZipfSetup) -> int:
    """Bytes of one entry file in this store's format (every chunk has the same shape)."""
    from kvcache.format import serialize_entry

    entry = store.encode(keys[0], _chunk_kv(0, setup.entry_tokens), model_fingerprint="zipf-bench")
    return len(serialize_entry(entry))


def evaluate(setup: ZipfSetup, policies: list[str], storage_dtype: str, tmp_root: Path | None) -> dict[str, Any]:
    stream = question_stream(setup)
    by_policy = {p: run_policy(setup, p, stream, storage_dtype, tmp_root) for p in policies}
    out: dict[str, Any] = {
        "setup": setup.__dict__,
        "storage_dtype": storage_dtype,
        "policies": by_policy,
    }
    if "frequency" in by_policy and "lru" in by_policy:
        out["frequency_minus_lru_points"] = 100 * (by_policy["frequency"]["hit_rate"] - by_policy["lru"]["hit_rate"])
    return out
