"""`engine.model` → a checkpoint directory the engine loads, and what model it is.

Four kinds of value: a catalogue name (or the alias `builtin`): its packages' GGUF file joined, checked
and converted once into the machine's model cache (engine/models/cache.py); a local GGUF file (what Ollama,
LM Studio and llama.cpp keep on disk): converted once the same way; `ollama:NAME[:TAG]`, a model pulled with
Ollama: its GGUF blob read from Ollama's store (engine/models/ollama.py), hash-checked and converted the same
way; a local Hugging Face checkpoint directory: loaded as it is. `read_also` names older models dirs (a data
dir's own models/ from before the cache) where a conversion already made is found and loaded instead.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from engine.models.cache import ensure_converted
from engine.models.catalog import CATALOG, CatalogEntry, catalog_entry
from engine.models.convert import convert_gguf, is_converted, read_marker
from engine.models.install import joined_gguf
from engine.models.ollama import OllamaModel, describe_ollama_setting, is_ollama_value, locate, verify_blob

logger = logging.getLogger(__name__)

ModelSource = Literal["catalog", "gguf", "checkpoint"]


@dataclass(frozen=True)
class ModelIdentity:
    """What the served model is, as /api/stats, /v1/models, the admin page, the log and bench name it."""

    name: str  # the catalogue name, or the GGUF file / checkpoint directory name
    display_name: str
    source: ModelSource
    architecture: str
    origin_quantisation: str | None  # of the GGUF it was converted from; None for a checkpoint dir


@dataclass(frozen=True)
class ServedModel:
    """The loaded model as every surface names it: identity + what the engine counted and computes in."""

    name: str
    display_name: str
    source: ModelSource
    architecture: str
    num_parameters: int  # weights loaded (tied embeddings once)
    parameters_label: str  # the count as a person reads it: 135M, 630M, 1.8B
    num_layers: int
    origin_quantisation: str | None
    compute_dtype: str  # "bfloat16" / "float32" / "float16"
    decode_weights: str = "same"  # what decode reads: "same" (the model's own), "int8" or "int4"

    def describe(self) -> str:
        """One line for the log and the bench headers: "Qwen2.5-Coder-0.5B-Instruct (qwen2.5-coder-0.5b, 630M
        parameters, from Q4_K_M, computing in bfloat16)"."""
        origin = f", from {self.origin_quantisation}" if self.origin_quantisation else ""
        decode = "" if self.decode_weights == "same" else f", decoding from {self.decode_weights} weights"
        return (
            f"{self.display_name} ({self.name}, {self.parameters_label} parameters{origin}, "
            f"computing in {self.compute_dtype}{decode})"
        )


@dataclass(frozen=True)
class ResolvedModel:
    path: Path  # a Hugging Face checkpoint directory
    identity: ModelIdentity


def parameters_label(num_parameters: int) -> str:
    n = num_parameters
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.0f}M" if n >= 1e6 else f"{n / 1e3:.0f}K"


def describe_model_setting(value: str) -> str | None:
    """Why `value` cannot be an engine.model, or None when it can (checked at settings time, loads nothing)."""
    if catalog_entry(value) is not None:
        return None
    if is_ollama_value(value):
        return describe_ollama_setting(value)
    path = Path(value).expanduser()
    names = ", ".join(CATALOG)
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            return f"engine.model {value!r} is a file but not a .gguf file"
        return None
    if not path.is_dir():
        return (
            f"engine.model {value!r} is neither a catalogue model ({names}), ollama:NAME[:TAG], a local .gguf "
            "file nor a directory; `blendrag models` lists the catalogue"
        )
    if not (path / "config.json").is_file():
        return f"engine.model {value!r} has no config.json; is it a Hugging Face checkpoint dir?"
    return None


def resolve_model(value: str, models_dir: Path, read_also: Sequence[Path] = ()) -> ResolvedModel:
    """Make `value`'s checkpoint directory ready (join + check + convert on first use) and name the model."""
    entry = catalog_entry(value)
    if entry is not None:
        return ResolvedModel(ensure_catalog_model(entry, models_dir, read_also), catalog_identity(entry))
    if is_ollama_value(value):
        model = locate(value)
        target = ensure_ollama_model(model, models_dir, read_also)
        return ResolvedModel(target, _converted_gguf_identity(target, f"ollama:{model.ref.short}", model.ref.name))
    path = Path(value).expanduser()
    if path.is_file():
        target = ensure_gguf_model(path, models_dir, read_also)
        return ResolvedModel(target, _converted_gguf_identity(target, path.name, path.stem))
    return ResolvedModel(path, checkpoint_identity(path))


