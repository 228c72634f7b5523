"""The blend settings the repo ships for its catalogue models, measured with `blendrag calibrate`.

One record per model and compute dtype: `shipped/<model name>.<dtype>.json` (a fingerprint is weights +
compute dtype, so bfloat16 on an AMX CPU and float32 on an AVX2 one are two calibrations). A fresh server on a
shipped model starts on the record of its own dtype at once, and does not calibrate when that record's
fingerprint is its own. With no record in its dtype it starts on the model's record of another dtype (the
same weights' measured settings are a better start than the safe ones) and calibrates in the background.
"""

from __future__ import annotations

import logging
from pathlib import Path

from app.calibration.record import BlendSettingsRecord
from engine.models.catalog import ALIASES, CATALOG

logger = logging.getLogger(__name__)

SHIPPED_DIR = Path(__file__).parent / "shipped"
SHIPPED_DTYPES = ("bfloat16", "float32", "float16")  # the order a record of another dtype is taken in


def model_name(model: str) -> str:
    """The name a model's blend settings are kept under: a catalogue name (an alias such as "builtin" is its
    model's name), a catalogue model's converted directory by that model's name (SmolLM2's is
    `smollm2-135m-instruct`), any other checkpoint directory or GGUF file by its own name."""
    name = Path(ALIASES.get(model, model)).name
    return next((entry.name for entry in CATALOG.values() if entry.converted_dir == name), name)


def shipped_path(name: str, compute_dtype: str) -> Path:
    """Where the record of model `name` measured in `compute_dtype` is shipped."""
    return SHIPPED_DIR / f"{name}.{compute_dtype}.json"


def shipped_records(name: str) -> list[BlendSettingsRecord]:
    """Every shipped record of the model called `name` (a catalogue name), in SHIPPED_DTYPES order."""
    if not name or "/" in name or name.startswith("."):
        return []
    records = []
    for dtype in SHIPPED_DTYPES:
        path = shipped_path(name, dtype)
        try:
            records.append(BlendSettingsRecord.from_json(path.read_text(encoding="utf-8")))
        except FileNotFoundError:
            continue
        except (OSError, ValueError, TypeError) as exc:  # a broken shipped file is a bug, not a reason to stop
            logger.error("shipped blend settings %s unreadable: %s", path, exc)
    return records


def shipped_blend_settings(name: str, compute_dtype: str | None = None) -> BlendSettingsRecord | None:
    """The shipped record of the model called `name` measured in `compute_dtype`; without one, the model's
    record of another dtype (None: the first shipped); None when the model has none."""
    records = shipped_records(name)
    return next((r for r in records if r.compute_dtype == compute_dtype), records[0] if records else None)
