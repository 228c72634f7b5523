"""`python -m bench random-model`: the device check's random-weight checkpoints load in the engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.random_model import SHAPES, shape_config, write_random_model


def test_shapes_are_the_real_models() -> None:
    # Parameter counts of the real models (embedding included): 0.49B, 7.6B, 7.2B with its own 32k vocab.
    def params(c: dict) -> int:
        h, i, n, kv = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"], c["num_key_value_heads"]
        d = h // c["num_attention_heads"]
        layer = h * h * 2 + 2 * h * kv * d + 3 * h * i
        return n * layer + c["vocab_size"] * h * (1 if c["tie_word_embeddings"] else 2)

    assert round(params(SHAPES["qwen2.5-0.5b"]) / 1e9, 2) == 0.49
    assert round(params(SHAPES["qwen2.5-7b"]) / 1e9, 1) == 7.6
    assert round(params({**SHAPES["mistral-7b"], "vocab_size": 32000}) / 1e9, 1) == 7.2
    assert shape_config("qwen2.5-0.5b", vocab_size=151665)["vocab_size"] == 151936  # never smaller
    assert shape_config("mistral-7b", vocab_size=160000)["vocab_size"] == 160000


@pytest.mark.slow
def test_a_written_checkpoint_runs_in_the_engine(tmp_path: Path, tiny_llama_dir: Path) -> None:
    """The 0.5B shape with the test tokenizer: the engine loads it and blend at ratio 1 equals full prefill."""
    import torch

    from engine.config import EngineSettings
    from engine.engine import Engine
    from engine.types import BlendConfig
    from kvcache.types import InMemoryLayerReader

    out = write_random_model("qwen2.5-0.5b", tmp_path / "m", tiny_llama_dir, device="cpu")
    engine = Engine(EngineSettings(model=str(out), device="cpu", dtype="float32"), models_dir=tmp_path / "models")
    assert engine.transformer.cfg.num_layers == 24 and engine.transformer.cfg.num_kv_heads == 2
    chunks = [[5, 6, 7, 8, 9] * 4, [10, 11, 12] * 5]
    layout = engine.prompt.layout(chunks, "what is it?")
    stored = engine.precompute_chunks(chunks)
    full = engine.prompt_pass(layout, None, "full")
    blend = engine.prompt_pass(
        layout, InMemoryLayerReader(stored), "blend", BlendConfig(recompute_ratio=1.0, score_layers=(4,))
    )
    torch.testing.assert_close(blend.logits, full.logits, atol=1e-4, rtol=0)
