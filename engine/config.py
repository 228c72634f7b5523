"""The engine's own settings (composed into the app's settings tree; never reads the environment)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from engine.blend.config import BLEND_FIELDS, BlendConfig, SelectorName
from engine.models.catalog import DEFAULT_MODEL, catalog_entry
from engine.models.ollama import is_ollama_value
from engine.models.resolve import describe_model_setting
from engine.types import Mode, SamplingParams

# Defaults that keep SmolLM2-135M from looping (see docs/benchmarks.md, `python -m bench quality`).
REPETITION_PENALTY = 1.0  # the stop alone ends the loops without changing any token before it
NO_REPEAT_NGRAM_SIZE = 0
DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant. Answer the question using the documents. Be concise."


class EngineSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = Field(
        default=DEFAULT_MODEL,
        description="a catalogue name (`blendrag models`: qwen2.5-coder-0.5b, smollm2-135m alias builtin, "
        "qwen2.5-coder-1.5b, gemma3-270m), ollama:NAME[:TAG] (a model pulled with Ollama, read from its store: "
        "~/.ollama/models or $OLLAMA_MODELS), a local GGUF file (llama, mistral, qwen2, qwen3, gemma3) or a local "
        "Hugging Face checkpoint dir",
    )
    device: Literal["cpu", "cuda", "auto"] = Field(
        default="auto", description="auto: cuda when torch sees a GPU, else cpu"
    )
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = Field(
        default="auto",
        description="auto: bfloat16 on CUDA and on a CPU with native bf16 matrix units (AMX, AVX512-BF16), "
        "float32 on other CPUs (engine/dtype_choice.py)",
    )
    num_threads: int | None = Field(default=None, ge=1, description="torch intra-op threads (CPU)")
    pack_weights: bool = Field(
        default=False,
        description="bfloat16 on a CPU with bf16 matrix units: pack the layers' GEMM weights once for oneDNN "
        "instead of on every call (same results; faster few-row GEMMs on one thread, no gain measured end to "
        "end on two: docs/benchmarks.md, 'Packed weights')",
    )
    decode_weights: Literal["auto", "same", "int8", "int4"] = Field(
        default="auto",
        description="the weights decode reads (the prompt pass keeps the model's own): int8 or int4 weight-only "
        "copies, made once and kept in the model cache, read a quarter or an eighth of float32's bytes per "
        "token; auto: int8 on a CPU for models above 50M GEMM parameters, the model's own elsewhere; same: the "
        "model's own (engine/decode_weights.py, docs/benchmarks.md 'Decode')",
    )
    system_prompt: str = Field(
        default=DEFAULT_SYSTEM_PROMPT,
        description="The server's system prompt, part of every prompt's prefix (a change makes stored chunk KV stale)",
    )
    question_template: str = Field(
        default="Question: {question}",
        description="suffix text before the template closes the user turn; must contain {question}",
    )
    chunk_lead_in: bool = Field(
        default=False,
        description="open every prompt's context with a fixed lead-in text (engine/prompt.py LEAD_IN), part of the "
        "prefix, so every chunk's stored KV is computed behind some text rather than as the first words of the "
        "user's turn: closer to full prefill at every recompute ratio on nq6, but it cost look-ups among similar "
        "pages (6 of 12 against 11 at the bfloat16 record's 0.25), so it is off (docs/benchmarks.md, 'Stored KV "
        "behind other text'). A change makes stored chunk KV stale",
    )

    mode: Mode = Field(
        default="blend",
        description="How a question reuses stored KV when a request names no mode: blend (recompute a share), "
        "full (plain prefill), prefix (the exact prefix and first chunk only), reuse (stored KV as is)",
    )
    blend: BlendConfig = Field(
        default_factory=BlendConfig,
        description="how blend picks the context tokens it recomputes (engine/blend/config.py); the flat keys of "
        "earlier releases (engine.recompute_ratio, …) are read as these",
    )

    max_queue: int = Field(
        default=16,
        ge=1,
        description="requests waiting for their prompt pass before EngineBusy (running ones: max_running): the "
        "hard bound; one more is answered 503 with Retry-After, the estimated seconds until a place frees",
    )
    max_queue_wait_s: float | None = Field(
        default=None,
        gt=0,
        description="also refuse (503, Retry-After) a question whose estimated wait for its prompt pass is longer "
        "than this many seconds (engine/admission.py: the queue ahead of it at the measured prompt and decode "
        "rates); null (default): only max_queue refuses, since on one server a refused client waits as long "
        "before it is served and loses its place in the line; set it behind a load balancer with other "
        "replicas, or for clients that give up sooner",
    )
    max_running: int = Field(default=8, ge=1, description="requests decoding at once (one batched decode step)")
    working_cache_pool_bytes: int | None = Field(
        default=None,
        ge=0,
        description="working caches kept for reuse, by size class (powers of two from 512 tokens; a request takes "
        "the class of its prompt + max_tokens), in use or idle: at most this many bytes (engine/cache_pool.py); "
        "null (auto): an eighth of the GPU's memory on CUDA, off on a CPU (a fresh cache costs milliseconds there "
        "against a prompt pass of seconds: no gain measured end to end, docs/gpu.md); 0: off, every request "
        "allocates its own",
    )
    decode_graphs: Literal["auto", "off"] = Field(
        default="auto",
        description="auto: on CUDA the decode step (single and batched) is captured in a CUDA graph per batch size "
        "class and cache size class and replayed (needs the working cache pool; a failed capture falls back to "
        "eager decode, logged once); off: eager decode, as on a CPU (engine/decode_graphs.py)",
    )
    max_new_tokens: int = Field(
        default=320,
        ge=1,
        description="answer length cap when a request sets none (its max_tokens, the chat page's Max tokens, asks "
        "for more): holds an answer with a code example (the default model's how-to answers on the docs corpus "
        "end by themselves after 107-190 tokens) and stops a looping answer after ~1 minute at the 5 tokens/s two "
        "loaded cores decode, where 512 let it run ~2",
    )
    history_max_tokens: int = Field(
        default=1024,
        ge=0,
        description="a conversation's earlier turns in the prompt: at most this many tokens, oldest dropped first",
    )
    temperature: float = Field(
        default=0.0, ge=0.0, description="Sampling temperature when a request sets none; 0: greedy"
    )
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, description="Nucleus sampling mass when a request sets none")
    # Repetition control, applied identically in every mode (it only looks at the generated tokens).
    repetition_penalty: float = Field(
        default=REPETITION_PENALTY,
        ge=1.0,
        le=2.0,
        description="> 1 lowers the logits of tokens the answer already contains (1 = off)",
    )
    no_repeat_ngram_size: int = Field(
        default=NO_REPEAT_NGRAM_SIZE, ge=0, description="never generate the same n-gram twice (0 = off)"
    )
    stop_on_repeated_line: bool = Field(
        default=True,
        description="finish the answer once it loops: a prose sentence said again, or the same lines back to back "
        "with the copies after the first adding up to three lines (code that rightly recurs, an import in a second "
        "example or a closing bracket, does not stop it; engine/repetition.py); the withheld line is reported",
    )

    @field_validator("model")
    @classmethod
    def _model_exists(cls, value: str) -> str:
        if catalog_entry(value) is not None:
            return value
        problem = describe_model_setting(value)
        if problem is not None:
            raise ValueError(problem)
        if is_ollama_value(value):
            return value  # a name in Ollama's store, not a path
        return str(Path(value).expanduser())

    @model_validator(mode="before")
    @classmethod
    def _flat_blend_keys(cls, data: Any) -> Any:
        return nest_flat_blend_keys(data)

    def blend_config(self, recompute_ratio: float | None = None, selector: SelectorName | None = None) -> BlendConfig:
        """The blend configuration every caller uses (/ask, /v1, the CLI, bench): these settings, with a
        request's own ratio and selector where it gives them (`BlendConfig.for_request`)."""
        return self.blend.for_request(recompute_ratio, selector)

    def sampling_params(self, **overrides: object) -> SamplingParams:
        """Default sampling from settings; per-request values (max_tokens, temperature…) override."""
        values: dict[str, object] = {
            "max_tokens": self.max_new_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "repetition_penalty": self.repetition_penalty,
            "no_repeat_ngram_size": self.no_repeat_ngram_size,
            "stop_on_repeated_line": self.stop_on_repeated_line,
        }
        values.update({k: v for k, v in overrides.items() if v is not None})
        return SamplingParams(**values)  # type: ignore[arg-type]

    def resolve_device(self) -> str:
        import torch

        if self.device == "auto":
            return "cuda" if torch.cuda.is_available() else "cpu"
        if self.device == "cuda" and not torch.cuda.is_available():
            raise ValueError("engine.device is 'cuda' but torch sees no CUDA device")
        return self.device


def nest_flat_blend_keys(data: Any) -> Any:
    """The engine settings of one source (a settings file, the environment, a dict) with the flat blend keys of
    earlier releases (`engine.recompute_ratio: 0.25`, BLENDRAG_ENGINE__SELECTOR=query) read as `engine.blend.*`.

    Applied to each source before the sources are merged (app/settings.py), so precedence holds across them: an
    old flat key in settings.yaml and BLENDRAG_ENGINE__BLEND__* in the environment, the environment wins. One
    source setting a key both ways is refused: which was meant is not ours to guess."""
    if not isinstance(data, dict):
        return data
    flat = {name: data[name] for name in BLEND_FIELDS if name in data}
    if not flat:
        return data
    nested = data.get("blend") or {}
    if isinstance(nested, BlendConfig):
        nested = nested.model_dump(exclude_unset=True)
    if not isinstance(nested, dict):
        return data
    both = sorted(set(flat) & set(nested))
    if both:
        raise ValueError(f"engine.{both[0]} and engine.blend.{both[0]} are both set; keep engine.blend.{both[0]}")
    rest = {name: value for name, value in data.items() if name not in flat}
    return rest | {"blend": nested | flat}
