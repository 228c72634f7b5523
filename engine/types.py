"""Typed values the engine exchanges with its callers (AskService, ingest, bench, the scheduler).

Everything here is plain data: no tensors are created and no model is touched, so importing this
module is cheap and other packages can build requests without loading torch-heavy code paths.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, get_args

# The blend's config is declared once, in engine/blend/config.py; its names are re-exported here for the callers
# that build requests.
from engine.blend.config import BlendConfig, SelectorName

if TYPE_CHECKING:
    import torch

    from engine.working_cache import WorkingCache
    from kvcache.types import LayerKVReader

Mode = Literal["blend", "full", "prefix", "reuse"]
MODES: tuple[Mode, ...] = get_args(Mode)
# "repetition": stop_on_repeated_line ended a loop before its repeat was sent (FinishEvent.repeated_line).
FinishReason = Literal["stop", "length", "cancelled", "repetition"]


class EngineError(RuntimeError):
    """A request could not be run (bad layout, KV shape mismatch, model failure)."""


# What a refusal says before anything is measured (a fresh server's first seconds): retry in a second.
DEFAULT_RETRY_AFTER_S = 1.0


class EngineBusy(EngineError):
    """The scheduler refuses a request (its queue is full, or the wait would be over `engine.max_queue_wait_s`);
    the caller should retry in `retry_after_s` seconds, the scheduler's estimate of when a retry may be admitted
    (engine/admission.py; HTTP 503 with Retry-After)."""

    def __init__(self, message: str, retry_after_s: float = DEFAULT_RETRY_AFTER_S) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class RequestCancelled(EngineError):
    """Raised inside the layer loop when the request's consumer went away; never reaches callers."""


@dataclass(frozen=True)
class PromptLayout:
    """[prefix][chunk 1]…[chunk k][turn 1]…[turn t-1][suffix], all as token ids; positions are indices into
    the concatenation.

    `prefix_ids` (system prompt + chat-template opening of the user turn) is shared by every request and
    every chunk precompute. `chunk_ids` are the stored *segments* in prompt order: the retrieved chunks,
    then, in a conversation, its earlier turns (the last `num_history_segments` entries, oldest first, each
    a question + answer as the chat template renders them). To the engine a turn is a segment like a chunk:
    stored KV re-rotated to its position, its tokens candidates for the selector's recompute budget.
    """

    prefix_ids: list[int]
    chunk_ids: list[list[int]]
    suffix_ids: list[int]
    num_history_segments: int = 0
    # Whether the segments' stored KV was computed behind these prefix_ids. False for a client's own system
    # prompt (the store holds KV computed behind the server's): mode `prefix` then reuses the prefix alone.
    segments_behind_prefix: bool = True

    def __post_init__(self) -> None:
        if not self.suffix_ids:
            raise ValueError("PromptLayout.suffix_ids must not be empty (the question goes there)")
        if any(len(c) == 0 for c in self.chunk_ids):
            raise ValueError("PromptLayout.chunk_ids must not contain empty chunks")
        if not 0 <= self.num_history_segments <= len(self.chunk_ids):
            raise ValueError(
                f"num_history_segments must be within [0, {len(self.chunk_ids)}], got {self.num_history_segments}"
            )

    @property
    def retrieved_chunk_ids(self) -> list[list[int]]:
        """The retrieved chunks' segments (prompt order), without the conversation's earlier turns."""
        return self.chunk_ids[: len(self.chunk_ids) - self.num_history_segments]

    @property
    def history_ids(self) -> list[list[int]]:
        """The earlier turns' segments, oldest first."""
        return self.chunk_ids[len(self.chunk_ids) - self.num_history_segments :]

    @property
    def num_history_tokens(self) -> int:
        return sum(len(c) for c in self.history_ids)

    @property
    def num_prefix_tokens(self) -> int:
        return len(self.prefix_ids)

    @property
    def num_context_tokens(self) -> int:
        return sum(len(c) for c in self.chunk_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prefix_ids) + self.num_context_tokens + len(self.suffix_ids)

    def all_ids(self) -> list[int]:
        ids = list(self.prefix_ids)
        for chunk in self.chunk_ids:
            ids.extend(chunk)
        ids.extend(self.suffix_ids)
        return ids


@dataclass(frozen=True)
class SamplingParams:
    """Decoding controls. temperature 0 means greedy; a seed makes sampling reproducible."""

    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    # Repetition control (engine.sampling.RepetitionControl); the defaults here switch it off, the
    # engine settings switch it on for every mode alike.
    repetition_penalty: float = 1.0  # > 1 lowers the logits of tokens already generated
    no_repeat_ngram_size: int = 0  # > 0: never generate an n-gram of this size twice
    stop_on_repeated_line: bool = False  # finish ("stop") once a sentence or line repeats an earlier one

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if not 1.0 <= self.repetition_penalty <= 2.0:
            raise ValueError(f"repetition_penalty must be within [1, 2], got {self.repetition_penalty}")
        if self.no_repeat_ngram_size < 0:
            raise ValueError(f"no_repeat_ngram_size must be >= 0 (0 = off), got {self.no_repeat_ngram_size}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be within (0, 1], got {self.top_p}")
        stops = tuple(s for s in self.stop if s)
        object.__setattr__(self, "stop", stops)

    @property
    def greedy(self) -> bool:
        # Below MIN_TEMPERATURE, logits / temperature overflows float32: sampling that cold is greedy anyway.
        return self.temperature < MIN_TEMPERATURE


