"""Calibration records kept in the data dir: one file per model fingerprint, written atomically."""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

from app.calibration.record import BlendSettingsRecord

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
        self.dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=".calibration-", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(record.to_json())
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path
