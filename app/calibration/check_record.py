"""A check part's figures written into a shipped record (`measured[key]`), only on the weights it was measured on.

Shared by the record's check parts (similar_check.py, followups_check.py, heldout_check.py, long_answers_check.py):
each decides whether its check meets its target and refuses to record one that misses; this writes a passing one
beside what the calibration measured. Each part also judges a recorded entry by its target as it is today
(`entry_misses`): an entry written before a target changed may not meet it, and an entry that lacks a figure the
target now reads cannot (`unrecorded`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

from app.calibration.record import BlendSettingsRecord
from app.calibration.shipped import shipped_path
from fsio.atomic import write_text_atomic


def write_check(
    key: str, entry: dict[str, Any], model: str, compute_dtype: str, fingerprint: str, error: type[ValueError]
) -> Path:
    """Set `measured[key]` of the shipped record of `model` in `compute_dtype` to `entry`; `error` (the check's
    own exception) when no record ships for the model and dtype or that record was measured on other weights."""
    path = shipped_path(model, compute_dtype)
    try:
        record = BlendSettingsRecord.from_json(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise error(f"no shipped record for {model} in {compute_dtype} ({path}): calibrate first") from None
    if record.fingerprint != fingerprint:
        raise error(
            f"the shipped record {path.name} was measured on fingerprint {record.fingerprint[:12]}, this engine is "
            f"{fingerprint[:12]}"
        )
    write_text_atomic(path, replace(record, measured=record.measured | {key: entry}).to_json())
    return path


def unrecorded(entry: dict[str, Any], keys: Iterable[str]) -> list[str]:
    """The figures among `keys` that a recorded entry lacks, each as a miss in words: an entry written before its
    target read that figure cannot be said to meet the target."""
    return [f"{key} not recorded (checked before the target read it)" for key in keys if key not in entry]
