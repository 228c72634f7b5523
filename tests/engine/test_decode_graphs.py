"""Decode on static buffers (engine/decode_graphs.py): the path decision, the size classes, the prepared inputs,
and the static step (what a CUDA graph records) against the eager step. The capture itself needs CUDA: the tests
at the end run there (scripts/device-check.sh) and are skipped with their reason on a CPU."""

from __future__ import annotations

import asyncio
import gc
import logging
from pathlib import Path

import pytest
import torch
from enginetest_tiny import random_chunks

from engine.batched_decode import decode_batch
from engine.cache_pool import CacheLayout, WorkingCachePool
from engine.decode_graphs import DecodeGraphs, batch_class, step_inputs, use_decode_graphs
from engine.types import BlendConfig, GenerationRequest, SamplingParams, TokenEvent
from engine.working_cache import WorkingCache
from kvcache.types import InMemoryLayerReader

CPU, CUDA = torch.device("cpu"), torch.device("cuda")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (scripts/device-check.sh)")


def test_the_decode_path() -> None:
    assert use_decode_graphs("auto", CUDA) is True
    assert use_decode_graphs("auto", CPU) is False
    assert use_decode_graphs("off", CUDA) is False
    assert use_decode_graphs("off", CPU) is False


def test_batch_classes() -> None:
    assert [batch_class(n) for n in (1, 2, 3, 4, 5, 8, 9)] == [1, 2, 4, 4, 8, 8, 16]
    with pytest.raises(ValueError, match="at least one row"):
        batch_class(0)


def test_step_inputs_pad_with_the_scratch_slot() -> None:
    layout = CacheLayout(2, 1, 4, torch.float32, CPU)
    pool = WorkingCachePool(layout, max_bytes=1 << 20, slots=3, scratch=True)
    first, second = pool.acquire(40), pool.acquire(40)
    first.length, second.length = 5, 9
    inputs = step_inputs([second, first], [11, 7], batch=4, scratch=3)
    assert inputs.dtype == torch.int64
    assert inputs.tolist() == [[11, 7, 0, 0], [9, 5, 0, 0], [1, 0, 3, 3]]
    with pytest.raises(ValueError, match="pool slots"):
        step_inputs([WorkingCache.allocate(2, 1, 4, 16, torch.float32, CPU)], [1], batch=1, scratch=3)
    with pytest.raises(ValueError, match="for a batch of 1"):
        step_inputs([first, second], [1, 2], batch=1, scratch=3)


def _static_engine(tiny_model_dir: Path, models_dir: Path, capture: bool = False):
    """The tiny engine on a CPU with the CUDA path's pool (slabs of 4 slots plus scratch) and the static step,
    run as is (`capture=False`), as the device runs it inside a graph."""
    from engine.config import EngineSettings
    from engine.engine import Engine

    engine = Engine(EngineSettings(model=str(tiny_model_dir), device="cpu", dtype="float32"), models_dir=models_dir)
    cfg = engine.config
    layout = CacheLayout(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, engine.dtype, engine.device)
    engine.cache_pool = WorkingCachePool(layout, 64 * 1024 * 1024, slots=4, scratch=True)
    engine.decode_graphs = DecodeGraphs(capture=capture)
    return engine


def _requests(engine, num: int) -> list[GenerationRequest]:
    """Prompts of different lengths; the first blends with a stale-key bias (a key bias in its slot's row)."""
    configs = [
        BlendConfig(recompute_ratio=0.3, score_layers=(1,), stale_key_bias=2.0),
        BlendConfig(recompute_ratio=0.2, score_layers=(2,)),
    ]
    requests = []
    for i in range(num):
        chunks = random_chunks([15 + 7 * i, 11 + 3 * i], seed=500 + i)
        layout = engine.prompt.layout(chunks, "which one is it?" + " really" * i)
        requests.append(
            GenerationRequest(
                f"r{i}",
                layout,
                InMemoryLayerReader(engine.precompute_chunks(chunks)),
                "blend",
                configs[i % 2],
                SamplingParams(10 + i, ignore_eos=True, stop_on_repeated_line=False),
            )
        )
    return requests


def _decode_together(engine, requests: list[GenerationRequest]) -> list[list[int]]:
    """Every request's prompt pass, then decode steps of all unfinished runs together, as the scheduler does."""
    runs = [engine.new_run(r) for r in requests]
    tokens: list[list[int]] = [[] for _ in runs]
    for i, run in enumerate(runs):
        tokens[i] += [e.token_id for e in engine.run_prompt(run) if isinstance(e, TokenEvent)]
    while active := [i for i, run in enumerate(runs) if not run.finished]:
        for i, events in zip(active, engine.decode([runs[i] for i in active]), strict=True):
            tokens[i] += [e.token_id for e in events if isinstance(e, TokenEvent)]
    for run in runs:
        run.release()
    return tokens


