"""Write a tiny Hugging Face checkpoint (tests/enginetest_tiny.py) as a GGUF file, the way llama.cpp's
converter lays one out: float32 tensors under GGUF names, the config as `<arch>.*` keys, the byte-level
BPE tokenizer as `tokenizer.ggml.*` (gpt2 model: tokens, types, merges) with its chat template.

Only for architectures whose GGUF keeps the Hugging Face q/k layout (qwen2, qwen3: NEOX RoPE); a llama
GGUF permutes q/k for its interleaved RoPE, which this writer does not do.
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import torch
from safetensors.torch import load_file

_ARCHS = {"qwen2": gguf.MODEL_ARCH.QWEN2, "qwen3": gguf.MODEL_ARCH.QWEN3}


def write_gguf(model_dir: Path, out: Path) -> Path:
    config = json.loads((model_dir / "config.json").read_text())
    arch_name = config["model_type"]
    arch = _ARCHS[arch_name]
    tensors = load_file(str(model_dir / "model.safetensors"))
    names = gguf.get_tensor_name_map(arch, config["num_hidden_layers"])
    out.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(out), arch_name)
    writer.add_name("tiny " + arch_name)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(float(config.get("rope_theta") or config.get("rope_parameters", {})["rope_theta"]))
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])

    tok = json.loads((model_dir / "tokenizer.json").read_text())
    vocab: dict[str, int] = tok["model"]["vocab"]
    for added in tok["added_tokens"]:
        vocab[added["content"]] = added["id"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    special = {a["content"] for a in tok["added_tokens"] if a["special"]}
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.CONTROL if t in special else gguf.TokenType.NORMAL for t in tokens])
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]])
    tok_config = json.loads((model_dir / "tokenizer_config.json").read_text())
    writer.add_bos_token_id(vocab[tok_config["bos_token"]])
    writer.add_eos_token_id(vocab[tok_config["eos_token"]])
    writer.add_pad_token_id(vocab[tok_config["pad_token"]])
    template = model_dir / "chat_template.jinja"
    writer.add_chat_template(template.read_text() if template.is_file() else tok_config["chat_template"])

    for name, tensor in tensors.items():
        gguf_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
        assert gguf_name is not None, name
        writer.add_tensor(gguf_name, tensor.to(torch.float32).numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out
