"""A shipped record's check on look-ups among similar chunks (app/calibration/similar.py's check part).

The blend's defaults for those look-ups (`match_window`, `match_span`, `match_extra`: recompute the sentence of the
name the question asks about, on top of the budget) were chosen on the set's tune part. A model's record ships
them only once its check part, asked through /ask (`python -m bench lookup --distractors similar --part check
--ship`), meets the target: the default blend within one right answer of full prefill. The record then says what
it was tuned and checked on (`measured["similar_check"]`), so /api/stats' record and the file tell the same story.

The second shape, pages holding several named values (`--shape several`), is a check part of its own with the same
target, recorded as `measured["similar_several_check"]`; nothing was tuned on it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from app.calibration.check_record import unrecorded, write_check

# Where the match_* defaults were chosen (engine/config.py): the tune part, which shares no template, value form or
# name with the check part (docs/benchmarks.md, "Exact values among similar chunks").
TUNED_ON = (
    "similar look-ups, tune part (seed 0, 12 and 30 cases): match_window, match_span, match_extra; match_scope: "
    "nq6 (20 dev examples) and this check part, where its first form (spans only when one chunk holds any named "
    "token) answered 6 of 12"
)
# The several-values shape came after those choices: nothing was tuned on it, in either part.
TUNED_ON_SEVERAL = "nothing tuned on pages holding several values (the match_* defaults: " + TUNED_ON + ")"
RIGHT_WITHIN = 1
TARGET = f"default blend within {RIGHT_WITHIN} right answer of full prefill"
MATCH_FIELDS = ("match_window", "match_span", "match_extra")
# The record key of each shape's check.
MEASURED_KEYS = {"one": "similar_check", "several": "similar_several_check"}
_SHAPE_WORDS = {"one": "one value a page", "several": "several named values a page"}


@dataclass(frozen=True)
class SimilarCheck:
    """What one check run measured: right answers per mode on `num_cases` check cases drawn with `seed`."""

    seed: int
    num_cases: int
    num_right_full: int
    num_right_reuse: int
    num_right_blend: int
    blend: dict[str, Any]  # the default blend's settings (BlendConfig fields) the run asked with
    checked_at: str  # ISO 8601 UTC
    shape: str = "one"  # app/calibration/similar.py's shapes: "one" or "several" values a page
    # Whether the prompts opened their context with the lead-in (engine.chunk_lead_in); None: not recorded (runs
    # before the setting existed, which had none).
    chunk_lead_in: bool | None = None

    @property
    def meets_target(self) -> bool:
        return not self.misses()

    def misses(self) -> list[str]:
        """What the blend missed the target by, in words (empty when it meets it)."""
        return target_misses(self.num_cases, self.num_right_full, self.num_right_blend)

    def to_dict(self) -> dict[str, Any]:
        return {
            "tuned_on": TUNED_ON if self.shape == "one" else TUNED_ON_SEVERAL,
            "checked_on": (
                f"similar look-ups, check part (seed {self.seed}, {self.num_cases} cases, through /ask)"
                if self.shape == "one"
                else f"similar look-ups, {_SHAPE_WORDS[self.shape]}, check part (seed {self.seed}, "
                f"{self.num_cases} cases, through /ask)"
            ),
            "target": TARGET,
            "meets_target": self.meets_target,
            **asdict(self),
        }


def target_misses(num_cases: int, num_right_full: int, num_right_blend: int) -> list[str]:
    """What the default blend's right answers miss the target by, in words (empty when they meet it)."""
    if num_right_blend >= num_right_full - RIGHT_WITHIN:
        return []
    return [f"{num_right_blend} of {num_cases} right against full prefill's {num_right_full}"]


def entry_misses(entry: dict[str, Any]) -> list[str]:
    """What a recorded check (`measured["similar_check"]` or `["similar_several_check"]`, as `to_dict` wrote it)
    misses by today's target."""
    if missing := unrecorded(entry, ("num_cases", "num_right_full", "num_right_blend")):
        return missing
    return target_misses(entry["num_cases"], entry["num_right_full"], entry["num_right_blend"])


class SimilarCheckError(ValueError):
    """The check cannot be recorded: the target is missed, or no record of this model and dtype ships."""


def record_similar_check(check: SimilarCheck, model: str, compute_dtype: str, fingerprint: str) -> Path:
    """Write `check` into the shipped record of `model` in `compute_dtype` (its `measured["similar_check"]`, or
    `measured["similar_several_check"]` for pages holding several values).

    Refused when the check misses the target (a record ships only a passing check), when no record ships for the
    model and dtype, or when that record was measured on other weights (another fingerprint)."""
    if check.shape not in MEASURED_KEYS:
        raise SimilarCheckError(f"unknown shape {check.shape!r}")
    if not check.meets_target:
        raise SimilarCheckError(
            f"not recorded: the default blend answered {check.num_right_blend} of {check.num_cases} against full "
            f"prefill's {check.num_right_full} ({TARGET}; {_SHAPE_WORDS[check.shape]})"
        )
    return write_check(
        MEASURED_KEYS[check.shape], check.to_dict(), model, compute_dtype, fingerprint, SimilarCheckError
    )
