"""Which blend settings are in force, and where each came from.

Order, per setting: one the operator set explicitly (config file or BLENDRAG_ENGINE__* env; pydantic's
`model_fields_set` tells it from a default) > this model's calibration record (data dir, this fingerprint) >
the record shipped for this model > safe settings (a model nobody measured: a larger share recomputed and a
conversation's turns recomputed whole, until the background calibration replaces them).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from app.calibration.check_parts import check_parts
from app.calibration.record import BlendSettingsRecord
from engine.blend.config import BlendConfig
from engine.config import EngineSettings

if TYPE_CHECKING:
    from engine.engine import Engine

Origin = Literal["operator", "calibrated", "shipped", "safe"]  # where a blend setting in force came from


def safe_values(num_layers: int) -> dict[str, Any]:
    """Blend settings for a model with no measurement yet: 30% of the context recomputed, earlier turns
    recomputed whole, scored at 40% of the model's depth (a fixed layer index means different depths)."""
    return {"recompute_ratio": 0.3, "history_ratio": 1.0, "score_layers": [max(1, round(0.4 * num_layers))]}


@dataclass(frozen=True)
class BlendInForce:
    """What `resolve` chose for each blend field, and where it came from. Once `apply` has handed the values to
    the engine, `Engine.settings` is the one copy in force: the engine, the services and /api/stats read it, and
    this object is only their provenance."""

    values: dict[str, Any]  # every blend field (BlendConfig's), validated as a whole
    origin: Origin  # where the non-operator settings came from
    label: str  # "calibrated on …", "shipped for <model> …", "safe (not calibrated yet)"
    operator_fields: tuple[str, ...]  # blend settings the operator set (these win over any record)
    record: BlendSettingsRecord | None = None

    @property
    def described(self) -> str:
        """The label, with the settings the operator set named (what `Engine.blend_origin` says)."""
        return self.label + (f"; operator set {', '.join(self.operator_fields)}" if self.operator_fields else "")

    def describe(self, in_force: EngineSettings) -> dict[str, Any]:
        """For /api/stats, the admin page and bench headers: the values of `in_force` (the engine's settings)."""
        values = in_force.blend.model_dump(mode="json")
        return {
            "source": self.origin,  # the wire name /api/stats has always had
            "label": self.described,
            "operator_fields": list(self.operator_fields),
            "values": values,
            "measured": self.record.measured.get("chosen") if self.record is not None else None,
            "check_parts": [s.to_dict() for s in check_parts(self.record, values, in_force.chunk_lead_in)],
        }


def resolve(
    engine_settings: EngineSettings,
    num_layers: int,
    *,
    calibrated: BlendSettingsRecord | None = None,
    shipped: BlendSettingsRecord | None = None,
) -> BlendInForce:
    """The settings in force for a model with these records (either may be None)."""
    # Declaration order, whichever way the operator wrote them (engine.blend.*, or the old flat keys).
    operator = tuple(name for name in BlendConfig.model_fields if name in engine_settings.blend.model_fields_set)
    if calibrated is not None:
        record, origin, values = calibrated, "calibrated", calibrated.values
        label = calibrated.label()
    elif shipped is not None:
        record, origin, values = shipped, "shipped", shipped.values
        label = f"shipped for {shipped.model} ({shipped.label()})"
    else:
        record, origin, values = None, "safe", safe_values(num_layers)
        label = "safe settings (this model is not calibrated yet)"
    update = {name: value for name, value in values.items() if name not in operator}
    # Validated as a whole (BlendConfig's rules), as a settings file would be.
    chosen = engine_settings.blend.replace(**update).model_dump(mode="json")
    return BlendInForce(chosen, origin, label, operator, record)  # type: ignore[arg-type]


def blend_in_force(engine: Engine, engine_settings: EngineSettings, data_dir: Path | None) -> BlendInForce:
    """The settings in force for the engine's model: its calibration record under `data_dir` (None: none
    looked up, as in bench), else the record shipped for the model (in the engine's compute dtype where one
    was measured in it), else the safe settings."""
    from app.calibration.shipped import model_name, shipped_blend_settings
    from app.calibration.store import CalibrationStore

    calibrated = CalibrationStore(data_dir).load(engine.fingerprint) if data_dir is not None else None
    shipped = shipped_blend_settings(model_name(engine_settings.model), str(engine.dtype).removeprefix("torch."))
    return resolve(engine_settings, engine.config.num_layers, calibrated=calibrated, shipped=shipped)


def apply(engine: Engine, in_force: BlendInForce) -> None:
    """Make `in_force` the engine's default blend (every request without its own ratio or selector)."""
    engine.use_blend(BlendConfig.model_validate(in_force.values), in_force.described)