def _converted_gguf_identity(target: Path, name: str, fallback_display_name: str) -> ModelIdentity:
    """A converted GGUF's identity (a user's file or an Ollama blob): named by its header, read from its marker."""
    marker = read_marker(target)
    return ModelIdentity(
        name=name,
        display_name=str(marker.get("gguf_name") or fallback_display_name),
        source="gguf",
        architecture=str(marker.get("architecture", "")),
        origin_quantisation=str(marker.get("origin_quantisation") or "") or None,
    )


def catalog_identity(entry: CatalogEntry) -> ModelIdentity:
    return ModelIdentity(
        name=entry.name,
        display_name=entry.display_name,
        source="catalog",
        architecture=entry.architecture,
        origin_quantisation=entry.origin_quantisation,
    )


def checkpoint_identity(path: Path) -> ModelIdentity:
    """A checkpoint dir's identity; one blendrag converted (its marker says from what) keeps that name."""
    marker = read_marker(path)
    entry = catalog_entry(str(marker.get("model", "")))
    if entry is not None and marker.get("sha256") == entry.sha256:
        return catalog_identity(entry)
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        config = {}
    if marker.get("gguf_name"):
        return ModelIdentity(
            name=path.name,
            display_name=str(marker["gguf_name"]),
            source="gguf",
            architecture=str(config.get("model_type", "")),
            origin_quantisation=str(marker.get("origin_quantisation") or "") or None,
        )
    return ModelIdentity(
        name=path.name,
        display_name=path.name,
        source="checkpoint",
        architecture=str(config.get("model_type", "")),
        origin_quantisation=None,
    )


def converted_path(entry: CatalogEntry, models_dir: Path) -> Path:
    return Path(models_dir) / entry.converted_dir


def is_catalog_model_converted(entry: CatalogEntry, models_dir: Path) -> bool:
    return _is_entry_converted(entry, converted_path(entry, models_dir))


def _is_entry_converted(entry: CatalogEntry, target: Path) -> bool:
    return is_converted(target) and read_marker(target).get("sha256") == entry.sha256


def ensure_catalog_model(entry: CatalogEntry, models_dir: Path, read_also: Sequence[Path] = ()) -> Path:
    """The entry's converted directory: joined, hash-checked and converted on first use, then reused.

    The joined GGUF is deleted once converted: the safetensors are what every later start loads, and the
    parts stay installed in site-packages, so a re-conversion can join them again.
    """

    def make(target: Path) -> None:
        gguf, joined = joined_gguf(entry, Path(models_dir))
        convert_gguf(gguf, target, {"model": entry.name, "sha256": entry.sha256, "num_bytes": entry.num_bytes})
        if joined:
            gguf.unlink(missing_ok=True)

    return ensure_converted(
        entry.converted_dir,
        models_dir,
        is_ready=lambda target: _is_entry_converted(entry, target),
        make=make,
        read_also=read_also,
    )


def _gguf_key(path: Path) -> str:
    """Names a user's GGUF file's conversion without hashing gigabytes at every start: the resolved path,
    size and modification time (a changed file converts again)."""
    stat = path.stat()
    return hashlib.sha256(f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:12]


def ensure_gguf_model(path: Path, models_dir: Path, read_also: Sequence[Path] = ()) -> Path:
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", path.stem).strip("-.") or "model"
    stat = path.stat()
    source = {"gguf_path": str(path.resolve()), "num_bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    return ensure_converted(
        f"gguf-{stem}-{_gguf_key(path)}",
        models_dir,
        is_ready=is_converted,
        make=lambda target: convert_gguf(path, target, source),
        read_also=read_also,
    )


def ensure_ollama_model(model: OllamaModel, models_dir: Path, read_also: Sequence[Path] = ()) -> Path:
    """An Ollama blob's converted directory. The blob is hashed against its digest before the model cache is
    touched (a damaged blob leaves no lock, staging dir or conversion behind) and only when no conversion is
    there yet: the directory's name carries the digest, so a later start trusts the conversion it finds."""
    name = model.converted_dir
    if not any(is_converted(Path(d) / name) for d in (*read_also, models_dir)):
        logger.info("checking %s's GGUF blob %s against its digest", model.ref.short, model.blob)
        verify_blob(model)
    source = {
        "ollama_model": model.ref.short,
        "gguf_path": str(model.blob),
        "sha256": model.sha256,
        "num_bytes": model.blob.stat().st_size,
    }
    return ensure_converted(
        name,
        models_dir,
        is_ready=is_converted,
        make=lambda target: convert_gguf(model.blob, target, source),
        read_also=read_also,
    )
