"""The blend settings a calibration chose for one model, and what it measured there."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from engine.config import BLEND_FIELDS

RECORD_VERSION = 1


@dataclass(frozen=True)
class BlendSettingsRecord:
    """Blend settings (EngineSettings field names, a subset of BLEND_FIELDS) measured on one model.

    `fingerprint` is the engine's (weights + compute dtype): a record measured in bfloat16 is another
    fingerprint's than the same weights in float32, so each dtype a model runs in is calibrated once.
    """

    model: str  # the model's name (catalogue name, or the checkpoint directory's name)
    fingerprint: str
    compute_dtype: str  # "bfloat16", "float32" …
    values: dict[str, Any]  # e.g. {"recompute_ratio": 0.2, "score_layers": [8, 16], "history_ratio": 1.0}
    calibrated_at: str  # ISO 8601 UTC
    calibration_set: str  # what it was measured on (calset.describe())
    measured: dict[str, Any] = field(default_factory=dict)  # the chosen point's figures, the targets, the path
    version: int = RECORD_VERSION

    def __post_init__(self) -> None:
        unknown = set(self.values) - set(BLEND_FIELDS)
        if unknown:
            raise ValueError(f"blend settings record names unknown settings: {sorted(unknown)}")

    def label(self) -> str:
        """Where these settings came from, for /api/stats, the admin page and bench headers."""
        when = self.calibrated_at[:10]
        return f"calibrated on {self.model} ({self.compute_dtype}, fingerprint {self.fingerprint[:12]}) {when}"

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> BlendSettingsRecord:
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("version") != RECORD_VERSION:
            raise ValueError(f"not a version-{RECORD_VERSION} blend settings record")
        fields = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**fields)
