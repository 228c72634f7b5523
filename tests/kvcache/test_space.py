"""KVSpace: one key function for a model behind a prefix, and the writer and the loader under its keys."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from kvtest_helpers import FINGERPRINT, PREFIX_IDS, make_kv, settings

from kvcache.keys import chunk_key
from kvcache.space import KVSpace
from kvcache.store import TieredKVStore
from kvcache.types import ChunkKV

CHUNKS = [[100 + i, 7, 8] for i in range(3)]


def _compute(chunks: list[list[int]]) -> list[ChunkKV]:
    return [make_kv(ids[0]) for ids in chunks]


@dataclass(frozen=True)
class _Prompt:
    prefix_ids: list[int]


@dataclass(frozen=True)
class _Engine:
    fingerprint: str
    prompt: _Prompt


def test_keys_are_the_chunk_keys_of_the_model_and_prefix(tmp_path: Path) -> None:
    space = KVSpace.of_engine(TieredKVStore(settings(tmp_path)), _Engine(FINGERPRINT, _Prompt(PREFIX_IDS)))
    assert (space.model_fingerprint, space.prefix_ids) == (FINGERPRINT, tuple(PREFIX_IDS))
    assert space.key(CHUNKS[0]) == chunk_key(FINGERPRINT, PREFIX_IDS, CHUNKS[0])
    assert KVSpace(space.store, FINGERPRINT, [1, 2]).key(CHUNKS[0]) != space.key(CHUNKS[0])


def test_ensure_writes_under_the_space_keys_and_open_serves_them(tmp_path: Path) -> None:
    space = KVSpace(TieredKVStore(settings(tmp_path)), FINGERPRINT, PREFIX_IDS)
    written = space.ensure(CHUNKS, compute=_compute)
    assert written.keys == [space.key(ids) for ids in CHUNKS]
    assert (written.num_present, written.num_computed) == (0, 3)
    with space.open(written.keys) as source:
        k, v = source.layer(1)
    assert torch.equal(k, torch.cat([make_kv(ids[0]).k[1] for ids in CHUNKS], dim=1))
    assert torch.equal(v, torch.cat([make_kv(ids[0]).v[1] for ids in CHUNKS], dim=1))


def test_keys_the_caller_already_has_are_used_as_given(tmp_path: Path) -> None:
    space = KVSpace(TieredKVStore(settings(tmp_path)), FINGERPRINT, PREFIX_IDS)
    keys = [space.key(ids) for ids in CHUNKS]
    written = space.ensure(CHUNKS, compute=_compute, keys=keys)
    assert written.keys == keys and written.num_computed == 3
    with pytest.raises(ValueError, match="2 keys for 3 chunks"):
        space.ensure(CHUNKS, compute=_compute, keys=keys[:2])


def test_a_space_needs_a_fingerprint(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="fingerprint"):
        KVSpace(TieredKVStore(settings(tmp_path)), "", PREFIX_IDS)