def test_the_static_step_decodes_as_the_eager_step(tiny_engine, tiny_model_dir, tmp_path) -> None:
    """Three requests of different lengths and budgets (batches of 3, 2, 1: padded to 4, 2, 1), then three more
    in the slots the first three used (the bias bank's row of the biased one must not carry over)."""
    engine = _static_engine(tiny_model_dir, tmp_path)
    reference = _decode_together(tiny_engine, _requests(tiny_engine, 3))
    assert _decode_together(engine, _requests(engine, 3)) == reference
    later = _requests(engine, 4)[1:]  # unbiased, biased, unbiased: other slots than before
    assert _decode_together(engine, later) == _decode_together(tiny_engine, _requests(tiny_engine, 4)[1:])
    state = engine.decode_graphs._slabs[next(iter(engine.decode_graphs._slabs))]
    assert sorted(batch for _, batch in state.steps) == [1, 2, 4]
    assert engine.cache_pool.stats().num_slabs == 1


async def test_requests_through_the_scheduler_share_one_slab(tiny_engine, tiny_model_dir, tmp_path) -> None:
    """Six requests, four at a time: slots are released and taken again while the others decode."""
    from engine.scheduler import Scheduler

    engine = _static_engine(tiny_model_dir, tmp_path)
    expected = [
        [e.token_id for e in tiny_engine.generate(r) if isinstance(e, TokenEvent)] for r in _requests(tiny_engine, 6)
    ]

    async def tokens(stream) -> list[int]:
        return [e.token_id async for e in stream if isinstance(e, TokenEvent)]

    async with Scheduler(engine, max_queue=6, max_running=4) as scheduler:
        streams = [scheduler.submit(r) for r in _requests(engine, 6)]
        got = await asyncio.wait_for(asyncio.gather(*(tokens(s) for s in streams)), 120)
    assert got == expected
    stats = engine.cache_pool.stats()
    assert (stats.num_slabs, stats.unpooled) == (1, 0) and stats.idle_bytes == stats.held_bytes


def test_an_evicted_slab_takes_its_decode_state_with_it(tiny_model_dir, tmp_path) -> None:
    engine = _static_engine(tiny_model_dir, tmp_path)
    pool = engine.cache_pool
    pool.max_bytes = 5 * pool.layout.slot_bytes(512)  # one 512-token slab of 4 slots + scratch
    _decode_together(engine, _requests(engine, 2))
    assert len(engine.decode_graphs._slabs) == 1
    big = pool.acquire(600)  # the 1024 class evicts the idle 512 slab (and fits one slot + scratch)
    assert big.slot.slab.num_slots == 1
    gc.collect()
    assert len(engine.decode_graphs._slabs) == 0
    assert pool.stats().held_bytes == 4 * pool.layout.slot_bytes(512)


def _prompt_caches(engine, requests: list[GenerationRequest]) -> tuple[list[WorkingCache], list[int]]:
    caches, first = [], []
    for request in requests:
        result = engine.prompt_pass(request.layout, request.kv_reader, request.mode, request.blend, extra_capacity=8)
        caches.append(result.cache)
        first.append(int(result.logits.argmax()))
    return caches, first


def test_static_logits_match_eager_logits_and_mixed_batches_keep_their_order(tiny_model_dir, tmp_path) -> None:
    engine = _static_engine(tiny_model_dir, tmp_path)
    requests = _requests(engine, 3)
    caches, tokens = _prompt_caches(engine, requests)
    # The second request's cache outside the pool: it decodes eagerly, in its place in the batch.
    unpooled = WorkingCache.allocate(
        engine.num_layers, engine.num_kv_heads, engine.head_dim, caches[1].capacity, engine.dtype, engine.device
    )
    unpooled.k.copy_(caches[1].k)
    unpooled.v.copy_(caches[1].v)
    unpooled.length, unpooled.key_bias = caches[1].length, caches[1].key_bias
    caches[1] = unpooled
    copies = [WorkingCache(k=c.k.clone(), v=c.v.clone(), length=c.length, key_bias=c.key_bias) for c in caches]
    tf = engine.transformer
    for _ in range(5):
        logits = engine.decode_graphs.decode(tf, caches, tokens, eager=decode_batch)
        ref = decode_batch(tf, copies, tokens)
        assert logits.shape == ref.shape == (3, engine.config.vocab_size)
        torch.testing.assert_close(logits, ref, rtol=0, atol=1e-5)
        assert logits.argmax(-1).tolist() == ref.argmax(-1).tolist()
        tokens = ref.argmax(-1).tolist()
    assert [c.length for c in caches] == [c.length for c in copies]
    for got, want in zip(caches, copies, strict=True):
        torch.testing.assert_close(got.k[:, :, :, : got.length], want.k[:, :, :, : want.length], rtol=0, atol=1e-5)