MIN_TEMPERATURE = 1e-4  # sampling temperatures below this are greedy


@dataclass(frozen=True)
class GenerationRequest:
    """One question to answer, complete: its id, prompt layout, mode, blend config, sampling and the reader of
    its stored KV. Built once its KV is open (app/services/ask/resolve.py settles every value before that);
    nothing downstream changes it or decides its mode again.

    `kv_reader` serves the context's stored KV: every mode but `full` needs it for its prompt pass (refused
    without); the engine's worker closes it after the pass. `Engine.answer`, which decodes from a pass already
    done, reads only the sampling."""

    request_id: str
    layout: PromptLayout
    kv_reader: LayerKVReader | None = None
    mode: Mode = "blend"
    blend: BlendConfig = field(default_factory=BlendConfig)
    sampling: SamplingParams = field(default_factory=SamplingParams)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {list(MODES)}, got {self.mode!r}")


@dataclass(frozen=True)
class TokenEvent:
    """One generated token. `text` is the new printable text (may be "" while a multi-byte character or a
    possible stop string is still incomplete); concatenating all `text`s gives the final answer."""

    text: str
    token_id: int


@dataclass(frozen=True)
class RepeatedLine:
    """What the repeated-line stop withheld when it ended an answer (engine/repetition.py): the repeat the
    answer began, never sent, and where what it repeats begins in the answer, so a reader can see both."""

    text: str  # the withheld sentence, line(s) or in-line unit, white space at its ends stripped
    earlier_start: int  # character index into the answer (FinishEvent.text) of the earlier occurrence


@dataclass(frozen=True)
class FinishEvent:
    """Always the last event of a request."""

    finish_reason: FinishReason
    num_prompt_tokens: int
    num_completion_tokens: int
    num_recomputed_tokens: int  # context tokens recomputed in every layer (suffix tokens not counted)
    recompute_ratio: float  # num_recomputed_tokens / #context tokens (0 when there is no context)
    ttft_s: float  # request start (arrival at the scheduler) → first token sampled
    total_s: float
    mode: Mode = "full"
    selector: SelectorName | None = None  # which selector chose the recomputed tokens (mode blend)
    num_context_tokens: int = 0
    text: str = ""  # the whole answer, as streamed
    repeated_line: RepeatedLine | None = None  # set when finish_reason is "repetition": what was withheld


GenerationEvent = TokenEvent | FinishEvent


@dataclass(frozen=True)
class PromptTimings:
    """Where the prompt pass spent its time (seconds)."""

    total_s: float
    kv_wait_s: float  # time spent inside kv_reader.layer() (storage that is not hidden by compute)
    select_s: float  # choosing the rows: the query scoring pass, or the layers up to the last check layer


@dataclass
class PromptResult:
    """Outcome of the prompt pass of any mode: logits of the last prompt token and the working cache."""

    logits: torch.Tensor  # (vocab,) float32, next-token logits after the last suffix token
    cache: WorkingCache  # K (RoPE'd) and V of every prompt token at every layer; decode appends to it
    mode: Mode
    num_prompt_tokens: int
    num_context_tokens: int
    num_recomputed_tokens: int  # context tokens recomputed through all layers
    selected_positions: torch.Tensor  # (num_recomputed_tokens,) int64 absolute positions, ascending
    selector: SelectorName | None  # which selector chose them (mode blend), else None
    timings: PromptTimings

    @property
    def recompute_ratio(self) -> float:
        if self.num_context_tokens == 0:
            return 0.0
        return self.num_recomputed_tokens / self.num_context_tokens


@dataclass(frozen=True)
class ScoreResult:
    """Teacher-forced scoring of `target_ids` after a prompt (quality benchmark).

    `prompt` is the prompt pass itself, its cache rewound to the prompt's end, so `Engine.answer` can
    decode from it as if nothing had been scored.
    """

    token_nlls: list[float]  # -log p(target_i | prompt, target_<i), nats; empty without targets
    first_token_logits: torch.Tensor  # (vocab,) float32, same as PromptResult.logits
    num_recomputed_tokens: int
    prompt: PromptResult

    @property
    def nll_sum(self) -> float:
        return float(sum(self.token_nlls))

    @property
    def mean_nll(self) -> float:
        return self.nll_sum / max(1, len(self.token_nlls))
