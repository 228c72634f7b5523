"""Calibration records kept in the data dir: one file per model fingerprint, written atomically."""

from __future__ import annotations

import logging
from pathlib import Path

from app.calibration.record import BlendSettingsRecord
from fsio.atomic import write_text_atomic

logger = logging.getLogger(__name__)

CALIBRATION_DIR = "calibration"


class CalibrationStore:
    """`<data dir>/calibration/<fingerprint>.json`. A missing or unreadable file is "not calibrated yet"."""

    def __init__(self, data_dir: Path) -> None:
        self.dir = Path(data_dir) / CALIBRATION_DIR

    def path(self, fingerprint: str) -> Path:
        if not fingerprint or not all(c in "0123456789abcdef" for c in fingerprint):
            raise ValueError(f"a model fingerprint is lower-case hex, got {fingerprint!r}")
        return self.dir / f"{fingerprint}.json"

    def load(self, fingerprint: str) -> BlendSettingsRecord | None:
        path = self.path(fingerprint)
        try:
            record = BlendSettingsRecord.from_json(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, TypeError) as exc:
            logger.warning("calibration record %s unreadable (%s); the model is calibrated again", path, exc)
            return None
        if record.fingerprint != fingerprint:
            logger.warning("calibration record %s is of another fingerprint; ignored", path)
            return None
        return record

    def save(self, record: BlendSettingsRecord) -> Path:
        """Write the record (temp file + rename: a reader sees the old file or the new one, never half)."""
        path = self.path(record.fingerprint)
        write_text_atomic(path, record.to_json())
        return path
