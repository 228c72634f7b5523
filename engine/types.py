"""Typed values the engine exchanges with its callers (AskService, ingest, bench, the scheduler).

Everything here is plain data: no tensors are created and no model is touched, so importing this
module is cheap and other packages can build requests without loading torch-heavy code paths.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, get_args

if TYPE_CHECKING:
    import torch

    from engine.working_cache import WorkingCache
    from kvcache.types import LayerKVSource

Mode = Literal["blend", "full", "prefix", "reuse"]
MODES: tuple[Mode, ...] = get_args(Mode)
SelectorName = Literal["query", "deviation", "first_k", "random"]
SELECTORS: tuple[SelectorName, ...] = get_args(SelectorName)
ScoreFuse = Literal["mean", "max"]
ScoreBy = Literal["attention", "output"]
MatchSpan = Literal["window", "sentence"]
MatchScope = Literal["any", "one"]
StaleKeyScope = Literal["all", "unnamed"]
# "repetition": stop_on_repeated_line ended a loop before its first repeated sentence was sent.
FinishReason = Literal["stop", "length", "cancelled", "repetition"]


class EngineError(RuntimeError):
    """A request could not be run (bad layout, KV shape mismatch, model failure)."""


class EngineBusy(EngineError):
    """The scheduler's queue is full; the caller should retry later (HTTP 503)."""


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
class BlendConfig:
    """How the `blend` mode picks the context tokens it recomputes (see engine/selectors.py).

    Up-front selectors (`query`, `first_k`, `random`) choose `recompute_ratio · N` context rows before the
    prompt pass; those rows and the suffix are fresh in every layer, all other context rows keep their
    stored KV. `query` first runs the suffix rows alone through layers 0…max(score_layers) over the reused
    cache and scores each context token by the question's attention to it at `score_layers` (fused by
    `score_fuse`), optionally max-pooled over `pool_window` neighbours, with `min_per_chunk` per chunk.

    The check-layer selector (`deviation`, CacheBlend §4) computes every non-prefix row through layers
    0…check_layers[0]; at check layer i it keeps `ratios()[i] · N` of the still-selected context rows
    (suffix rows are always kept); the last ratio is the share recomputed in every later layer.
    """

    recompute_ratio: float = 0.15
    selector: SelectorName = "query"
    # query selector
    score_layers: tuple[int, ...] = (12,)
    score_fuse: ScoreFuse = "mean"
    score_by: ScoreBy = "attention"
    pool_window: int = 1
    min_per_chunk: int = 0
    # up-front selectors: the first `sink_tokens` of every segment are always among the recomputed tokens
    # (EPIC's attention sinks: a segment's opening tokens were computed behind the prefix alone).
    sink_tokens: int = 0
    # up-front selectors: the context tokens the question names (a question token standing in at most a third of
    # the segments: a name, an identifier) and the `match_window` tokens after each are recomputed before the
    # selector picks the rest of the budget; 0: off (engine.phases._question_matches).
    match_window: int = 0
    # how far after a matched token the recompute runs: `window`, match_window tokens; `sentence`, to the end of
    # the token's sentence, table row or block (engine/spans.py), at most match_window tokens.
    match_span: MatchSpan = "window"
    # the matched tokens' rows recomputed on top of the budget, at most this share of the context tokens (the
    # selector keeps its whole budget for what the question attends); 0: they come out of the budget.
    match_extra: float = 0.0
    # where the spans go: `any`, at every named token; `one`, only in the retrieved chunk holding more of the
    # question's named tokens than any other (a look-up singling out one page among similar ones; a tie, as an open
    # question whose words stand here and there gives, gets none) and in the earlier turns (engine.phases._singled_out).
    match_scope: MatchScope = "any"
    # up-front selectors: subtracted from the attention logit every row computed over the pass's cache (the
    # question, the recomputed rows, every answer token) gives a stored context key that was not recomputed.
    # Such a key was computed behind the prefix alone, as if its segment opened the document, and draws more
    # of the question's attention than it does in full prefill, the more so the later its segment sits; the
    # exact first segment keeps no bias. 0 leaves attention as it is (docs/benchmarks.md, "Stale keys").
    stale_key_bias: float = 0.0
    # which stale keys get the bias: `all`, or `unnamed`: only those of the segments holding no token the question
    # names (a name in at most a third of the segments, as match_window reads it); a question naming none: no bias.
    stale_key_scope: StaleKeyScope = "all"
    # up-front selectors, conversations: the share of the earlier turns' tokens recomputed, on a budget of
    # its own (None: the turns' tokens compete with the chunks' for recompute_ratio · N).
    history_ratio: float | None = None
    # query selector, adaptive budget: when set, keep the fewest top tokens that hold this share of the
    # question's attention to the context (instead of recompute_ratio · N), clamped to [ratio_min, ratio_max].
    attention_share: float | None = None
    ratio_min: float = 0.05
    ratio_max: float = 0.30
    # deviation selector
    check_layers: tuple[int, ...] = (1,)
    ratio_schedule: tuple[float, ...] | None = None
    deviation_on: Literal["v", "k"] = "v"
    seed: int = 0  # only the `random` selector uses it

    def __post_init__(self) -> None:
        if not 0.0 <= self.recompute_ratio <= 1.0:
            raise ValueError(f"recompute_ratio must be within [0, 1], got {self.recompute_ratio}")
        if self.selector not in SELECTORS:
            raise ValueError(f"selector must be one of {list(SELECTORS)}, got {self.selector!r}")
        object.__setattr__(self, "score_layers", _increasing(self.score_layers, "score_layers"))
        if self.score_fuse not in ("mean", "max"):
            raise ValueError(f"score_fuse must be 'mean' or 'max', got {self.score_fuse!r}")
        if self.score_by not in ("attention", "output"):
            raise ValueError(f"score_by must be 'attention' or 'output', got {self.score_by!r}")
        if self.pool_window < 1 or self.pool_window % 2 == 0:
            raise ValueError(f"pool_window must be an odd number >= 1, got {self.pool_window}")
        if self.min_per_chunk < 0:
            raise ValueError(f"min_per_chunk must be >= 0, got {self.min_per_chunk}")
        if self.sink_tokens < 0:
            raise ValueError(f"sink_tokens must be >= 0, got {self.sink_tokens}")
        if self.match_window < 0:
            raise ValueError(f"match_window must be >= 0, got {self.match_window}")
        if self.match_span not in ("window", "sentence"):
            raise ValueError(f"match_span must be 'window' or 'sentence', got {self.match_span!r}")
        if self.match_scope not in ("any", "one"):
            raise ValueError(f"match_scope must be 'any' or 'one', got {self.match_scope!r}")
        if not 0.0 <= self.match_extra <= 1.0:
            raise ValueError(f"match_extra must be within [0, 1], got {self.match_extra}")
        if not 0.0 <= self.stale_key_bias <= 16.0:
            raise ValueError(f"stale_key_bias must be within [0, 16], got {self.stale_key_bias}")
        if self.stale_key_scope not in ("all", "unnamed"):
            raise ValueError(f"stale_key_scope must be 'all' or 'unnamed', got {self.stale_key_scope!r}")
        if self.history_ratio is not None and not 0.0 <= self.history_ratio <= 1.0:
            raise ValueError(f"history_ratio must be within [0, 1], got {self.history_ratio}")
        if self.attention_share is not None and not 0.0 < self.attention_share <= 1.0:
            raise ValueError(f"attention_share must be within (0, 1], got {self.attention_share}")
        if not 0.0 <= self.ratio_min <= self.ratio_max <= 1.0:
            raise ValueError(
                f"need 0 <= ratio_min <= ratio_max <= 1 (the adaptive budget's bounds), got {self.ratio_min}, "
                f"{self.ratio_max}"
            )
        layers = _increasing(self.check_layers, "check_layers")
        object.__setattr__(self, "check_layers", layers)
        if self.ratio_schedule is not None:
            schedule = tuple(float(r) for r in self.ratio_schedule)
            if len(schedule) != len(layers):
                raise ValueError(f"ratio_schedule has {len(schedule)} entries but check_layers has {len(layers)}")
            if any(not 0.0 <= r <= 1.0 for r in schedule):
                raise ValueError(f"ratio_schedule entries must be within [0, 1], got {list(schedule)}")
            if any(b > a for a, b in zip(schedule, schedule[1:], strict=False)):
                raise ValueError(f"ratio_schedule must not increase (gradual filtering), got {list(schedule)}")
            object.__setattr__(self, "ratio_schedule", schedule)
        if self.deviation_on not in ("v", "k"):
            raise ValueError(f"deviation_on must be 'v' or 'k', got {self.deviation_on!r}")

    @property
    def upfront(self) -> bool:
        """Whether the selector decides before the prompt pass (no layer runs on every context row)."""
        return self.selector != "deviation"

    def ratios(self) -> tuple[float, ...]:
        """The keep ratio applied at each check layer."""
        if self.ratio_schedule is not None:
            return self.ratio_schedule
        return tuple(self.recompute_ratio for _ in self.check_layers)


