"""The working cache pool (engine/cache_pool.py): size classes, reuse of the same tensors, the byte cap, and
answers that do not change when a cache is reused (no row or key bias of an earlier request leaks)."""

from __future__ import annotations

import dataclasses
import gc
from pathlib import Path

import pytest
import torch
from enginetest_tiny import random_chunks

from engine.cache_pool import CacheLayout, WorkingCachePool, size_class
from engine.types import BlendConfig, GenerationRequest, SamplingParams, TokenEvent
from kvcache.types import InMemoryLayerReader

# 2 layers × 1 KV head × 4 dims in float32: 64 bytes a position for K and V, 32 KiB for a 512-token cache.
LAYOUT = CacheLayout(num_layers=2, num_kv_heads=1, head_dim=4, dtype=torch.float32, device=torch.device("cpu"))
SLOT_512 = 2 * 2 * 1 * 512 * 4 * 4


def test_size_classes_are_powers_of_two_from_512() -> None:
    assert [size_class(n) for n in (1, 512, 513, 1024, 1025, 3850, 4096, 4097)] == [
        512,
        512,
        1024,
        1024,
        2048,
        4096,
        4096,
        8192,
    ]
    assert size_class(17, min_tokens=16) == 32
    assert LAYOUT.slot_bytes(512) == SLOT_512 == 32768


def test_a_released_cache_is_handed_out_again_for_its_class() -> None:
    pool = WorkingCachePool(LAYOUT, max_bytes=1 << 20)
    first = pool.acquire(600)
    assert (first.capacity, first.length, first.key_bias) == (1024, 0, None)
    k, v = first.k, first.v
    first.length, first.key_bias = 700, torch.zeros(1024)
    pool.release(first)
    again = pool.acquire(1000)  # the same class: the same tensor objects, length 0, no bias
    assert again.k is k and again.v is v
    assert (again.length, again.key_bias) == (0, None)
    other = pool.acquire(300)  # another class: another slab
    assert other.capacity == 512 and other.k.data_ptr() != k.data_ptr()
    stats = pool.stats()
    assert (stats.num_slabs, stats.allocated_slabs, stats.hits, stats.unpooled) == (2, 2, 1, 0)
    assert stats.held_bytes == 3 * SLOT_512 and stats.idle_bytes == 0


def test_a_cache_nobody_releases_goes_back_when_it_is_collected() -> None:
    pool = WorkingCachePool(LAYOUT, max_bytes=1 << 20)
    cache = pool.acquire(100)
    k = cache.k
    assert pool.stats().idle_bytes == 0
    del cache
    gc.collect()
    assert pool.stats().idle_bytes == SLOT_512
    assert pool.acquire(100).k is k


def test_releasing_twice_gives_the_slot_back_once() -> None:
    pool = WorkingCachePool(LAYOUT, max_bytes=1 << 20)
    cache = pool.acquire(100)
    pool.release(cache)
    pool.release(cache)
    one, two = pool.acquire(100), pool.acquire(100)
    assert one.k.data_ptr() != two.k.data_ptr()  # not the same slot handed out twice
    assert pool.stats().num_slabs == 2


def test_the_byte_cap_evicts_idle_slabs_and_then_allocates_outside_the_pool() -> None:
    pool = WorkingCachePool(LAYOUT, max_bytes=2 * SLOT_512)  # room for one 1024-token cache
    small = pool.acquire(512)
    small_k = small.k
    pool.release(small)
    large = pool.acquire(1024)  # 32 KiB held + 64 KiB > 64 KiB: the idle 512 slab goes
    stats = pool.stats()
    assert (stats.num_slabs, stats.held_bytes, stats.allocated_slabs) == (1, 2 * SLOT_512, 2)
    extra = pool.acquire(300)  # the 1024 slab is in use, nothing idle to evict: a plain cache of the exact size
    assert extra.slot is None and extra.capacity == 300
    assert pool.stats().unpooled == 1
    pool.release(extra)  # nothing to give back
    pool.release(large)
    again = pool.acquire(512)  # evicts the idle 1024 slab; a new 512 slab, not the evicted one's tensor
    assert again.slot is not None and again.k is not small_k
    assert pool.stats().held_bytes == SLOT_512


