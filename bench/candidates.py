"""A study's blend settings (`--candidates FILE`): read, checked, named and turned into modes.

A study file is a JSON list of objects whose keys are blend settings (engine.config.BLEND_FIELDS), e.g.

    [{"recompute_ratio": 0.15}, {"recompute_ratio": 0.15, "sink_tokens": 4}, {"pool_window": 3}]

One key is not a blend setting but a variant of ingest that only `bench frontier` studies: `stored_context`
(plain, neighbour, unrelated or previous: which text each chunk's stored KV was computed behind,
bench/stored_context.py; without it, the engine's own).

Each candidate is the blend settings in force for the model (shipped or calibrated record, else safe) with
the candidate's values set on top, as an operator's settings file would set them. `bench calibrate` measures
them on the calibration set, `bench frontier` on held-out passages, `bench lookup` through /ask.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from bench.stored_context import STORED_CONTEXTS

STUDY_FIELDS = ("stored_context",)  # candidate keys that are not blend settings

if TYPE_CHECKING:
    from pathlib import Path

    from bench.passes import ModeSpec
    from engine.engine import Engine
    from engine.types import BlendConfig


def read_candidates(path: Path, study_fields: bool = False) -> list[dict[str, Any]]:
    """The study's blend settings, each validated as a blend configuration here, before any model loads
    (the calibration set's preparation alone takes minutes). `study_fields`: whether the reader runs the study
    keys (STUDY_FIELDS; only `bench frontier` does), else a candidate setting one is refused."""
    from engine.blend.config import BLEND_FIELDS, BlendConfig

    allowed = set(BLEND_FIELDS) | (set(STUDY_FIELDS) if study_fields else set())

    try:
        values = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SystemExit(f"--candidates {path}: {exc}") from exc
    if not isinstance(values, list) or not values or not all(isinstance(v, dict) for v in values):
        raise SystemExit(f"--candidates {path}: expected a non-empty JSON list of objects")
    for v in values:
        unknown = sorted(set(v) - allowed)
        if unknown:
            raise SystemExit(f"--candidates {path}: not blend settings: {', '.join(unknown)}")
        if v.get("stored_context", "plain") not in STORED_CONTEXTS:
            raise SystemExit(
                f"--candidates {path}: stored_context must be one of {', '.join(STORED_CONTEXTS)}, "
                f"got {v['stored_context']!r}"
            )
        try:
            BlendConfig.model_validate(blend_values(v))
        except ValueError as exc:  # pydantic's ValidationError is one
            raise SystemExit(f"--candidates {path}: {v}: {exc}") from exc
    keys = [json.dumps(v, sort_keys=True) for v in values]
    twice = sorted({k for k in keys if keys.count(k) > 1})
    if twice:
        raise SystemExit(f"--candidates {path}: the same settings stand twice: {', '.join(twice)}")
    return values


def blend_values(values: dict[str, Any]) -> dict[str, Any]:
    """A candidate's blend settings (its study keys left out)."""
    return {key: value for key, value in values.items() if key not in STUDY_FIELDS}


def apply_candidate(base: BlendConfig, values: dict[str, Any]) -> BlendConfig:
    """`base` (the settings in force) with the candidate's values set (lists as the config's tuples)."""
    return base.replace(**blend_values(values))


def candidate_name(values: dict[str, Any], config: BlendConfig) -> str:
    """A short, stable name: the selector and ratio it runs with (`config`, the candidate applied), then
    every other value the candidate sets, in key order, e.g. `query@0.15 score_layers=6,12,18 sink_tokens=4`."""
    head = f"{config.selector}@{float(config.recompute_ratio)}"
    rest = []
    for key in sorted(set(values) - {"selector", "recompute_ratio"}):
        value = values[key]
        text = ",".join(str(x) for x in value) if isinstance(value, list | tuple) else str(value)
        rest.append(f"{key}={text}")
    return " ".join([head, *rest])


def describe(config: BlendConfig) -> dict[str, Any]:
    """The blend config a candidate ran with, JSON-ready (tuples as lists)."""
    return config.model_dump(mode="json")


def candidate_specs(engine: Engine, candidates: list[dict[str, Any]]) -> list[ModeSpec]:
    """One blend mode per candidate, on the blend settings in force for the engine's model."""
    from bench.passes import ModeSpec

    base = engine.settings.blend_config()
    specs = []
    for values in candidates:
        config = apply_candidate(base, values)
        stored_context = values.get("stored_context")
        specs.append(ModeSpec(candidate_name(values, config), "blend", config, stored_context=stored_context))
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise SystemExit(f"--candidates: two candidates run the same settings: {names}")
    return specs
