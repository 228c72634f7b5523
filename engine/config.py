"""The engine's own settings (composed into the app's settings tree; never reads the environment)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from engine.models.catalog import DEFAULT_MODEL, catalog_entry
from engine.models.resolve import describe_model_setting
from engine.types import BlendConfig, MatchScope, MatchSpan, Mode, SamplingParams, SelectorName

# Defaults that keep SmolLM2-135M from looping (see docs/benchmarks.md, `python -m bench quality`).
REPETITION_PENALTY = 1.0  # the stop alone ends the loops without changing any token before it
NO_REPEAT_NGRAM_SIZE = 0
# The settings that are BlendConfig's fields, same names (a test holds the two sides equal).
BLEND_FIELDS: tuple[str, ...] = (
    "recompute_ratio",
    "selector",
    "score_layers",
    "score_fuse",
    "score_by",
    "pool_window",
    "min_per_chunk",
    "sink_tokens",
    "match_window",
    "match_span",
    "match_extra",
    "match_scope",
    "stale_key_bias",
    "stale_key_scope",
    "history_ratio",
    "attention_share",
    "ratio_min",
    "ratio_max",
    "check_layers",
    "ratio_schedule",
    "deviation_on",
    "seed",
)
DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant. Answer the question using the documents. Be concise."


class EngineSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = Field(
        default=DEFAULT_MODEL,
        description="a catalogue name (`blendrag models`: qwen2.5-coder-0.5b, smollm2-135m alias builtin, "
        "qwen2.5-coder-1.5b), a local GGUF file (llama, mistral, qwen2, qwen3) or a local Hugging Face checkpoint dir",
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

    mode: Mode = Field(
        default="blend",
        description="How a question reuses stored KV when a request names no mode: blend (recompute a share), "
        "full (plain prefill), prefix (the exact prefix and first chunk only), reuse (stored KV as is)",
    )
    recompute_ratio: float = Field(
        default=0.15,
        description="blend: the share of context tokens recomputed; unless set here, the model's calibrated or "
        "shipped value is in force (app/calibration)",
    )
    selector: SelectorName = Field(
        default="query",
        description="which context tokens blend recomputes: query (question attention, chosen before the pass), "
        "deviation (CacheBlend, at the check layers), first_k, random",
    )
    score_layers: list[int] = Field(default_factory=lambda: [12], description="query: layers whose attention scores")
    score_fuse: Literal["mean", "max"] = Field(default="mean", description="query: how several score layers combine")
    score_by: Literal["attention", "output"] = Field(
        default="attention", description="query: attention weight alone, or weight × ‖value‖ (what the key adds)"
    )
    pool_window: int = Field(default=1, ge=1, description="query: max-pool scores over this many neighbours")
    min_per_chunk: int = Field(default=0, ge=0, description="query: tokens every chunk keeps at least")
    sink_tokens: int = Field(
        default=0, ge=0, description="up-front selectors: the first tokens of every segment, always recomputed"
    )
    # The three match_* defaults are what look-ups among similar chunks need (a value copied from the chunk the
    # question names, not from a near-identical neighbour): chosen on app/calibration/similar.py's tune part and
    # checked on its check part (docs/benchmarks.md, "Exact values among similar chunks").
    match_window: int = Field(
        default=24,
        ge=0,
        le=256,
        description="up-front selectors: recompute the context tokens the question names (a name or identifier "
        "found in at most a third of the chunks) and at most this many tokens after each; 0: off",
    )
    match_span: MatchSpan = Field(
        default="sentence",
        description="match_window: how far after a matched token the recompute runs: window (match_window tokens) "
        "or sentence (to the end of its sentence, table row or block, at most match_window tokens)",
    )
    match_extra: float = Field(
        default=0.1,
        ge=0.0,
        le=1.0,
        description="match_window: the matched tokens' rows are recomputed on top of the budget, at most this share "
        "of the context (the selector keeps its whole budget); 0: they come out of the budget",
    )
    match_scope: MatchScope = Field(
        default="one",
        description="match_window: where the spans go: any (every occurrence of a named token), or one: only in the "
        "retrieved chunk holding more of the question's named tokens than any other (a look-up singling out one "
        "page; a tie, as an open question's words give, gets none) and the conversation's earlier turns",
    )
    stale_key_bias: float = Field(
        default=0.0,
        ge=0.0,
        le=16.0,
        description="up-front selectors: attention-logit bias against the stored context keys a blend does not "
        "recompute (they over-attract the question); 0: off",
    )
    stale_key_scope: Literal["all", "unnamed"] = Field(
        default="all",
        description="stale_key_bias: on the stored keys of every segment (all), or only of the segments holding no "
        "token the question names (unnamed: a name or identifier in at most a third of the chunks; none named: no "
        "bias)",
    )
    history_ratio: float | None = Field(
        default=None,
        ge=0.0,
        le=1.0,
        description="up-front selectors: share of a conversation's earlier-turn tokens recomputed, on a budget of "
        "its own (null: they share recompute_ratio with the chunks)",
    )
    attention_share: float | None = Field(
        default=None,
        gt=0.0,
        le=1.0,
        description="query, adaptive budget (off when null): recompute the fewest tokens holding this share of "
        "the question's attention to the context, within [ratio_min, ratio_max]; a request's own ratio turns it off",
    )
    ratio_min: float = Field(default=0.05, ge=0.0, le=1.0, description="adaptive budget: least share recomputed")
    ratio_max: float = Field(default=0.30, ge=0.0, le=1.0, description="adaptive budget: largest share recomputed")
    check_layers: list[int] = Field(
        default_factory=lambda: [1], description="deviation: the layers where KV deviation is measured and rows dropped"
    )
    ratio_schedule: list[float] | None = Field(
        default=None,
        description="deviation: the share kept at each check layer (gradual filtering); null: recompute_ratio at all",
    )
    deviation_on: Literal["v", "k"] = Field(
        default="v", description="deviation: compare fresh and stored V (CacheBlend) or pre-RoPE K"
    )
    seed: int = Field(default=0, ge=0, description="random selector: the seed of its choice")

    max_queue: int = Field(
        default=16,
        ge=1,
        description="requests waiting for their prompt pass before EngineBusy (running ones: max_running)",
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
        default=True, description="finish the answer once a sentence or line repeats an earlier one"
    )

    @field_validator("model")
    @classmethod
    def _model_exists(cls, value: str) -> str:
        if catalog_entry(value) is not None:
            return value
        problem = describe_model_setting(value)
        if problem is not None:
            raise ValueError(problem)
        return str(Path(value).expanduser())

    @field_validator("recompute_ratio")
    @classmethod
    def _ratio_in_range(cls, value: float) -> float:
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"recompute_ratio must be within [0, 1] (share of context tokens recomputed), got {value}")
        return value

    @model_validator(mode="after")
    def _blend_consistent(self) -> EngineSettings:
        # BlendConfig carries the real rules; building one here surfaces mistakes at start-up.
        self.blend_config()
        return self

    def blend_config(self, recompute_ratio: float | None = None, selector: SelectorName | None = None) -> BlendConfig:
        """The blend configuration every caller uses (/ask, /v1, the CLI, bench): these settings, with a
        request's own ratio and selector where it gives them. A request's ratio replaces a ratio schedule."""
        values = {name: getattr(self, name) for name in BLEND_FIELDS}
        values = {name: tuple(v) if isinstance(v, list) else v for name, v in values.items()}
        if recompute_ratio is not None:  # a fixed share: no schedule, no adaptive budget
            values |= {"recompute_ratio": recompute_ratio, "ratio_schedule": None, "attention_share": None}
        if selector is not None:
            values["selector"] = selector
        return BlendConfig(**values)

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
