"""The calibration set's private KV store: memory only, whatever tiers the server's KV settings name."""

from __future__ import annotations

from pathlib import Path

from app.calibration.measure import CalibrationSet
from kvcache.config import KVCacheSettings


def test_the_private_store_has_no_disk_or_redis_tier_of_the_server(fast_engine, tmp_path: Path) -> None:
    # A scaled-out server's settings name the shared Redis tier: calibration must not write its entries there
    # (the copy once cleared a field that does not exist, `remote_url`, and kept `redis_url`).
    served = KVCacheSettings(dir=tmp_path / "kv", redis_url="redis://127.0.0.1:9/0", storage_dtype="int8")
    calset = CalibrationSet(fast_engine, [], served)
    store = calset.kv.store
    assert (store.disk, store.redis, store.memory is not None) == (None, None, True)
    assert [t.name for t in store.stats().tiers] == ["memory"]
    assert (calset.storage_dtype, store.settings.memory_bytes) == ("int8", 1 << 40)
    assert (calset.kv.model_fingerprint, calset.kv.prefix_ids) == (
        fast_engine.fingerprint,
        tuple(fast_engine.prompt.prefix_ids),
    )
    assert not (tmp_path / "kv").exists()
