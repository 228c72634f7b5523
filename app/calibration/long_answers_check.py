"""A shipped record's check on whole answers: the docs how-to questions answered to a few hundred tokens.

First-token KL and 32-token look-ups do not see an answer that starts right and then loops or runs on. `python -m
bench long-answers --ship` asks the docs questions (each with a how-to request) through /ask, greedy, in full
prefill and in the server's default blend, and writes what it saw into the shipped record of the model and dtype
(`measured["long_answers_check"]`) only when the target is met: the default blend's answers end on the repetition
stop no more often than full prefill's + 1, and run into the length cap unfinished no more often than full
prefill's + 1, over the questions.

Whole-answer agreement with full prefill is recorded beside it but does not gate: it is a mechanical proxy
(identical answers, or token F1 ≥ the bench's threshold with the same finish reason) that undercounts answers a
reader would judge equally usable. A blend's answer often parts from full prefill's within the first 20-30 tokens
and says the same in other words: read one by one, 10 of 12 default answers were as usable as full prefill's
where the F1 agreement counted 5 of 12 (docs/benchmarks.md, "Answer-aware selection and whole answers").
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from app.calibration.check_record import unrecorded, write_check

MEASURED_KEY = "long_answers_check"
EXTRA_ALLOWED = 1  # repetition stops, and answers cut unfinished, the blend may have beyond full prefill's
TARGET = (
    f"default blend's repetition stops ≤ full prefill's + {EXTRA_ALLOWED} and length (unfinished) ends ≤ full "
    f"prefill's + {EXTRA_ALLOWED} over the questions; whole-answer agreement reported, not gated"
)
AGREEMENT = (
    "identical to full prefill's answer, or token F1 ≥ agree_f1 with the same finish reason: a mechanical proxy "
    "that undercounts answers a reader judges equally usable (10 of 12 read as usable where it counted 5 of 12)"
)


@dataclass(frozen=True)
class LongAnswersCheck:
    """What one run measured: finish reasons per mode and the default blend's answers against full prefill's."""

    num_questions: int
    max_tokens: int
    questions_as: str  # how the questions were asked (written, or with the how-to request)
    finish_full: dict[str, int]  # finish reason -> answers (stop, length, repetition)
    finish_blend: dict[str, int]
    identical: int  # blend answers equal to full prefill's, token for token
    agrees: int  # identical, or F1 ≥ agree_f1 with the same finish reason (AGREEMENT)
    agree_f1: float
    f1_vs_full_mean: float
    divergence_token_median: float | None  # where the differing answers part from full prefill's
    right_full: int  # answers naming what the answer key names
    right_blend: int
    blend: dict[str, Any]  # the default blend's settings (BlendConfig fields) the run asked with
    checked_at: str  # ISO 8601 UTC
    # Whether the prompts opened their context with the lead-in (engine.chunk_lead_in); None: not recorded (runs
    # before the setting existed, which had none).
    chunk_lead_in: bool | None = None

    @property
    def repetition_full(self) -> int:
        return self.finish_full.get("repetition", 0)

    @property
    def repetition_blend(self) -> int:
        return self.finish_blend.get("repetition", 0)

    @property
    def length_full(self) -> int:
        return self.finish_full.get("length", 0)

    @property
    def length_blend(self) -> int:
        return self.finish_blend.get("length", 0)

    @property
    def meets_target(self) -> bool:
        return not self.misses()

    def misses(self) -> list[str]:
        """What the blend missed the target by, in words (empty when it meets it)."""
        return target_misses(
            self.repetition_full, self.repetition_blend, self.length_full, self.length_blend, self.max_tokens
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "checked_on": f"the docs questions of bench/docs_corpus.py ({self.num_questions}, {self.questions_as}), "
            f"greedy to {self.max_tokens} tokens, full prefill and the default blend, through /ask",
            "target": TARGET,
            "meets_target": self.meets_target,
            "agreement": AGREEMENT,
            "repetition_full": self.repetition_full,
            "repetition_blend": self.repetition_blend,
            "length_full": self.length_full,
            "length_blend": self.length_blend,
            **asdict(self),
        }


def target_misses(
    repetition_full: int, repetition_blend: int, length_full: int, length_blend: int, max_tokens: int
) -> list[str]:
    """What the default blend's finish reasons miss the target by, in words (empty when they meet it)."""
    out = []
    if repetition_blend > repetition_full + EXTRA_ALLOWED:
        out.append(f"{repetition_blend} repetition stops against full prefill's {repetition_full}")
    if length_blend > length_full + EXTRA_ALLOWED:
        out.append(f"{length_blend} answers cut at {max_tokens} tokens against full's {length_full}")
    return out


def entry_misses(entry: dict[str, Any]) -> list[str]:
    """What a recorded check (`measured["long_answers_check"]`, as `to_dict` wrote it) misses by today's target."""
    keys = ("repetition_full", "repetition_blend", "length_full", "length_blend", "max_tokens")
    if missing := unrecorded(entry, keys):
        return missing
    return target_misses(*(entry[key] for key in keys))


class LongAnswersCheckError(ValueError):
    """The check cannot be recorded: the target is missed, or no record of this model and dtype ships."""


def record_long_answers_check(check: LongAnswersCheck, model: str, compute_dtype: str, fingerprint: str) -> Path:
    """Write `check` into the shipped record of `model` in `compute_dtype` (`measured["long_answers_check"]`).

    Refused when the check misses the target, when no record ships for the model and dtype, or when that record was
    measured on other weights (another fingerprint)."""
    if not check.meets_target:
        raise LongAnswersCheckError(
            f"not recorded: the default blend's long answers miss the target ({'; '.join(check.misses())} over "
            f"{check.num_questions} questions; {TARGET})"
        )
    return write_check(MEASURED_KEY, check.to_dict(), model, compute_dtype, fingerprint, LongAnswersCheckError)
