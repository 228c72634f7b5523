"""Qwen3 (dense): Qwen2's layer with an RMSNorm over each head's queries and keys before RoPE, no q/k/v
bias and a head_dim of its own (here 24, while hidden / heads is 16). Checked against transformers' forward
from a Hugging Face dir and from a GGUF file, and blend at ratio 1 against full prefill on it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import gguf
import pytest
import torch
from enginetest_tiny import assert_blend_at_ratio_one_is_full, build_model, engine_logits, hf_logits, random_chunks
from gguf_writer import write_gguf

from engine.config import EngineSettings
from engine.engine import Engine
from engine.model import ModelLoadError, load_model
from engine.models.convert import GGUF_ARCHITECTURES, GGUF_MODEL_TYPES, ConversionError, convert_gguf
from engine.models.resolve import resolve_model
from engine.types import BlendConfig

HEAD_DIM = 24
ATOL = 1e-4  # the target is 1e-3; float32 on the CPU holds to this


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_model(tmp_path_factory.mktemp("qwen3"), "qwen3", seed=5, head_dim=HEAD_DIM)


@pytest.fixture(scope="module")
def qwen3_engine(qwen3_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Engine:
    settings = EngineSettings(model=str(qwen3_dir), device="cpu", dtype="float32")
    return Engine(settings, models_dir=tmp_path_factory.mktemp("models"))


def test_the_checkpoint_loads_with_qk_norms_no_bias_and_its_own_head_dim(qwen3_dir: Path) -> None:
    model = load_model(qwen3_dir, "float32", "cpu")
    cfg = model.config
    assert (cfg.model_type, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == ("qwen3", 64, 4, 2, 24)
    assert (cfg.q_size, cfg.kv_size) == (96, 48)
    layer = model.weights.layers[0]
    assert layer.q_norm is not None and layer.q_norm.shape == (HEAD_DIM,)
    assert layer.k_norm is not None and layer.k_norm.shape == (HEAD_DIM,)
    assert layer.bqkv is None and layer.bo is None
    assert layer.wqkv.shape == (96 + 2 * 48, 64) and layer.wo.shape == (64, 96)


def test_logits_match_transformers(qwen3_dir: Path) -> None:
    ids = random_chunks([120], seed=3)[0]
    ours, ref = engine_logits(qwen3_dir, ids), hf_logits(qwen3_dir, ids)
    torch.testing.assert_close(ours[0], ref[0], atol=ATOL, rtol=0)  # the first token's
    torch.testing.assert_close(ours, ref, atol=ATOL, rtol=0)  # and every later one's


def test_without_the_qk_norms_the_logits_differ(qwen3_dir: Path, tmp_path: Path) -> None:
    """The norms are what make it Qwen3: the same weights read as Qwen2 (no norms) answer otherwise."""
    as_qwen2 = tmp_path / "as-qwen2"
    shutil.copytree(qwen3_dir, as_qwen2)
    config = json.loads((as_qwen2 / "config.json").read_text())
    (as_qwen2 / "config.json").write_text(json.dumps(config | {"model_type": "qwen2"}))
    ids = random_chunks([30], seed=4)[0]
    assert (engine_logits(as_qwen2, ids) - engine_logits(qwen3_dir, ids)).abs().max() > 0.1


@pytest.mark.parametrize("sync_free", [False, True], ids=["cpu-path", "device-path"])
@pytest.mark.parametrize(
    "cfg",
    [
        BlendConfig(recompute_ratio=1.0, selector="query"),
        BlendConfig(recompute_ratio=1.0, selector="deviation", check_layers=(1,)),
    ],
    ids=["query", "deviation"],
)
def test_blend_ratio_one_equals_full_prefill(qwen3_engine: Engine, cfg: BlendConfig, sync_free: bool) -> None:
    assert_blend_at_ratio_one_is_full(qwen3_engine, cfg, sync_free, ATOL)


def test_a_qwen3_gguf_converts_to_the_same_model(qwen3_dir: Path, tmp_path: Path) -> None:
    gguf_file = write_gguf(qwen3_dir, tmp_path / "downloads" / "tiny-qwen3.F32.gguf")
    resolved = resolve_model(str(gguf_file), tmp_path / "models")
    assert (resolved.identity.source, resolved.identity.architecture) == ("gguf", "qwen3")
    config = json.loads((resolved.path / "config.json").read_text())
    assert (config["model_type"], config["head_dim"]) == ("qwen3", HEAD_DIM)  # kept, not Qwen3's default 128
    ids = random_chunks([60], seed=6)[0]
    torch.testing.assert_close(engine_logits(resolved.path, ids), hf_logits(qwen3_dir, ids), atol=ATOL, rtol=0)
    from transformers import AutoTokenizer

    text = "The quick brown fox: café 東京"
    original, converted = AutoTokenizer.from_pretrained(qwen3_dir), AutoTokenizer.from_pretrained(resolved.path)
    assert converted(text)["input_ids"] == original(text)["input_ids"]
    messages = [{"role": "user", "content": "who jumps?"}]
    assert converted.apply_chat_template(messages, tokenize=False) == original.apply_chat_template(
        messages, tokenize=False
    )


def test_an_unknown_architecture_is_named_with_the_supported_ones(qwen3_dir: Path, tmp_path: Path) -> None:
    other = tmp_path / "olmo2"
    shutil.copytree(qwen3_dir, other)
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps(config | {"model_type": "olmo2"}))
    with pytest.raises(ModelLoadError) as err:
        load_model(other, "float32", "cpu")
    assert str(err.value) == (
        f"{other}: architecture (model_type) 'olmo2' is not supported; the engine computes llama, mistral, qwen2, "
        "qwen3, gemma3_text"
    )
    phi = tmp_path / "phi3.gguf"
    writer = gguf.GGUFWriter(str(phi), "phi3")
    writer.add_tensor("token_embd.weight", torch.zeros(4, 4).numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ConversionError) as gguf_err:
        convert_gguf(phi, tmp_path / "models" / "phi3", {})
    assert str(gguf_err.value) == (
        "phi3.gguf: architecture 'phi3' is not supported; the engine computes llama, mistral, qwen2, qwen3, gemma3"
    )
    assert not (tmp_path / "models").exists()


def test_the_gguf_and_checkpoint_architecture_lists_agree() -> None:
    from engine.model import SUPPORTED_MODEL_TYPES

    assert tuple(GGUF_MODEL_TYPES.get(a, a) for a in GGUF_ARCHITECTURES) == SUPPORTED_MODEL_TYPES


# Qwen3's chat template, cut to what the prompt layout reads: its generation prompt opens an empty thinking
# block only when enable_thinking is false (by default the model reasons at length before it answers).
QWEN3_STYLE_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + "
    "'\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% if enable_thinking is "
    "defined and enable_thinking is false %}{{ '<think>\n\n</think>\n\n' }}{% endif %}{% endif %}"
)


def test_a_thinking_template_opens_the_answer_with_an_empty_thinking_block(qwen3_dir: Path) -> None:
    from transformers import AutoTokenizer

    from engine.prompt import PromptBuilder, Turn

    tokenizer = AutoTokenizer.from_pretrained(qwen3_dir)
    tokenizer.chat_template = QWEN3_STYLE_TEMPLATE
    builder = PromptBuilder(tokenizer, "Be brief.")
    suffix = tokenizer.decode(builder.suffix_ids("who jumps?"))
    assert suffix == "Question: who jumps?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert tokenizer.decode(builder.prefix_ids) == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n"
    # An earlier turn carries no thinking block: the template renders past answers without one.
    turn = tokenizer.decode(builder.turn_ids(Turn("who?", "the fox")))
    assert turn == "Question: who?<|im_end|>\n<|im_start|>assistant\nthe fox<|im_end|>\n<|im_start|>user\n"
