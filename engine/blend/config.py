"""`BlendConfig`: how a blend picks the context rows it recomputes. Declared once, here.

`EngineSettings.blend` nests it (settings file key `engine.blend.*`, env `BLENDRAG_ENGINE__BLEND__*`; the flat
keys of earlier releases, `engine.recompute_ratio` …, are read as aliases), the calibration records hold its
field names, and every request carries one. Its defaults are the product's: what a user runs when nothing is
set and no calibration record is in force (app/calibration says which record is).

Up-front selectors (`query`, `first_k`, `random`) choose their rows before the prompt pass; those rows and the
suffix are fresh in every layer, every other context row keeps its stored KV. `query` first runs the suffix
rows alone through layers 0…max(score_layers) over the reused cache and scores each context token by the
question's attention to it (engine/blend/scoring.py). The check-layer selector (`deviation`, CacheBlend §4)
computes every non-prefix row through layers 0…check_layers[0]; at check layer i it keeps `ratios()[i] · N` of
the context rows still selected (suffix rows are always kept).
"""

from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

SelectorName = Literal["query", "deviation", "first_k", "random"]
SELECTORS: tuple[SelectorName, ...] = get_args(SelectorName)
ScoreFuse = Literal["mean", "max"]
ScoreBy = Literal["attention", "output"]
MatchSpan = Literal["window", "sentence", "whole_sentence"]
SENTENCE_SPANS: tuple[MatchSpan, ...] = ("sentence", "whole_sentence")  # `reads_sentence_ends`
MatchScope = Literal["any", "one"]
StaleKeyScope = Literal["all", "unnamed"]
DeviationOn = Literal["v", "k"]


class BlendConfig(BaseModel):
    """The blend's knobs (frozen). Build with keywords; `replace(**changes)` validates a changed copy."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    recompute_ratio: float = Field(
        default=0.15,
        ge=0.0,
        le=1.0,
        description="the share of context tokens recomputed; unless set here, the model's calibrated or shipped "
        "value is in force (app/calibration)",
    )
    selector: SelectorName = Field(
        default="query",
        description="which context tokens are recomputed: query (question attention, chosen before the pass), "
        "deviation (CacheBlend, at the check layers), first_k, random",
    )
    # query selector
    score_layers: tuple[int, ...] = Field(default=(12,), description="query: layers whose attention scores")
    score_fuse: ScoreFuse = Field(default="mean", description="query: how several score layers combine")
    score_by: ScoreBy = Field(
        default="attention", description="query: attention weight alone, or weight × ‖value‖ (what the key adds)"
    )
    pool_window: int = Field(default=1, ge=1, description="query: max-pool scores over this many neighbours (odd)")
    min_per_chunk: int = Field(default=0, ge=0, description="query: tokens every chunk keeps at least")
    # EPIC's attention sinks: a segment's opening tokens were computed behind the prefix alone.
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
        description="match_window: how far after a matched token the recompute runs: window (match_window tokens), "
        "sentence (to the end of its sentence, table row or block, at most match_window tokens) or whole_sentence "
        "(the same, and back to the sentence's start, at most match_window tokens before it)",
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
    match_labels: bool = Field(
        default=False,
        description="match_scope one: in the chunk the question singles out, also recompute where the question's "
        "other words stand (a label such as 'rack position' beside its value on a page holding several; a word at "
        "most twice in that chunk, matched case-blind, 5-letter stems alike), each with its span",
    )
    stale_key_bias: float = Field(
        default=0.0,
        ge=0.0,
        le=16.0,
        description="up-front selectors: attention-logit bias against the stored context keys a blend does not "
        "recompute (they over-attract the question); 0: off",
    )
    stale_key_scope: StaleKeyScope = Field(
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
    # deviation selector
    check_layers: tuple[int, ...] = Field(
        default=(1,), description="deviation: the layers where KV deviation is measured and rows dropped"
    )
    ratio_schedule: tuple[float, ...] | None = Field(
        default=None,
        description="deviation: the share kept at each check layer (gradual filtering); null: recompute_ratio at all",
    )
    deviation_on: DeviationOn = Field(
        default="v", description="deviation: compare fresh and stored V (CacheBlend) or pre-RoPE K"
    )
    seed: int = Field(default=0, ge=0, description="random selector: the seed of its choice")

    @field_validator("score_layers", "check_layers")
    @classmethod
    def _increasing(cls, layers: tuple[int, ...]) -> tuple[int, ...]:
        if not layers:
            raise ValueError("must name at least one layer")
        if any(layer < 0 for layer in layers) or any(b <= a for a, b in zip(layers, layers[1:], strict=False)):
            raise ValueError(f"must be non-negative and strictly increasing, got {list(layers)}")
        return layers

    @field_validator("pool_window")
    @classmethod
    def _odd(cls, value: int) -> int:
        if value % 2 == 0:
            raise ValueError(f"pool_window must be an odd number >= 1, got {value}")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> BlendConfig:
        if not self.ratio_min <= self.ratio_max:
            raise ValueError(
                f"need 0 <= ratio_min <= ratio_max <= 1 (the adaptive budget's bounds), got {self.ratio_min}, "
                f"{self.ratio_max}"
            )
        schedule = self.ratio_schedule
        if schedule is not None:
            if len(schedule) != len(self.check_layers):
                raise ValueError(
                    f"ratio_schedule has {len(schedule)} entries but check_layers has {len(self.check_layers)}"
                )
            if any(not 0.0 <= r <= 1.0 for r in schedule):
                raise ValueError(f"ratio_schedule entries must be within [0, 1], got {list(schedule)}")
            if any(b > a for a, b in zip(schedule, schedule[1:], strict=False)):
                raise ValueError(f"ratio_schedule must not increase (gradual filtering), got {list(schedule)}")
        return self

    @property
    def upfront(self) -> bool:
        """Whether the selector decides before the prompt pass (no layer runs on every context row)."""
        return self.selector != "deviation"

    @property
    def reads_sentence_ends(self) -> bool:
        """Whether the question's spans run to sentence ends (engine.blend.spans), which the plan then needs."""
        return self.match_window > 0 and self.match_span in SENTENCE_SPANS

    def ratios(self) -> tuple[float, ...]:
        """The keep ratio applied at each check layer."""
        if self.ratio_schedule is not None:
            return self.ratio_schedule
        return tuple(self.recompute_ratio for _ in self.check_layers)

    def replace(self, **changes: Any) -> BlendConfig:
        """A copy with `changes`, validated as a whole (pydantic's model_copy checks nothing)."""
        return BlendConfig.model_validate(self.model_dump() | changes)

    def for_request(self, recompute_ratio: float | None = None, selector: SelectorName | None = None) -> BlendConfig:
        """These settings with a request's own ratio and selector where it gives them. A fixed share replaces a
        ratio schedule and the adaptive budget."""
        changes: dict[str, Any] = {}
        if recompute_ratio is not None:
            changes |= {"recompute_ratio": recompute_ratio, "ratio_schedule": None, "attention_share": None}
        if selector is not None:
            changes["selector"] = selector
        return self.replace(**changes) if changes else self


# The blend's field names: the keys of calibration records, study files and the old flat settings.
BLEND_FIELDS: tuple[str, ...] = tuple(BlendConfig.model_fields)
