"""scripts/decode_rate.py (the device check's decode figure): clients decode together through the scheduler, and
the window holds every client's tokens between the last one's first token and the first one's last."""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "decode_rate.py"


@pytest.fixture(scope="module")
def decode_rate():
    spec = importlib.util.spec_from_file_location("decode_rate", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_aggregate_rate_of_one_and_three_clients(decode_rate, tiny_llama_dir: Path, tmp_path: Path) -> None:
    from bench.decode_rate import answer_cap
    from engine.config import EngineSettings
    from engine.engine import Engine

    engine = Engine(EngineSettings(model=str(tiny_llama_dir), dtype="float32"), models_dir=tmp_path)
    for clients in (1, 3):
        run = asyncio.run(decode_rate.aggregate_rate(engine, clients, 6))
        cap = answer_cap(6, clients, engine.transformer.cfg.num_layers)
        assert (run["clients"], run["tokens_per_client"]) == (clients, cap)
        assert run["window_s"] > 0 and run["tokens_per_s"] > 0
        # every client decodes inside the window: at least the window's tokens each, at most its cap
        assert clients * 6 <= run["tokens_in_window"] <= clients * cap
