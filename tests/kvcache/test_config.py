from pathlib import Path

import pytest
from pydantic import ValidationError

from kvcache.config import KVCacheSettings, MiB


def test_defaults() -> None:
    s = KVCacheSettings()
    assert (s.dir, s.storage_dtype, s.memory_bytes, s.disk_bytes) == (None, "int4", 512 * MiB, None)
    assert (s.disk_free_share, s.eviction, s.int4_k_group, s.int4_v_group) == (0.5, "frequency", 128, 192)
    assert s.redis_url is None and s.prefetch is True and s.verify_checksums is True


@pytest.mark.parametrize(
    "bad",
    [
        {"memory_bytes": -1},
        {"disk_bytes": 0},
        {"storage_dtype": "fp32"},
        {"disk_free_share": 0},
        {"disk_free_share": 1.5},
        {"eviction": "random"},
        {"int4_v_group": 1},
        {"redis_url": "http://localhost:6379"},
        {"redis_ttl_s": 0},
        {"redis_timeout_s": 0},
        {"redis_max_entry_bytes": 1024**3},
        {"no_such_field": 1},
    ],
)
def test_invalid_settings_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        KVCacheSettings(**bad)  # type: ignore[arg-type]


def test_valid_overrides(tmp_path: Path) -> None:
    s = KVCacheSettings(dir=tmp_path, storage_dtype="int8", memory_bytes=0, redis_url="redis://h:1/2", redis_ttl_s=None)
    assert s.dir == tmp_path and s.memory_bytes == 0 and s.redis_ttl_s is None
    assert KVCacheSettings(redis_url="").redis_url is None
