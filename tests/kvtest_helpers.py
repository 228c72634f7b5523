"""Helpers for the kvcache tests: small random entries and a real redis-server (see conftest.py)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import redis
import torch
from redis.backoff import NoBackoff
from redis.retry import Retry

from kvcache.config import KVCacheSettings
from kvcache.keys import chunk_key
from kvcache.types import ChunkKV

NUM_LAYERS, KV_HEADS, NUM_TOKENS, HEAD_DIM = 4, 2, 16, 8
FINGERPRINT = "test-model@0123abcd"
PREFIX_IDS = [1, 2, 3]
# bytes of one (4, 2, 16, 8) entry's K+V in fp16 / bf16 (what the memory tier accounts)
ENTRY_TENSOR_BYTES = 2 * NUM_LAYERS * KV_HEADS * NUM_TOKENS * HEAD_DIM * 2


def make_kv(
    seed: int,
    *,
    num_tokens: int = NUM_TOKENS,
    dtype: torch.dtype = torch.float16,
    num_layers: int = NUM_LAYERS,
    kv_heads: int = KV_HEADS,
    head_dim: int = HEAD_DIM,
) -> ChunkKV:
    g = torch.Generator().manual_seed(seed)
    shape = (num_layers, kv_heads, num_tokens, head_dim)
    return ChunkKV(k=torch.randn(shape, generator=g).to(dtype), v=torch.randn(shape, generator=g).to(dtype))


def key_of(i: int) -> str:
    return chunk_key(FINGERPRINT, PREFIX_IDS, [100 + i, 7, 8])


def settings(tmp_path: Path | None, **overrides: object) -> KVCacheSettings:
    # fp16 unless a test says otherwise: tier tests compare stored tensors bit for bit
    base: dict[str, object] = {
        "dir": None if tmp_path is None else tmp_path / "kv",
        "fsync": False,
        "storage_dtype": "fp16",
    }
    base.update(overrides)
    return KVCacheSettings(**base)  # type: ignore[arg-type]


def entry_files(root: Path) -> list[Path]:
    """Every file under root (entries and temp files), sorted."""
    return sorted(p for p in root.rglob("*") if p.is_file())


# -- a real redis-server ------------------------------------------------------------------------------

_DEBIAN_REDIS = "/usr/bin/redis-server"
REDIS_BIN = shutil.which("redis-server") or (_DEBIAN_REDIS if os.path.exists(_DEBIAN_REDIS) else None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class RedisServer:
    port: int
    workdir: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        assert REDIS_BIN is not None
        self.proc = subprocess.Popen(
            [
                REDIS_BIN,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.workdir),
                "--enable-debug-command",
                "yes",
                "--loglevel",
                "warning",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2)
        deadline = time.monotonic() + 10
        while True:
            try:
                if client.ping():
                    break
            except redis.exceptions.ConnectionError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError("redis-server did not start") from None
                time.sleep(0.02)
        client.close()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)
        self.proc = None

    def client(self) -> redis.Redis:
        """A plain client for the test's own checks; it fails at once instead of retrying."""
        return redis.Redis(host="127.0.0.1", port=self.port, retry=Retry(NoBackoff(), 0))
