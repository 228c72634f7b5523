"""A shipped record of a made-up model "m" in a throw-away directory, for the check parts' tests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from app.calibration import shipped
from app.calibration.record import BlendSettingsRecord

FINGERPRINT = "f" * 64


@pytest.fixture
def ship_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., Path]:
    """Point the shipped records at `tmp_path`; the returned call writes model m's record in a dtype (fingerprint
    FINGERPRINT, calibrated on calset-3) with the values and measured figures given, and returns the directory."""
    monkeypatch.setattr(shipped, "SHIPPED_DIR", tmp_path)

    def write(compute_dtype: str, values: dict[str, Any], measured: dict[str, Any]) -> Path:
        record = BlendSettingsRecord(
            model="m",
            fingerprint=FINGERPRINT,
            compute_dtype=compute_dtype,
            values=values,
            calibrated_at="2026-12-04T00:00:00+00:00",
            calibration_set="calset-3",
            measured=measured,
        )
        (tmp_path / f"m.{compute_dtype}.json").write_text(record.to_json())
        return tmp_path

    return write
