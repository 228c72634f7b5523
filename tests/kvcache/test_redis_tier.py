from pathlib import Path

import pytest
import torch
from kvtest_helpers import FINGERPRINT, NUM_LAYERS, RedisServer, key_of, make_kv, settings

from kvcache.format import encode_entry, serialize_entry
from kvcache.redis_tier import RedisTier
from kvcache.store import TieredKVStore

pytestmark = pytest.mark.redis


def _data(i: int) -> bytes:
    return serialize_entry(encode_entry(make_kv(i), key=key_of(i), model_fingerprint=FINGERPRINT, storage_dtype="fp16"))


def test_bytes_round_trip_ttl_and_listing(redis_server: RedisServer) -> None:
    tier = RedisTier(redis_server.url, key_prefix="t:kv:", ttl_s=600)
    raw = redis_server.client()
    d0, d1 = _data(0), _data(1)
    assert tier.put_bytes(key_of(0), d0) and tier.put_bytes(key_of(1), d1)
    assert raw.get("t:kv:" + key_of(0)) == d0
    assert 590 <= raw.ttl("t:kv:" + key_of(0)) <= 600
    raw.expire("t:kv:" + key_of(0), 5)
    assert tier.get_bytes(key_of(0)) == d0
    assert raw.ttl("t:kv:" + key_of(0)) > 5  # a hit refreshes the TTL
    assert tier.get_many_bytes([key_of(1), key_of(2), key_of(0)]) == {key_of(1): d1, key_of(0): d0}
    assert tier.nbytes_many([key_of(0), key_of(2)]) == {key_of(0): len(d0)}
    assert tier.contains(key_of(1)) and not tier.contains(key_of(2))
    raw.set("t:kv:not-a-key", b"x")
    raw.set("other:" + key_of(5), b"x")
    assert tier.keys() == sorted([key_of(0), key_of(1)])
    assert tier.delete(key_of(1)) and not tier.delete(key_of(1))
    st = tier.stats()
    assert (st.name, st.available, st.num_entries, st.num_bytes) == ("redis", True, 1, len(d0))
    assert (st.num_hits, st.num_misses, st.num_faults) == (3, 1, 0)
    tier.close()


def test_no_ttl_and_no_overwrite(redis_server: RedisServer) -> None:
    tier = RedisTier(redis_server.url, ttl_s=None)
    raw = redis_server.client()
    assert tier.put_bytes(key_of(0), b"first")
    assert raw.ttl("blendrag:kv:" + key_of(0)) == -1
    assert tier.put_bytes(key_of(0), b"second")  # already there: kept (content-addressed)
    assert raw.get("blendrag:kv:" + key_of(0)) == b"first"
    assert tier.put_bytes(key_of(0), b"third", overwrite=True)
    assert raw.get("blendrag:kv:" + key_of(0)) == b"third"


def test_oversized_entry_is_rejected(redis_server: RedisServer) -> None:
    tier = RedisTier(redis_server.url, max_entry_bytes=100)
    assert not tier.put_bytes(key_of(0), _data(0))
    assert tier.stats().num_rejected == 1 and not tier.contains(key_of(0))


def test_store_over_redis_only(redis_server: RedisServer) -> None:
    store = TieredKVStore(settings(None, memory_bytes=0, redis_url=redis_server.url))
    assert store.tier_names == ("redis",)
    kv = make_kv(4)
    assert store.put(key_of(4), kv, model_fingerprint=FINGERPRINT).stored_in == ("redis",)
    got = store.get(key_of(4))
    assert got is not None and torch.equal(got.k, kv.k) and torch.equal(got.v, kv.v)
    assert store.contains(key_of(4)) == "redis"
    with store.open_layers([key_of(4)]) as src:
        assert src.tiers == ["redis"]
        assert torch.equal(src.layer(NUM_LAYERS - 1)[1], kv.v[-1])


def test_redis_hit_is_promoted_to_disk_and_memory(tmp_path: Path, redis_server: RedisServer) -> None:
    # replica A wrote the entry; replica B (its own memory and disk) reads it from Redis
    a = TieredKVStore(settings(tmp_path / "a", redis_url=redis_server.url))
    a.put(key_of(0), make_kv(0), model_fingerprint=FINGERPRINT)
    a.put(key_of(1), make_kv(1), model_fingerprint=FINGERPRINT)
    b = TieredKVStore(settings(tmp_path / "b", redis_url=redis_server.url))
    assert b.contains(key_of(0)) == "redis"
    got = b.get(key_of(0))
    assert got is not None and torch.equal(got.k, make_kv(0).k)
    assert b.locate_many([key_of(0)])[key_of(0)].tiers == ("memory", "disk", "redis")
    with b.open_layers([key_of(1)], prefetch=True) as src:
        assert src.tiers == ["redis"]
        for layer in range(NUM_LAYERS):
            src.layer(layer)
    assert b.locate_many([key_of(1)])[key_of(1)].tiers == ("memory", "disk", "redis")
    assert b.disk is not None and b.disk.get(key_of(1)) is not None
    assert b.delete(key_of(1))
    assert a.contains(key_of(1)) == "memory"  # a's local copies are a's; Redis copy is gone
    assert not a.redis.contains(key_of(1))  # type: ignore[union-attr]