def _increasing(layers: tuple[int, ...], name: str) -> tuple[int, ...]:
    layers = tuple(int(layer) for layer in layers)
    if not layers:
        raise ValueError(f"{name} must name at least one layer")
    if any(layer < 0 for layer in layers) or any(b <= a for a, b in zip(layers, layers[1:], strict=False)):
        raise ValueError(f"{name} must be non-negative and strictly increasing, got {list(layers)}")
    return layers


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


@dataclass
class GenerationRequest:
    """One question to answer. `kv_source` serves the chunks' stored KV; None forces mode `full`."""

    request_id: str
    layout: PromptLayout
    kv_source: LayerKVSource | None = None
    mode: Mode = "blend"
    blend: BlendConfig = field(default_factory=BlendConfig)
    sampling: SamplingParams = field(default_factory=SamplingParams)


@dataclass(frozen=True)
class TokenEvent:
    """One generated token. `text` is the new printable text (may be "" while a multi-byte character or a
    possible stop string is still incomplete); concatenating all `text`s gives the final answer."""

    text: str
    token_id: int


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


GenerationEvent = TokenEvent | FinishEvent


@dataclass(frozen=True)
class PromptTimings:
    """Where the prompt pass spent its time (seconds)."""

    total_s: float
    kv_wait_s: float  # time spent inside kv_source.layer() (storage that is not hidden by compute)
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
