"""Which of a record's check parts hold for the blend settings in force, as /api/stats and the admin page show them.

A record ships only when every check part meets its target (`python -m bench ship`); each passing part is kept in
the record's `measured` with the blend settings it ran on. What an operator needs to know is whether those checks
speak for the settings the server answers with: a part is "met" when its entry's settings are the ones in force and
its figures meet the part's target as it is today, "other settings" when the operator (or a later calibration)
changed a setting it ran on, "below target" when it ran on the settings in force and its figures miss today's target
(a target tightened after the entry was written: the held-out part gained the answers' gold F1), and "not recorded"
when the record has no entry for it: never run on it, or run and missed (a check part writes only a pass, and a
record from before `bench ship` shipped whatever its check parts said).

`CHECK_PARTS` is the one list of the parts: their measured keys, titles and how each judges a recorded entry
(`entry_misses`); the gate (bench/ship.py) and its `--resume` read it too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Literal, TypeVar

from app.calibration import followups_check, heldout_check, long_answers_check, similar_check
from app.calibration.record import BlendSettingsRecord


def _similar_summary(entry: dict[str, Any]) -> str:
    return f"{entry['num_right_blend']} of {entry['num_cases']} right (full prefill {entry['num_right_full']})"


def _followups_summary(entry: dict[str, Any]) -> str:
    blend, full = entry["num_right_blend"], entry["num_right_full"]
    return (
        f"/ask {blend['ask']}, /v1 {blend['v1']} of {entry['num_projects']} right (full prefill {full['ask']}, "
        f"{full['v1']})"
    )


def _heldout_summary(entry: dict[str, Any]) -> str:
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
        line += f"; gold-answer F1 {entry['f1_blend']:.2f} (full prefill {entry['f1_full']:.2f}"
        if entry.get("f1_loss_ci95"):  # the loss's 95% interval, measured since it was reported
            lo, hi = entry["f1_loss_ci95"]
            line += f"; loss 95% [{lo:.2f}, {hi:.2f}]"
        line += ")"
    return line


def _long_answers_summary(entry: dict[str, Any]) -> str:
    return (
        f"repetition stops {entry['repetition_blend']} (full prefill {entry['repetition_full']}), unfinished "
        f"{entry['length_blend']} (full prefill {entry['length_full']}) of {entry['num_questions']} answers "
        f"to {entry['max_tokens']} tokens"
    )


_T = TypeVar("_T")


def _read(read: Callable[[dict[str, Any]], _T], entry: dict[str, Any]) -> tuple[_T | None, str | None]:
    """`read(entry)`, or None and why when the entry lacks a figure or holds one of the wrong kind: a record's JSON
    can be edited by hand, and one unreadable entry must not take /api/stats, the admin page or the gate's
    `--resume` down with it."""
    try:
        return read(entry), None
    except KeyError as error:
        return None, f"{error.args[0]} not recorded"
    except (TypeError, ValueError, IndexError) as error:
        return None, f"figures not readable ({error})"


@dataclass(frozen=True)
class CheckPart:
    key: str  # the record's measured key, which the part writes under (and the gate's step name)
    title: str  # what the part asks, in words
    entry_misses: Callable[[dict[str, Any]], list[str]]  # what a recorded entry misses by today's target, in words
    summarize: Callable[[dict[str, Any]], str]  # a recorded entry's figures as a person reads them

    def judge(self, entry: dict[str, Any]) -> list[str]:
        """`entry_misses`, where an entry whose figures cannot be read (a record edited by hand: a figure missing
        or of the wrong kind) misses by that instead of raising."""
        misses, unreadable = _read(self.entry_misses, entry)
        return misses if misses is not None else [str(unreadable)]

    def summary(self, entry: dict[str, Any]) -> str:
        """`summarize`, or why it cannot be written when the entry's figures cannot be read."""
        summary, unreadable = _read(self.summarize, entry)
        return summary if summary is not None else f"not readable: {unreadable}"


# In the order the gate runs them.
CHECK_PARTS: tuple[CheckPart, ...] = (
    CheckPart(
        similar_check.MEASURED_KEYS["one"],
        "look-ups among similar pages",
        similar_check.entry_misses,
        _similar_summary,
    ),
    CheckPart(
        similar_check.MEASURED_KEYS["several"],
        "pages holding several values",
        similar_check.entry_misses,
        _similar_summary,
    ),
    CheckPart(followups_check.MEASURED_KEY, "follow-up look-ups", followups_check.entry_misses, _followups_summary),
    CheckPart(heldout_check.MEASURED_KEY, "held-out questions", heldout_check.entry_misses, _heldout_summary),
    CheckPart(long_answers_check.MEASURED_KEY, "long answers", long_answers_check.entry_misses, _long_answers_summary),
)
CHECK_PART_KEYS = frozenset(part.key for part in CHECK_PARTS)


def find_part(key: str) -> CheckPart | None:
    """The check part that writes under `key`; None for any other key (the calibration's own figures)."""
    return next((part for part in CHECK_PARTS if part.key == key), None)


CheckState = Literal["met", "other settings", "below target", "not recorded"]


@dataclass(frozen=True)
class CheckPartStatus:
    name: str  # the record's measured key
    title: str
    state: CheckState
    summary: str | None  # the part's figures in words; None when not recorded
    differs_in: tuple[str, ...] = ()  # blend settings in force that differ from those the part ran on
    misses: tuple[str, ...] = ()  # what its entry misses today's target by, in words ("below target")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"differs_in": list(self.differs_in), "misses": list(self.misses)}


def check_parts(
    record: BlendSettingsRecord | None, in_force: dict[str, Any], chunk_lead_in: bool = False
) -> list[CheckPartStatus]:
    """Each check part of `record` against `in_force` (every blend setting in force, BlendConfig field names) and
    the prompts' lead-in in force (engine.chunk_lead_in: it changes every stored chunk's KV)."""
    measured = record.measured if record is not None else {}
    statuses = []
    for part in CHECK_PARTS:
        name, title = part.key, part.title
        entry = measured.get(name)
        if not isinstance(entry, dict):
            statuses.append(CheckPartStatus(name, title, "not recorded", None))
            continue
        ran_on: dict[str, Any] = entry.get("blend") or {}
        # Only the fields both know: a setting added after the check ran is at its default, which it ran with.
        differs = tuple(key for key, value in ran_on.items() if key in in_force and in_force[key] != value)
        if bool(entry.get("chunk_lead_in")) != chunk_lead_in:  # None: recorded before the setting, which had none
            differs += ("chunk_lead_in",)
        # Settings first: figures taken on other settings say nothing of these, whatever target they meet.
        misses = () if differs else tuple(part.judge(entry))
        state: CheckState = "other settings" if differs else "below target" if misses else "met"
        statuses.append(CheckPartStatus(name, title, state, part.summary(entry), differs, misses))
    return statuses