def test_a_cache_longer_than_the_largest_class_is_unpooled() -> None:
    pool = WorkingCachePool(LAYOUT, max_bytes=1 << 30, max_capacity=1024)
    cache = pool.acquire(1500)
    assert cache.slot is None and cache.capacity == 1500
    assert pool.acquire(1024).slot is not None


def test_a_grown_cache_leaves_its_slot_and_still_returns_it() -> None:
    pool = WorkingCachePool(LAYOUT, max_bytes=1 << 20)
    cache = pool.acquire(512)
    slot_k = cache.k
    cache.length = 512
    assert cache.in_slot
    cache.ensure_capacity(513)
    assert cache.capacity == 1024 and not cache.in_slot
    pool.release(cache)
    assert pool.acquire(10).k is slot_k


def test_a_slab_of_several_slots_keeps_a_scratch_slot_out_of_reach() -> None:
    pool = WorkingCachePool(LAYOUT, max_bytes=1 << 20, slots=3, scratch=True)
    caches = [pool.acquire(100) for _ in range(3)]
    slab = caches[0].slot.slab
    assert [c.slot.index for c in caches] == [0, 1, 2]
    assert slab.k.shape == (2, 4, 1, 512, 4) and slab.scratch == 3
    assert all(c.slot.slab is slab for c in caches)
    assert caches[1].k.data_ptr() == slab.k[:, 1:2].data_ptr() and caches[1].k.shape == (2, 1, 1, 512, 4)
    fourth = pool.acquire(100)  # the slab is full: a second one
    assert fourth.slot.slab is not slab and fourth.slot.index == 0
    assert torch.count_nonzero(slab.k) == torch.count_nonzero(slab.v) == 0  # zeroed when allocated


def test_a_slab_shrinks_to_the_slots_that_fit_under_the_cap() -> None:
    pool = WorkingCachePool(LAYOUT, max_bytes=3 * SLOT_512 + 100, slots=4, scratch=True)
    first = pool.acquire(100)
    assert first.slot.slab.num_slots == 2 and first.slot.slab.scratch == 2  # 2 slots + scratch fit, not 4 + 1
    second = pool.acquire(100)
    assert second.slot.slab is first.slot.slab
    assert pool.acquire(100).slot is None  # no room for another slab: unpooled
    assert pool.stats().held_bytes == 3 * SLOT_512


# ------------------------------------------------------------------------------------- through the engine
def _pooled_engine(tiny_model_dir: Path, models_dir: Path):
    from engine.config import EngineSettings
    from engine.engine import Engine

    settings = EngineSettings(
        model=str(tiny_model_dir), device="cpu", dtype="float32", working_cache_pool_bytes=64 * 1024 * 1024
    )
    return Engine(settings, models_dir=models_dir)


def _requests(engine) -> list[tuple[GenerationRequest, list[list[int]]]]:
    """A long blend with a stale-key bias, then a short reuse and a short full prefill: the later ones take the
    slot the first one wrote further into (and biased)."""
    out = []
    for i, (sizes, mode, config) in enumerate(
        [
            ([60, 45, 70], "blend", BlendConfig(recompute_ratio=0.3, score_layers=(1,), stale_key_bias=2.0)),
            ([12, 9], "reuse", BlendConfig()),
            ([20], "full", BlendConfig()),
        ]
    ):
        chunks = random_chunks(sizes, seed=300 + i)
        layout = engine.prompt.layout(chunks, f"what is number {i}?")
        request = GenerationRequest(
            f"r{i}",
            layout,
            None if mode == "full" else InMemoryLayerReader(engine.precompute_chunks(chunks)),
            mode,
            config,
            SamplingParams(12, ignore_eos=True, stop_on_repeated_line=False),
        )
        out.append((request, chunks))
    return out


def _answer(engine, request: GenerationRequest, chunks: list[list[int]]) -> list[int]:
    request = dataclasses.replace(request, kv_reader=InMemoryLayerReader(engine.precompute_chunks(chunks)))
    return [e.token_id for e in engine.generate(request) if isinstance(e, TokenEvent)]


