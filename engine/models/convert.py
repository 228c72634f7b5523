"""GGUF file → Hugging Face safetensors directory (float32 weights + tokenizer + chat template), once.

transformers' GGUF loader dequantizes the weights and rebuilds the tokenizer (with the chat template the
GGUF carries); the result is saved as an ordinary checkpoint directory that later starts load in a second.
The directory is written under a staging name and renamed into place, so a crash mid-conversion never
leaves a half-written model that a later start would trust. A marker file records what it was made from.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

# What the engine's layer loop computes (engine.model.SUPPORTED_MODEL_TYPES, not imported: it needs torch).
GGUF_ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3", "gemma3")
# A GGUF architecture's Hugging Face model_type where the two differ: transformers converts a gemma3 GGUF into
# its text-only model.
GGUF_MODEL_TYPES = {"gemma3": "gemma3_text"}
MARKER = "blendrag-model.json"


class ConversionError(RuntimeError):
    """The GGUF file is not a model the engine can run, or its conversion failed."""


@dataclass(frozen=True)
class GGUFFacts:
    architecture: str
    name: str  # general.name, "" when absent
    file_type: str  # origin quantisation, e.g. "Q4_K_M"
    num_layers: int
    num_parameters: int  # weights stored in the file
    head_dim: int | None = None  # `<arch>.attention.key_length`, when the file records it
    rope_scaling_factor: float | None = None  # `<arch>.rope.scaling.factor`, when the file records it


def read_gguf_facts(path: Path) -> GGUFFacts:
    """The header facts of a GGUF file (no tensor data is read)."""
    from gguf import GGUFReader, LlamaFileType

    try:
        reader = GGUFReader(str(path))
    except Exception as exc:  # noqa: BLE001 - gguf raises plain ValueErrors for what is not a GGUF file
        raise ConversionError(f"{path} is not a readable GGUF file: {exc}") from exc

    def field(key: str) -> object:
        item = reader.fields.get(key)
        return None if item is None else item.contents()

    arch = str(field("general.architecture") or "")
    file_type = field("general.file_type")
    try:
        file_type_name = LlamaFileType(int(file_type)).name.removeprefix("MOSTLY_") if file_type is not None else ""
    except ValueError:
        file_type_name = str(file_type)
    return GGUFFacts(
        architecture=arch,
        name=str(field("general.name") or ""),
        file_type=file_type_name,
        num_layers=int(field(f"{arch}.block_count") or 0),
        num_parameters=sum(int(t.n_elements) for t in reader.tensors),
        head_dim=int(key_length) if (key_length := field(f"{arch}.attention.key_length")) is not None else None,
        rope_scaling_factor=float(factor) if (factor := field(f"{arch}.rope.scaling.factor")) is not None else None,
    )


def _head_dim_config(gguf: Path, facts: GGUFFacts) -> dict[str, object]:
    """`{"config": …}` with the file's head_dim when transformers would read another one, else nothing.

    transformers' GGUF config mapping drops `attention.key_length`, so a config that has a head_dim field
    falls back on its default (Qwen3's is 128: right for Qwen3's released sizes, wrong for any model whose
    heads differ). A model whose head_dim is the default converts exactly as before (same config.json, so the
    same fingerprint and the same shipped calibration records)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
    default = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if facts.head_dim is None or facts.head_dim == default:
        return {}
    config.head_dim = facts.head_dim
    return {"config": config}


def is_converted(target: Path) -> bool:
    return (target / "config.json").is_file() and any(target.glob("*.safetensors")) and (target / MARKER).is_file()


def read_marker(target: Path) -> dict[str, object]:
    try:
        return json.loads((target / MARKER).read_text())
    except (OSError, ValueError):
        return {}


def convert_gguf(gguf: Path, target: Path, source: dict[str, object]) -> Path:
    """Convert `gguf` into the checkpoint directory `target` (replaced atomically); `source` goes in the marker."""
    facts = read_gguf_facts(gguf)
    if facts.architecture not in GGUF_ARCHITECTURES:
        raise ConversionError(
            f"{gguf.name}: architecture {facts.architecture!r} is not supported; the engine computes "
            f"{', '.join(GGUF_ARCHITECTURES)}"
        )
    if facts.architecture == "gemma3" and facts.rope_scaling_factor not in (None, 1.0):
        # transformers' gemma3 GGUF mapping has no rope.scaling keys: the converted model would rotate its full
        # layers unscaled and answer otherwise than the file's model (Gemma 3 4B and larger scale them ×8).
        raise ConversionError(
            f"{gguf.name}: a gemma3 GGUF with RoPE scaling (factor {facts.rope_scaling_factor:g}) is not supported: "
            "transformers' conversion drops the scaling, which would change every answer"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    logger.info(
        "converting %s (%s, %s) to safetensors under %s (one time)", gguf.name, facts.name, facts.file_type, target
    )
    t0 = time.perf_counter()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=torch.float32, **_head_dim_config(gguf, facts)
        )
        # save_pretrained refuses a model that still looks quantized; the weights are already dequantized.
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.hf_quantizer = None
        model.config.dtype = "float32"
        model.save_pretrained(staging, safe_serialization=True)
        del model
        tokenizer.save_pretrained(staging)
        seconds = time.perf_counter() - t0
        marker = {
            **source,
            "gguf_name": facts.name,
            "architecture": facts.architecture,
            "origin_quantisation": facts.file_type,
            "num_layers": facts.num_layers,
            "num_parameters": facts.num_parameters,
            "conversion_s": round(seconds, 1),
        }
        (staging / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
        staging.chmod(0o755)  # mkdtemp makes it owner-only; the model is no secret
        if target.exists():
            shutil.rmtree(target)
        os.replace(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    logger.info("converted %s in %.1f s", gguf.name, seconds)
    return target
