"""No host round trip inside a prompt pass on a device (engine/host_sync.py).

On a CPU the audit (`HostSyncAudit`) finds every call that would read a device value back; the device path
(`Transformer.sync_free`) must make none in every mode and give the same results as the CPU path. Where CUDA
is present the same passes run under `torch.cuda.set_sync_debug_mode("error")`, which also catches the
host-to-device copies a CPU cannot see.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch
from enginetest_tiny import random_chunks

from engine.host_sync import HostSyncAudit
from engine.prompt import Turn
from engine.types import BlendConfig, Mode
from kvcache.types import ChunkKV, InMemoryLayerReader

ATOL = 1e-5

# Every mode, and the blend's selectors and selection rules (sinks, per-chunk minimums, the history's budget,
# pooling, the stale-key bias, the deviation selector's gradual filtering).
CASES: list[tuple[str, Mode, BlendConfig]] = [
    ("full", "full", BlendConfig()),
    ("prefix", "prefix", BlendConfig()),
    ("reuse", "reuse", BlendConfig()),
    ("query", "blend", BlendConfig(recompute_ratio=0.15, score_layers=(1, 2))),
    (
        "query-max-output",
        "blend",
        BlendConfig(recompute_ratio=0.2, score_layers=(1, 3), score_fuse="max", score_by="output"),
    ),
    (
        "query-rules",
        "blend",
        BlendConfig(
            recompute_ratio=0.2, score_layers=(2,), sink_tokens=2, min_per_chunk=3, pool_window=3, history_ratio=0.5
        ),
    ),
    ("query-bias", "blend", BlendConfig(recompute_ratio=0.15, score_layers=(1,), stale_key_bias=0.5)),
    ("first_k", "blend", BlendConfig(recompute_ratio=0.2, selector="first_k", sink_tokens=1)),
    ("random", "blend", BlendConfig(recompute_ratio=0.2, selector="random")),
    (
        "deviation",
        "blend",
        BlendConfig(recompute_ratio=0.3, selector="deviation", check_layers=(1, 2), ratio_schedule=(0.5, 0.3)),
    ),
    ("ratio-1", "blend", BlendConfig(recompute_ratio=1.0, score_layers=(1,))),
]


@pytest.fixture(scope="module")
def case_data(tiny_engine):
    chunks = random_chunks([37, 22, 41, 5], seed=11)
    history = [tiny_engine.prompt.turn_ids(Turn("which gate?", "the north gate, code 4471."))]
    layout = tiny_engine.prompt.layout(chunks, "what is the code of the north gate?", history)
    stored = tiny_engine.precompute_chunks([*chunks, *history])
    return layout, stored


@contextmanager
def _sync_free(tiny_engine, on: bool) -> Iterator[None]:
    tf = tiny_engine.transformer
    before, tf.sync_free = tf.sync_free, on
    try:
        yield
    finally:
        tf.sync_free = before


def _run(engine, layout, stored, mode: Mode, config: BlendConfig):
    return engine.prompt_pass(layout, InMemoryLayerReader(stored), mode, config)


@pytest.mark.parametrize(("name", "mode", "config"), CASES, ids=[c[0] for c in CASES])
def test_device_path_reads_nothing_back_and_matches_the_cpu_path(tiny_engine, case_data, name, mode, config) -> None:
    layout, stored = case_data
    reference = _run(tiny_engine, layout, stored, mode, config)  # also computes the prefix KV once
    with _sync_free(tiny_engine, True), HostSyncAudit() as audit:
        result = _run(tiny_engine, layout, stored, mode, config)
    assert audit.calls == []
    assert result.num_recomputed_tokens == reference.num_recomputed_tokens
    assert result.selected_positions.tolist() == reference.selected_positions.tolist()
    torch.testing.assert_close(result.logits, reference.logits, atol=ATOL, rtol=0)


def test_the_cpu_path_does_read_back(tiny_engine, case_data) -> None:
    """The audit finds what it is for: the CPU path cuts attention blocks at positions it reads back."""
    layout, stored = case_data
    with HostSyncAudit() as audit:
        _run(tiny_engine, layout, stored, "blend", BlendConfig(recompute_ratio=0.15, score_layers=(1,)))
    assert "__int__" in audit.calls


def test_audit_flags_each_kind_of_read() -> None:
    x = torch.arange(6)
    with HostSyncAudit() as audit:
        x.sum().item()
        x.tolist()
        x.nonzero()
        _ = x[x > 2]
        int(x[0])
        torch.repeat_interleave(torch.arange(2), torch.tensor([1, 2]))
        torch.repeat_interleave(torch.arange(2), torch.tensor([1, 2]), output_size=3)  # not a read
        _ = x[torch.tensor([0, 2])]  # an integer index is a gather, not a read
    assert audit.calls == ["item", "tolist", "nonzero", "__getitem__", "__int__", "repeat_interleave"]
    with pytest.raises(RuntimeError, match="host sync inside a sync-free region: item"), HostSyncAudit(error=True):
        x.sum().item()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (scripts/device-check.sh runs it)")
@pytest.mark.parametrize(("name", "mode", "config"), CASES, ids=[c[0] for c in CASES])
def test_no_sync_in_any_prompt_pass_on_cuda(tiny_model_dir, tmp_path, name, mode, config) -> None:
    from engine.config import EngineSettings
    from engine.engine import Engine

    engine = Engine(EngineSettings(model=str(tiny_model_dir), device="cuda", dtype="float32"), models_dir=tmp_path)
    chunks = random_chunks([37, 22, 41, 5], seed=11)
    history = [engine.prompt.turn_ids(Turn("which gate?", "the north gate, code 4471."))]
    layout = engine.prompt.layout(chunks, "what is the code of the north gate?", history)
    # the chunks' KV resident on the device, as the device tier holds it
    stored = [ChunkKV(k=kv.k.cuda(), v=kv.v.cuda()) for kv in engine.precompute_chunks([*chunks, *history])]
    engine.prompt_pass(layout, InMemoryLayerReader(stored), mode, config)  # warm: the prefix KV, the allocators
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        engine.prompt_pass(layout, InMemoryLayerReader(stored), mode, config)
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (scripts/device-check.sh runs it)")
@pytest.mark.parametrize("storage", ["int4", "bf16"])
def test_no_sync_in_a_blend_over_the_store_on_cuda(tiny_model_dir, tmp_path, storage: str) -> None:
    """Stored chunks cross the bus through the staging path (pinned pool, side stream, events) with no sync."""
    from engine.config import EngineSettings
    from engine.engine import Engine
    from kvcache.config import KVCacheSettings
    from kvcache.space import KVSpace
    from kvcache.store import TieredKVStore

    engine = Engine(EngineSettings(model=str(tiny_model_dir), device="cuda", dtype="float32"), models_dir=tmp_path)
    chunks = random_chunks([37, 22, 41, 5], seed=11)
    layout = engine.prompt.layout(chunks, "what is the code of the north gate?")
    store = TieredKVStore(KVCacheSettings(dir=None, storage_dtype=storage, device_bytes=0))
    space = KVSpace.of_engine(store, engine)
    keys = [space.key(c) for c in chunks]
    for key, kv in zip(keys, engine.precompute_chunks(chunks), strict=True):
        store.put(key, kv, model_fingerprint=engine.fingerprint)
    config = BlendConfig(recompute_ratio=0.15, score_layers=(1, 2))
    with store.open_layers(keys, engine.device, engine.dtype) as source:  # warm: prefix KV, pool, allocators
        engine.prompt_pass(layout, source, "blend", config)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with store.open_layers(keys, engine.device, engine.dtype) as source:
            engine.prompt_pass(layout, source, "blend", config)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert store.staging_pool(engine.device).num_allocated == 2