def test_answers_with_the_pool_are_bit_identical_to_answers_without(tiny_engine, tiny_model_dir, tmp_path) -> None:
    assert tiny_engine.cache_pool is None  # off on a CPU by default
    pooled = _pooled_engine(tiny_model_dir, tmp_path)
    reference = [_answer(tiny_engine, request, chunks) for request, chunks in _requests(tiny_engine)]
    answers = [_answer(pooled, request, chunks) for request, chunks in _requests(pooled)]
    assert answers == reference and all(len(a) == 12 for a in answers)
    stats = pooled.cache_pool.stats()
    assert (stats.num_slabs, stats.allocated_slabs, stats.hits) == (1, 1, 2)  # one slab, reused twice
    assert stats.idle_bytes == stats.held_bytes  # every run gave its cache back
    # Teacher-forced scoring reads every logit of a pass and its extension: equal to the bit.
    for (request, chunks), (ref_request, _) in zip(_requests(pooled), _requests(tiny_engine), strict=True):
        targets = [5, 17, 42, 7]
        got = pooled.score(
            request.layout, InMemoryLayerReader(pooled.precompute_chunks(chunks)), request.mode, request.blend, targets
        )
        ref = tiny_engine.score(
            ref_request.layout,
            InMemoryLayerReader(tiny_engine.precompute_chunks(chunks)),
            ref_request.mode,
            ref_request.blend,
            targets,
        )
        assert got.token_nlls == ref.token_nlls
        assert torch.equal(got.first_token_logits, ref.first_token_logits)


def test_a_cancelled_or_failed_run_gives_its_cache_back(tiny_model_dir, tmp_path) -> None:
    pooled = _pooled_engine(tiny_model_dir, tmp_path)
    (request, chunks), *_ = _requests(pooled)
    request = dataclasses.replace(request, kv_reader=InMemoryLayerReader(pooled.precompute_chunks(chunks)))
    run = pooled.new_run(request)
    pooled.run_prompt(run)
    assert pooled.cache_pool.stats().idle_bytes == 0
    run.cancel()
    assert pooled.cache_pool.stats().idle_bytes == pooled.cache_pool.stats().held_bytes
    request = dataclasses.replace(request, kv_reader=InMemoryLayerReader(pooled.precompute_chunks(chunks)))
    run = pooled.new_run(request)
    pooled.run_prompt(run)
    assert pooled.cache_pool.stats().idle_bytes == 0
    run.fail()
    assert pooled.cache_pool.stats().idle_bytes == pooled.cache_pool.stats().held_bytes


@pytest.mark.parametrize("bad", [-1])
def test_the_setting_refuses_a_negative_cap(bad: int) -> None:
    from pydantic import ValidationError

    from engine.config import EngineSettings

    with pytest.raises(ValidationError, match="working_cache_pool_bytes"):
        EngineSettings(working_cache_pool_bytes=bad)


@pytest.mark.parametrize("mode", ["full", "reuse", "blend"])
def test_slots_of_a_slab_keep_the_device_path_free_of_host_reads(tiny_model_dir, tmp_path, mode: str) -> None:
    """The CUDA pool's caches (strided slots of a slab) through the sync-free prompt pass (engine/host_sync.py)."""
    from engine.config import EngineSettings
    from engine.engine import Engine
    from engine.host_sync import HostSyncAudit

    engine = Engine(EngineSettings(model=str(tiny_model_dir), device="cpu", dtype="float32"), models_dir=tmp_path)
    cfg = engine.config
    layout = CacheLayout(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, engine.dtype, engine.device)
    engine.cache_pool = WorkingCachePool(layout, 1 << 26, slots=4, scratch=True)
    chunks = random_chunks([37, 22, 41, 5], seed=11)
    prompt = engine.prompt.layout(chunks, "what is the code of the north gate?")
    stored = engine.precompute_chunks(chunks)
    config = BlendConfig(recompute_ratio=0.15, score_layers=(1, 2), stale_key_bias=0.5)
    reference = engine.prompt_pass(prompt, InMemoryLayerReader(stored), mode, config)
    engine.transformer.sync_free = True
    with HostSyncAudit() as audit:
        result = engine.prompt_pass(prompt, InMemoryLayerReader(stored), mode, config)
    assert audit.calls == []
    assert result.cache.slot.index != reference.cache.slot.index  # another slot of the same slab
    torch.testing.assert_close(result.logits, reference.logits, atol=1e-5, rtol=0)
