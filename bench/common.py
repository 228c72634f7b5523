"""Shared by the speed benchmarks: examples turned into /ask's prompts with their chunk KV precomputed
(outside any timing), peak-RSS probing, and small statistics helpers.

Prompts come from `bench.data.build_prompt`, which builds them exactly as /ask does.
"""

from __future__ import annotations

import logging
import resource
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from bench.data import Example, build_prompt, load_dataset, select_examples

if TYPE_CHECKING:
    from engine.engine import Engine
    from engine.types import BlendConfig, Mode, PromptLayout
    from kvcache.types import ChunkKV, LayerKVSource

logger = logging.getLogger(__name__)


@dataclass
class PreparedExample:
    example: Example
    layout: PromptLayout
    kvs: list[ChunkKV]  # one per chunk, in prompt order, computed behind the engine's prefix
    kv_dtype: str  # what the KV source serves: the engine's own tensors (fp32) or a storage rounding

    def source(self, engine: Engine) -> LayerKVSource:
        from kvcache.types import InMemoryLayerSource

        return InMemoryLayerSource(self.kvs, device=engine.device, dtype=engine.dtype)


_STORAGE = {"fp32": None, "fp16": "float16", "bf16": "bfloat16"}


def prepare_examples(
    engine: Engine, dataset: Path, num_examples: int, num_passages: int, seed: int = 0, kv_dtype: str = "fp16"
) -> list[PreparedExample]:
    """Build layouts and precompute every chunk's KV (as ingest would), stored in `kv_dtype`."""
    import torch

    examples = [e for e in select_examples(load_dataset(dataset), None, seed) if len(e.passages) >= num_passages]
    prepared = []
    for example in examples[:num_examples]:
        bench_prompt = build_prompt(engine.prompt, engine.tokenizer, example, num_passages)
        chunk_ids, layout = bench_prompt.chunk_ids, bench_prompt.layout
        t0 = time.perf_counter()
        kvs = engine.prefill_chunks(chunk_ids)
        storage = _STORAGE[kv_dtype]
        if storage is not None:
            from kvcache.types import ChunkKV

            dtype = getattr(torch, storage)
            kvs = [ChunkKV(k=kv.k.to(dtype), v=kv.v.to(dtype)) for kv in kvs]
        logger.info(
            "example %d: %d tokens (%d in %d chunks), chunk KV precomputed in %.1fs",
            example.index,
            layout.num_tokens,
            layout.num_context_tokens,
            len(chunk_ids),
            time.perf_counter() - t0,
        )
        prepared.append(PreparedExample(example=example, layout=layout, kvs=kvs, kv_dtype=kv_dtype))
    if not prepared:
        raise ValueError(f"{dataset}: no example has {num_passages} passages")
    return prepared


def time_to_first_token(
    engine: Engine, layout: PromptLayout, source: LayerKVSource | None, mode: Mode, blend: BlendConfig | None
) -> tuple[float, int]:
    """(TTFT seconds, recomputed context tokens) of one request generating a single token."""
    from engine.types import FinishEvent, GenerationRequest, SamplingParams

    request = GenerationRequest(
        "bench", layout, source, mode, blend or engine.settings.blend_config(), SamplingParams(max_tokens=1)
    )
    finish = [e for e in engine.generate(request) if isinstance(e, FinishEvent)][0]
    return finish.ttft_s, finish.num_recomputed_tokens


def peak_rss_bytes() -> int:
    """High-water resident set size of this process's own memory so far.

    Linux's VmHWM, not ru_maxrss: a spawned child's ru_maxrss also counts the forked parent's pages it
    held for a moment before exec, so a small child of a big benchmark process reports the parent's size.
    """
    status = Path("/proc/self/status")
    if status.is_file():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024
