"""`engine.chunk_lead_in` (off by default): every prompt's context opens with a fixed lead-in that is part of the
prefix, so stored chunk KV is computed behind it, the first chunk's KV stays exact where it stands, and the store
keys it apart from KV computed without it."""

from __future__ import annotations

import pytest
import torch
from enginetest_tiny import random_chunks

from engine.blend.plan import exact_first_segment
from engine.prompt import LEAD_IN
from kvcache.config import KVCacheSettings
from kvcache.space import KVSpace
from kvcache.store import TieredKVStore
from kvcache.types import InMemoryLayerReader

ATOL = 1e-4


@pytest.fixture(scope="module")
def lead_in_engine(tiny_model_dir, tmp_path_factory):
    from engine.config import EngineSettings
    from engine.engine import Engine

    settings = EngineSettings(model=str(tiny_model_dir), device="cpu", dtype="float32", chunk_lead_in=True)
    return Engine(settings, models_dir=tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="module")
def plain_engine(tiny_engine):
    assert not tiny_engine.settings.chunk_lead_in  # the default
    return tiny_engine


@pytest.fixture(scope="module")
def chunks() -> list[list[int]]:
    return random_chunks([23, 40, 17], seed=7)


def test_the_prefix_ends_with_the_lead_in(lead_in_engine, plain_engine) -> None:
    lead_in_ids = lead_in_engine.tokenizer.encode(LEAD_IN, add_special_tokens=False)
    assert lead_in_engine.prompt.prefix_ids == [*plain_engine.prompt.prefix_ids, *lead_in_ids]
    # a client's own system prompt opens its context with the same lead-in
    client = lead_in_engine.prompt.for_system_prompt("Answer in French.")
    assert client.prefix_ids[-len(lead_in_ids) :] == lead_in_ids
    assert (
        plain_engine.prompt.for_system_prompt("Answer in French.").prefix_ids == client.prefix_ids[: -len(lead_in_ids)]
    )


def test_chunks_are_computed_behind_it_and_the_first_stays_exact(lead_in_engine, plain_engine, chunks) -> None:
    layout = lead_in_engine.prompt.layout(chunks, "who jumps over the lazy dog?")
    assert layout.segments_behind_prefix and exact_first_segment(layout) == len(chunks[0])
    kvs = lead_in_engine.precompute_chunks(chunks)
    plain = plain_engine.precompute_chunks(chunks)
    assert not torch.allclose(kvs[0].k[1:], plain[0].k[1:], atol=1e-3)  # layer 0's K is the token's alone
    full = lead_in_engine.prompt_pass(layout, None, "full").logits
    torch.testing.assert_close(lead_in_engine.prompt_pass(layout, InMemoryLayerReader(kvs), "prefix").logits, full)
    one = lead_in_engine.prompt.layout(chunks[:1], "who?")
    reused = lead_in_engine.prompt_pass(one, InMemoryLayerReader(kvs[:1]), "reuse").logits
    torch.testing.assert_close(reused, lead_in_engine.prompt_pass(one, None, "full").logits, atol=ATOL, rtol=0)


def test_the_store_keys_kv_with_and_without_it_apart(lead_in_engine, plain_engine, chunks) -> None:
    store = TieredKVStore(KVCacheSettings(dir=None, memory_bytes=64 * 1024 * 1024, device_bytes=0))
    assert lead_in_engine.fingerprint == plain_engine.fingerprint
    # A switch of the setting makes every stored chunk's KV stale (coverage, KV refresh), never read as the other.
    assert KVSpace.of_engine(store, lead_in_engine).key(chunks[0]) != KVSpace.of_engine(store, plain_engine).key(
        chunks[0]
    )
