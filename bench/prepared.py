"""The one prepared-prompt type of the benchmarks: an example as /ask's prompt, its chunk KV computed
once behind the engine's prefix (outside any timing: it is ingest's work), served as /ask serves it.

    prompts = bench_prompts(engine, dataset, num_examples=5, num_passages=6)   # the one sampler
    prepared = PreparedPrompt.compute(engine, prompts[0])
    source = prepared.source("int4")       # TieredKVStore encoding + the server's layer-wise loader

A storage dtype other than `fp32` goes through an in-memory `TieredKVStore` built from the server's own
`KVCacheSettings` (its int4 groups and its prefetching loader), written through the one KV writer
(`KVSpace.ensure`); `fp32` serves the engine's own tensors, unrounded, as a reference.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

from bench.data import BenchPrompt, PassageOrder, build_prompt, load_dataset, rank_by_retriever, select_examples

if TYPE_CHECKING:
    from engine.engine import Engine
    from engine.types import BlendConfig, Mode, PromptLayout
    from kvcache.store import TieredKVStore
    from kvcache.types import ChunkKV, LayerKVReader

logger = logging.getLogger(__name__)

ENGINE_KV = "fp32"  # the engine's own tensors, not through the store
STORAGE_DTYPES = ("fp16", "bf16", "int8", "int4")  # what the store can write


def bench_prompts(
    engine: Engine,
    dataset: Path,
    num_examples: int | None,
    num_passages: int,
    seed: int = 0,
    *,
    with_answers: bool = False,
    order: PassageOrder = "file",
) -> list[BenchPrompt]:
    """The seeded sample of examples with at least `num_passages` passages (and a gold answer when
    `with_answers`), as /ask's prompts; `num_examples=None` takes every one. `order` says which passages
    play the retrieval ranking (bench/data.py): the same examples are chosen either way."""
    examples = [e for e in select_examples(load_dataset(dataset), None, seed) if len(e.passages) >= num_passages]
    if with_answers:
        examples = [e for e in examples if e.answers]
    chosen = examples if num_examples is None else examples[:num_examples]
    if not chosen:
        raise ValueError(f"{dataset}: no example has {num_passages} passages" + (" and an answer" * with_answers))
    if order == "retrieval":
        chosen = rank_by_retriever(chosen)
    return [build_prompt(engine.prompt, engine.tokenizer, e, num_passages) for e in chosen]


def put_chunks(store: TieredKVStore, engine: Engine, chunk_ids: list[list[int]], kvs: list[ChunkKV]) -> list[str]:
    """Store each chunk's KV under the key /ask would look up; returns the keys in prompt order.

    Goes through the one KV writer with the KV already computed; a chunk the store could not keep stops
    the benchmark (its figures would be of recomputed KV).
    """
    from kvcache.space import KVSpace

    by_ids = {tuple(ids): kv for ids, kv in zip(chunk_ids, kvs, strict=True)}
    written = KVSpace.of_engine(store, engine).ensure(
        chunk_ids, compute=lambda todo: [by_ids[tuple(ids)] for ids in todo]
    )
    if written.unwritten:
        raise RuntimeError(f"the benchmark's KV store refused {len(written.unwritten)} chunk(s)")
    return written.keys


class PreparedPrompt:
    """One prompt and its chunks' KV, served in any storage dtype the store supports.

    Without a `prompt` it is a bare set of chunks (ingest's byte counts): everything but `layout` works.
    """

    def __init__(
        self, engine: Engine, chunk_ids: list[list[int]], kvs: list[ChunkKV], prompt: BenchPrompt | None = None
    ) -> None:
        self.engine = engine
        self.chunk_ids = chunk_ids
        self.kvs = kvs  # one per chunk, in prompt order, computed behind the engine's prefix
        self.prompt = prompt
        self._stores: dict[str, tuple[TieredKVStore, list[str]]] = {}
        self._device_kvs: list[ChunkKV] | None = None

    @classmethod
    def compute(cls, engine: Engine, prompt: BenchPrompt) -> PreparedPrompt:
        """Precompute the prompt's chunk KV as ingest does (`Engine.precompute_chunks`)."""
        return cls(engine, prompt.chunk_ids, engine.precompute_chunks(prompt.chunk_ids), prompt)

    @property
    def layout(self) -> PromptLayout:
        if self.prompt is None:
            raise ValueError("these chunks were prepared without a prompt")
        return self.prompt.layout

    @property
    def num_tokens(self) -> int:
        """Tokens of chunk KV (the context), not of the whole prompt."""
        return sum(kv.num_tokens for kv in self.kvs)

    def store(self, storage_dtype: str) -> tuple[TieredKVStore, list[str]]:
        """The in-memory store holding these chunks in `storage_dtype`, and their keys in prompt order."""
        from kvcache.config import KVCacheSettings
        from kvcache.store import TieredKVStore

        if storage_dtype not in self._stores:
            budget = 2 * sum(kv.nbytes() for kv in self.kvs) + 1024 * 1024
            # The server's settings (int4 groups, prefetch), memory tier only and large enough to keep all. No device
            # tier: a storage dtype's figure is the chunks crossing from host memory every request (the device-
            # resident figure is `fp32`, the engine's own tensors on the device).
            settings = KVCacheSettings(
                dir=None,
                storage_dtype=storage_dtype,  # type: ignore[arg-type]
                memory_bytes=budget,
                device_bytes=0,
            )
            store = TieredKVStore(settings)
            self._stores[storage_dtype] = (store, put_chunks(store, self.engine, self.chunk_ids, self.kvs))
        return self._stores[storage_dtype]

    def source(self, storage_dtype: str) -> LayerKVReader:
        """A fresh layer source over these chunks: through the store's loader, or the engine's tensors."""
        from kvcache.types import InMemoryLayerReader

        if storage_dtype == ENGINE_KV:
            # On an accelerator the engine's own tensors are moved there once: chunks resident on the device,
            # as the hot chunks a server keeps there would be (nothing crosses the bus per request).
            return InMemoryLayerReader(self._resident_kvs(), device=self.engine.device, dtype=self.engine.dtype)
        store, keys = self.store(storage_dtype)
        return store.open_layers(keys, device=self.engine.device, dtype=self.engine.dtype)

    def _resident_kvs(self) -> list[ChunkKV]:
        from kvcache.types import ChunkKV

        device = self.engine.device
        if device.type == "cpu":
            return self.kvs
        if self._device_kvs is None:
            self._device_kvs = [
                ChunkKV(k=kv.k.to(device, self.engine.dtype), v=kv.v.to(device, self.engine.dtype)) for kv in self.kvs
            ]
        return self._device_kvs

    def stored_bytes(self, storage_dtype: str) -> int:
        """Tensor bytes the memory tier holds for these chunks in `storage_dtype` (int8: with scales)."""
        store, keys = self.store(storage_dtype)
        located = store.locate_many(keys)
        return sum(located[k].num_bytes_by_tier["memory"] for k in keys)

    def serialized_entries(self, storage_dtype: str) -> list[bytes]:
        """These chunks' entry files (what the disk tier and Redis hold), in prompt order."""
        from kvcache.format import serialize_entry

        store, keys = self.store(storage_dtype)
        out = []
        for key in keys:
            entry = store.get_entry(key)
            if entry is None:
                raise RuntimeError(f"the benchmark's KV store lost entry {key}")
            out.append(serialize_entry(entry))
        return out

    def serialized_bytes(self, storage_dtype: str) -> int:
        """Bytes of these chunks' entry files."""
        return sum(len(data) for data in self.serialized_entries(storage_dtype))


def prepare_prompts(
    engine: Engine,
    dataset: Path,
    num_examples: int,
    num_passages: int,
    seed: int = 0,
    *,
    with_answers: bool = False,
    order: PassageOrder = "file",
) -> list[PreparedPrompt]:
    """`bench_prompts(...)` with every prompt's chunk KV precomputed."""
    prepared = []
    prompts = bench_prompts(engine, dataset, num_examples, num_passages, seed, with_answers=with_answers, order=order)
    for prompt in prompts:
        t0 = time.perf_counter()
        prepared.append(PreparedPrompt.compute(engine, prompt))
        logger.info(
            "example %d: %d tokens (%d in %d chunks), chunk KV precomputed in %.1fs",
            prompt.example.index,
            prompt.layout.num_tokens,
            prompt.layout.num_context_tokens,
            len(prompt.chunk_ids),
            time.perf_counter() - t0,
        )
    return prepared


def time_to_first_token(
    engine: Engine, layout: PromptLayout, source: LayerKVReader | None, mode: Mode, blend: BlendConfig | None
) -> tuple[float, int]:
    """(TTFT seconds, recomputed context tokens) of one request generating a single token."""
    from engine.types import FinishEvent, GenerationRequest, SamplingParams

    request = GenerationRequest(
        "bench", layout, source, mode, blend or engine.settings.blend_config(), SamplingParams(max_tokens=1)
    )
    finish = [e for e in engine.generate(request) if isinstance(e, FinishEvent)][0]
    return finish.ttft_s, finish.num_recomputed_tokens
