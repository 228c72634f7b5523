"""The blend settings the repo ships for its catalogue models, measured with `blendrag calibrate`.

A fresh server on a shipped model starts on its measured settings at once; it still calibrates in the
background when its fingerprint (weights + compute dtype) is not the one the shipped record was measured on.
"""

from __future__ import annotations

import logging
from pathlib import Path

from app.calibration.record import BlendSettingsRecord
from engine.models.catalog import ALIASES, CATALOG

logger = logging.getLogger(__name__)

SHIPPED_DIR = Path(__file__).parent / "shipped"


def model_name(model: str) -> str:
    """The name a model's blend settings are kept under: a catalogue name (an alias such as "builtin" is its
    model's name), a catalogue model's converted directory by that model's name (SmolLM2's is
    `smollm2-135m-instruct`), any other checkpoint directory or GGUF file by its own name."""
    name = Path(ALIASES.get(model, model)).name
    return next((entry.name for entry in CATALOG.values() if entry.converted_dir == name), name)


def shipped_blend_settings(name: str) -> BlendSettingsRecord | None:
    """The shipped record of the model called `name` (a catalogue name), or None."""
    if not name or "/" in name or name.startswith("."):
        return None
    path = SHIPPED_DIR / f"{name}.json"
    try:
        return BlendSettingsRecord.from_json(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError) as exc:  # a broken shipped file is a bug, not a reason to stop
        logger.error("shipped blend settings %s unreadable: %s", path, exc)
        return None
