"""`python -m bench random-model`: a checkpoint of a real model's shape with random weights, for timing.

A GPU machine has no network and a call carries 64 MiB, so the device check (scripts/device-check.sh) writes
its checkpoints there: a real architecture and size (the default model's shape, Mistral-7B, Qwen2.5-7B) with
weights drawn on the device, saved as safetensors beside a real tokenizer. The engine loads it like any local
checkpoint. Timings only: the weights are noise, so the answers are too (exactness on such a checkpoint still
holds: blend at ratio 1 equals full prefill whatever the weights).

`--export-tokenizer NAME`: write the tokenizer of a catalogue model (its GGUF's, read without converting the
weights) into `--out`, to carry to the device machine (scripts/device-prep.sh).
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import time
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

NAME = "random-model"
HELP = "write a random-weight checkpoint of a real model's shape (device timing), or export a tokenizer"

# The configs of the shapes the device check times (public architecture facts; no weights).
SHAPES: dict[str, dict[str, Any]] = {
    "qwen2.5-0.5b": {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": True,
        "vocab_size": 151936,
    },
    "qwen2.5-7b": {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": False,
        "vocab_size": 152064,
    },
    "mistral-7b": {
        "architectures": ["MistralForCausalLM"],
        "model_type": "mistral",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-5,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": False,
        # the Qwen tokenizer travels; the embedding is sized to it (8.2B parameters with its 152k vocab)
        "vocab_size": 151936,
    },
}

# Not a real model: the CPU rehearsal of scripts/device-check.sh (SHAPES=tiny), the default model's architecture at a
# size where every command takes seconds.
SHAPES["tiny"] = {
    **SHAPES["qwen2.5-0.5b"],
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
}


_TOKENIZER_FILES = ("special_tokens_map.json", "added_tokens.json", "vocab.json", "merges.txt", "chat_template.jinja")


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--shape", choices=sorted(SHAPES), help="which real shape to write")
    parser.add_argument("--tokenizer", type=Path, help="a directory holding the tokenizer files to put beside it")
    parser.add_argument("--out", type=Path, default=None, help="the checkpoint (or tokenizer) directory to write")
    parser.add_argument("--device", default="auto", help="where the weights are drawn (auto: cuda when present)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--export-tokenizer", default=None, help="catalogue model whose tokenizer to write to --out")


def shape_config(shape: str, vocab_size: int | None = None) -> dict[str, Any]:
    """The config.json of `shape`, its vocabulary sized to the tokenizer when given (never smaller)."""
    config = dict(SHAPES[shape])
    if vocab_size is not None:
        config["vocab_size"] = max(config["vocab_size"], vocab_size)
    config.update(hidden_act="silu", torch_dtype="bfloat16", use_cache=True, bos_token_id=None, eos_token_id=None)
    if config["model_type"] == "qwen2":
        config.update(use_sliding_window=False, sliding_window=None, max_window_layers=config["num_hidden_layers"])
    if config["model_type"] == "mistral":
        config.update(sliding_window=None, head_dim=config["hidden_size"] // config["num_attention_heads"])
    return config


def write_random_model(shape: str, out: Path, tokenizer_dir: Path | None, device: str = "auto", seed: int = 0) -> Path:
    """Write `shape` with N(0, 0.02) bf16 weights (norms 1, biases 0) and the tokenizer to `out`."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM

    dev = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
    vocab = None
    if tokenizer_dir is not None:
        from transformers import AutoTokenizer

        vocab = len(AutoTokenizer.from_pretrained(tokenizer_dir))
    out.mkdir(parents=True, exist_ok=True)
    config_dict = shape_config(shape, vocab)
    (out / "config.json").write_text(json.dumps(config_dict, indent=2) + "\n")
    config = AutoConfig.from_pretrained(out)
    t0 = time.perf_counter()
    gen = torch.Generator(device=dev).manual_seed(seed)
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    tensors: dict[str, torch.Tensor] = {}
    for name, param in skeleton.state_dict().items():
        if name.endswith("norm.weight"):
            t = torch.ones(param.shape, dtype=torch.bfloat16, device=dev)
        elif name.endswith(".bias"):
            t = torch.zeros(param.shape, dtype=torch.bfloat16, device=dev)
        else:
            t = torch.empty(param.shape, dtype=torch.bfloat16, device=dev).normal_(0.0, 0.02, generator=gen)
        tensors[name] = t.cpu()
    if config_dict.get("tie_word_embeddings"):
        tensors.pop("lm_head.weight", None)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    if tokenizer_dir is not None:
        for f in tokenizer_dir.iterdir():
            if f.is_file() and (f.name.startswith("tokenizer") or f.name in _TOKENIZER_FILES):
                shutil.copy2(f, out / f.name)
    num = sum(t.numel() for t in tensors.values())
    logger.info("wrote %s (%.2fB parameters, random) to %s in %.1f s", shape, num / 1e9, out, time.perf_counter() - t0)
    return out


def export_tokenizer(model: str, out: Path) -> Path:
    """The tokenizer of catalogue model `model` (from its checked GGUF, weights untouched) saved to `out`."""
    from transformers import AutoTokenizer

    from app.settings import default_models_dir
    from engine.models.catalog import catalog_entry
    from engine.models.install import joined_gguf

    entry = catalog_entry(model)
    if entry is None:
        raise SystemExit(f"unknown catalogue model {model!r}")
    gguf, _ = joined_gguf(entry, default_models_dir())
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(out)
    return out


def main(args: argparse.Namespace) -> int:
    if args.out is None:
        raise SystemExit("--out is required: the directory to write")
    if args.export_tokenizer:
        export_tokenizer(args.export_tokenizer, args.out)
        return 0
    if not args.shape:
        raise SystemExit("--shape is required (or --export-tokenizer)")
    write_random_model(args.shape, args.out, args.tokenizer, args.device, args.seed)
    return 0