def test_the_static_step_reads_nothing_back(tiny_model_dir, tmp_path) -> None:
    """What a capture needs: the step never makes the host wait for the device (engine/host_sync.py)."""
    from engine.decode_graphs import StaticDecode
    from engine.host_sync import HostSyncAudit

    engine = _static_engine(tiny_model_dir, tmp_path)
    caches, tokens = _prompt_caches(engine, _requests(engine, 3))
    slab = caches[0].slot.slab
    bank = torch.zeros(slab.k.shape[1], slab.capacity, dtype=engine.dtype)
    static = StaticDecode(engine.transformer, slab, bank, batch=4)
    static.load(step_inputs(caches, tokens, 4, slab.scratch))
    with HostSyncAudit() as audit:
        logits = static.step()
    assert audit.calls == []
    assert logits.shape == (4, engine.config.vocab_size) and logits.dtype == torch.float32


def test_a_failed_capture_falls_back_to_eager_decode_logged_once(tiny_engine, tiny_model_dir, tmp_path, caplog) -> None:
    """A step on a CPU cannot be captured (on any machine): decode goes on eagerly with the same tokens."""
    engine = _static_engine(tiny_model_dir, tmp_path, capture=True)
    with caplog.at_level(logging.WARNING, logger="engine.decode_graphs"):
        answers = _decode_together(engine, _requests(engine, 2))
    assert answers == _decode_together(tiny_engine, _requests(tiny_engine, 2))
    assert engine.decode_graphs.enabled is False
    messages = [r.getMessage() for r in caplog.records]
    assert messages == ["decode graphs off: capturing the decode step failed; eager decode"]


def test_the_engine_decodes_eagerly_on_a_cpu(tiny_engine) -> None:
    assert tiny_engine.decode_graphs is None


# ------------------------------------------------------------------------------------------------ CUDA
def _cuda_engine(tiny_model_dir: Path, models_dir: Path, decode_graphs: str):
    from engine.config import EngineSettings
    from engine.engine import Engine

    settings = EngineSettings(model=str(tiny_model_dir), device="cuda", dtype="float32", decode_graphs=decode_graphs)
    return Engine(settings, models_dir=models_dir)


@needs_cuda
@pytest.mark.parametrize("num_requests", [1, 3])
def test_graph_decode_gives_the_eager_tokens_on_cuda(tiny_model_dir, tmp_path, num_requests: int) -> None:
    graphs = _cuda_engine(tiny_model_dir, tmp_path, "auto")
    eager = _cuda_engine(tiny_model_dir, tmp_path, "off")
    assert graphs.decode_graphs is not None and eager.decode_graphs is None
    got = _decode_together(graphs, _requests(graphs, num_requests))
    assert got == _decode_together(eager, _requests(eager, num_requests))
    assert graphs.decode_graphs.enabled, "the capture failed: see the log"
    steps = [step for state in graphs.decode_graphs._slabs.values() for step in state.steps.values()]
    assert steps and all(step.graph is not None for step in steps)  # every batch class ran as a replayed graph


@needs_cuda
def test_a_replayed_graph_gives_the_static_steps_logits_on_cuda(tiny_model_dir, tmp_path) -> None:
    """The graph records the very step: its replay gives what the step run as is gives."""
    engine = _cuda_engine(tiny_model_dir, tmp_path, "auto")
    requests = _requests(engine, 3)
    caches, tokens = _prompt_caches(engine, requests)
    copies = [engine.cache_pool.acquire(c.capacity) for c in caches]
    for copy, cache in zip(copies, caches, strict=True):
        copy.k.copy_(cache.k)
        copy.v.copy_(cache.v)
        copy.length, copy.key_bias = cache.length, cache.key_bias
    tf = engine.transformer
    replayed = DecodeGraphs(capture=True)
    as_is = DecodeGraphs(capture=False)
    for _ in range(4):
        got = replayed.decode(tf, caches, tokens, eager=decode_batch)
        want = as_is.decode(tf, copies, tokens, eager=decode_batch)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
        assert got.argmax(-1).tolist() == want.argmax(-1).tolist()
        tokens = want.argmax(-1).tolist()
    assert replayed.enabled
