"""Tiny random checkpoints built once per session (seconds), plus engines over them."""

from __future__ import annotations

from pathlib import Path

import pytest
from enginetest_tiny import build_model


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """4-layer Llama with GQA (4 query heads, 2 KV heads) and a byte-level BPE tokenizer."""
    return build_model(tmp_path_factory.mktemp("tiny-llama"), "llama")


@pytest.fixture(scope="session")
def tiny_engine(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    from engine.config import EngineSettings
    from engine.engine import Engine

    settings = EngineSettings(model=str(tiny_model_dir), device="cpu", dtype="float32")
    return Engine(settings, models_dir=tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="session")
def smollm2_engine(smollm2_dir: Path):
    from engine.config import EngineSettings
    from engine.engine import Engine

    return Engine(EngineSettings(model=str(smollm2_dir), device="cpu", dtype="float32"), models_dir=smollm2_dir.parent)
