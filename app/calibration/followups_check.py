"""A shipped record's check on follow-up questions: a value asked for by "that project" in a second turn.

Turn 1 names a made-up project ("Tell me about project X."), turn 2 asks for its access code without naming it
("What is the access code of that project?"). `python -m bench conversation --ship` asks both turns on the /ask
path (a stored conversation) and on the /v1 path (the messages array), in the default blend and in full prefill,
and writes what it saw into the shipped record of the model and dtype (`measured["followups_check"]`) only when
the target is met on both paths: the default blend within one right answer of full prefill.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from app.calibration.check_record import unrecorded, write_check

MEASURED_KEY = "followups_check"
RIGHT_WITHIN = 1
TARGET = f"default blend within {RIGHT_WITHIN} right answer of full prefill, on /ask and on /v1"
PATHS = ("ask", "v1")


@dataclass(frozen=True)
class FollowupsCheck:
    """Right second-turn answers per path and mode over `num_projects` made-up projects drawn with `seed`."""

    seed: int
    num_projects: int
    num_right_full: dict[str, int]  # path ("ask", "v1") -> right answers of full prefill
    num_right_blend: dict[str, int]  # path -> right answers of the default blend
    num_in_top3: dict[str, int]  # path -> second turns whose project page was among the top 3 sources
    blend: dict[str, Any]  # the default blend's settings (BlendConfig fields) the run asked with
    checked_at: str  # ISO 8601 UTC
    chunk_lead_in: bool | None = None  # whether the prompts opened their context with the lead-in

    @property
    def meets_target(self) -> bool:
        return not self.misses()

    def misses(self) -> list[str]:
        """Each path where the blend falls short, in words (empty when it meets the target)."""
        return target_misses(self.num_right_full, self.num_right_blend)

    def to_dict(self) -> dict[str, Any]:
        return {
            "checked_on": f"follow-up look-ups ({self.num_projects} made-up projects, seed {self.seed}): turn 2 asks "
            "for the code of 'that project', through /ask and /v1",
            "target": TARGET,
            "meets_target": self.meets_target,
            **asdict(self),
        }


def target_misses(num_right_full: dict[str, int], num_right_blend: dict[str, int]) -> list[str]:
    """Each path where the default blend's right answers fall short of the target, in words (a path without a count
    misses too: the target asks for both)."""
    out = []
    for path in PATHS:
        if path not in num_right_full or path not in num_right_blend:
            out.append(f"/{path}: not recorded")
        elif num_right_blend[path] < num_right_full[path] - RIGHT_WITHIN:
            out.append(f"/{path}: {num_right_blend[path]} right against full prefill's {num_right_full[path]}")
    return out


def entry_misses(entry: dict[str, Any]) -> list[str]:
    """What a recorded check (`measured["followups_check"]`, as `to_dict` wrote it) misses by today's target."""
    if missing := unrecorded(entry, ("num_right_full", "num_right_blend")):
        return missing
    return target_misses(entry["num_right_full"], entry["num_right_blend"])


class FollowupsCheckError(ValueError):
    """The check cannot be recorded: the target is missed, or no record of this model and dtype ships."""


def record_followups_check(check: FollowupsCheck, model: str, compute_dtype: str, fingerprint: str) -> Path:
    """Write `check` into the shipped record of `model` in `compute_dtype` (`measured["followups_check"]`).

    Refused when it misses the target on either path, when no record ships for the model and dtype, or when that
    record was measured on other weights (another fingerprint)."""
    if not check.meets_target:
        raise FollowupsCheckError(f"not recorded: {'; '.join(check.misses())} ({TARGET})")
    return write_check(MEASURED_KEY, check.to_dict(), model, compute_dtype, fingerprint, FollowupsCheckError)
