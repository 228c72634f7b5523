"""Fast fixtures for unit tests of the app services: no SmolLM2, no MiniLM.

Like private-gpt's mock profile, the services run on stand-ins that are tiny, deterministic and exact:
a 4-layer random Llama with a byte-level BPE tokenizer trained in the test session (enginetest_tiny),
and a hash embedder (bag of words hashed into a small vector). The engine and embedder are built once
per session; every test gets its own data dir, catalog, KV store and index around them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from enginetest_tiny import build_model
from hash_embedder import HashEmbedder

from app.build import Services
from app.settings import Settings


@pytest.fixture(scope="session")
def fast_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_model(tmp_path_factory.mktemp("fast-llama"), "llama")


@pytest.fixture(scope="session")
def fast_engine(fast_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    from engine.config import EngineSettings
    from engine.engine import Engine

    return Engine(
        EngineSettings(model=str(fast_model_dir), device="cpu", dtype="float32"),
        models_dir=tmp_path_factory.mktemp("fast-models"),
    )


@pytest.fixture
def make_fast_settings(tmp_path: Path, fast_model_dir: Path) -> Callable[..., Settings]:
    """Settings on a fresh data dir (tmp_path/data unless given); sections override fields."""
    from app.settings import load_settings

    def make(data_dir: Path | None = None, **sections: dict[str, Any]) -> Settings:
        engine = {"model": str(fast_model_dir), "device": "cpu", "dtype": "float32", "max_new_tokens": 8}
        return load_settings(
            data_dir=data_dir or tmp_path / "data",
            engine=engine | sections.pop("engine", {}),
            kvcache={"memory_bytes": 64 * 1024 * 1024} | sections.pop("kvcache", {}),
            retrieval={"embedder": HashEmbedder.name} | sections.pop("retrieval", {}),
            **sections,
        )

    return make


# What the service tests use: every service of a command-line process (the server's minus its job queue).
FAST_NEEDS = ("keys", "conversations", "documents", "coverage", "ingest", "ask", "doctor")


@pytest.fixture
def make_fast_services(fast_engine) -> Iterator[Callable[[Settings], Services]]:
    """`build_services` on the given settings around the session's engine and a hash embedder; closed at the
    end. Its scheduler is not started (chunk KV is computed in the caller's thread)."""
    from app.build import build_services

    built: list[Services] = []

    def make(settings: Settings) -> Services:
        assert settings.engine.model == fast_engine.settings.model
        services = build_services(settings, FAST_NEEDS, engine=fast_engine, embedder=HashEmbedder())  # type: ignore[arg-type]
        built.append(services)
        return services

    yield make
    for services in built:
        services.close()


@pytest.fixture
def fast_settings(make_fast_settings) -> Settings:
    return make_fast_settings()


@pytest.fixture
def fast_services(make_fast_services, fast_settings: Settings) -> Services:
    return make_fast_services(fast_settings)


SMALL_FS_BYTES = 48 * 1024 * 1024


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A real 48 MiB tmpfs (root only: skipped otherwise), unmounted at the end; fill it with disk_tools."""
    import os
    import subprocess

    mount_point = tmp_path / "fs"
    mount_point.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root (make test runs as root in CI)")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={SMALL_FS_BYTES}", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)
