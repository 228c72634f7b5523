"""Which of a record's check parts hold for the blend settings in force, as /api/stats and the admin page show them.

A record ships only when every check part meets its target (`python -m bench ship`); each passing part is kept in
the record's `measured` with the blend settings it ran on. What an operator needs to know is whether those checks
speak for the settings the server answers with: a part is "met" when its entry's settings are the ones in force,
"other settings" when the operator (or a later calibration) changed a setting it ran on, and "not recorded" when the
record has no entry for it: never run on it, or run and missed (a check part writes only a pass, and a record
from before `bench ship` shipped whatever its check parts said).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

from app.calibration import followups_check, heldout_check, long_answers_check, similar_check
from app.calibration.record import BlendSettingsRecord

# measured key (the key each part writes under), what the part asks, in the order they run
CHECK_PARTS: tuple[tuple[str, str], ...] = (
    (similar_check.MEASURED_KEYS["one"], "look-ups among similar pages"),
    (similar_check.MEASURED_KEYS["several"], "pages holding several values"),
    (followups_check.MEASURED_KEY, "follow-up look-ups"),
    (heldout_check.MEASURED_KEY, "held-out questions"),
    (long_answers_check.MEASURED_KEY, "long answers"),
)

CheckState = Literal["met", "other settings", "not recorded"]


@dataclass(frozen=True)
class CheckPartStatus:
    name: str  # the record's measured key
    title: str
    state: CheckState
    summary: str | None  # the part's figures in words; None when not recorded
    differs_in: tuple[str, ...] = ()  # blend settings in force that differ from those the part ran on

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"differs_in": list(self.differs_in)}


def summarize(name: str, entry: dict[str, Any]) -> str:
    """A check part's figures as a person reads them."""
    if name == long_answers_check.MEASURED_KEY:
        return (
            f"repetition stops {entry['repetition_blend']} (full prefill {entry['repetition_full']}), unfinished "
            f"{entry['length_blend']} (full prefill {entry['length_full']}) of {entry['num_questions']} answers "
            f"to {entry['max_tokens']} tokens"
        )
    if name == followups_check.MEASURED_KEY:
        blend, full = entry["num_right_blend"], entry["num_right_full"]
        return (
            f"/ask {blend['ask']}, /v1 {blend['v1']} of {entry['num_projects']} right (full prefill {full['ask']}, "
            f"{full['v1']})"
        )
    if name == heldout_check.MEASURED_KEY:
        line = (
            f"first-token KL {entry['kl_x_reuse']:.2f}× reuse's, benefit retained {entry['benefit_retained']:.2f} "
            f"on {entry['num_examples']} {entry['dataset']} examples"
        )
        windows = entry.get("by_window") or []
        if len(windows) > 1:  # one window is the whole run, already said
            kl = " / ".join(f"{w['kl_x_reuse']:.2f}" for w in windows)
            benefit = " / ".join(f"{w['benefit_retained']:.2f}" for w in windows)
            line += f" (by {heldout_check.WINDOW_EXAMPLES}s: KL {kl}×, benefit {benefit})"
        if "f1_blend" in entry:  # the greedy answers against the answer key
            line += f"; gold-answer F1 {entry['f1_blend']:.2f} (full prefill {entry['f1_full']:.2f})"
        return line
    return f"{entry['num_right_blend']} of {entry['num_cases']} right (full prefill {entry['num_right_full']})"


def check_parts(
    record: BlendSettingsRecord | None, in_force: dict[str, Any], chunk_lead_in: bool = False
) -> list[CheckPartStatus]:
    """Each check part of `record` against `in_force` (every blend setting in force, BlendConfig field names) and
    the prompts' lead-in in force (engine.chunk_lead_in: it changes every stored chunk's KV)."""
    measured = record.measured if record is not None else {}
    statuses = []
    for name, title in CHECK_PARTS:
        entry = measured.get(name)
        if not isinstance(entry, dict):
            statuses.append(CheckPartStatus(name, title, "not recorded", None))
            continue
        ran_on: dict[str, Any] = entry.get("blend") or {}
        # Only the fields both know: a setting added after the check ran is at its default, which it ran with.
        differs = tuple(key for key, value in ran_on.items() if key in in_force and in_force[key] != value)
        if bool(entry.get("chunk_lead_in")) != chunk_lead_in:  # None: recorded before the setting, which had none
            differs += ("chunk_lead_in",)
        state: CheckState = "other settings" if differs else "met"
        statuses.append(CheckPartStatus(name, title, state, summarize(name, entry), differs))
    return statuses
