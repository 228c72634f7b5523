"""`calibrate()`: the blend settings that meet the quality targets on a model at the least prompt time.

Candidates are tried from the cheapest up (recompute ratio ascending; at each ratio every scoring-layer
choice, at depths relative to the model's, since a fixed layer index is a different depth on each model).
The first ratio at which a candidate meets every target wins (among those that meet them there, the best KL, or
on a near-tie the one scoring at more layers: `preference_order`); the recompute budget is what a blend's prompt
time is made of, so the lowest ratio is the least time. When none meets them, the highest ratio's candidate whose
right answers fall least short of full prefill's is chosen (then the best KL), and the record says the targets
were missed.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

from app.calibration.calset import CASES_PER_KIND, describe, make_cases
from app.calibration.measure import CalibrationSet, CandidateFigures, Execute
from app.calibration.record import BlendSettingsRecord

if TYPE_CHECKING:
    from app.settings import Settings
    from engine.config import EngineSettings
    from engine.engine import Engine
    from kvcache.config import KVCacheSettings

logger = logging.getLogger(__name__)

T = TypeVar("T")

# From 0.15 up: on Qwen2.5-Coder-0.5B, 0.1 met every target on the set and fell 2 short of full prefill on the
# held-out look-ups through /ask (10 of 12 against 12; 0.15 gave 11), so the set's 8 look-ups cannot vouch for
# a budget that small (docs/benchmarks.md, "Blend settings per model").
RATIOS = (0.15, 0.2, 0.25, 0.3)
# Scoring layers as shares of the model's depth. The five-layer spread came from a held-out study on nq6
# (docs/benchmarks.md, "Token choice at equal budget"): on Qwen2.5-Coder-0.5B at ratio 0.15 it brought the
# first-token KL from 0.29x reuse's (layers 6/12/18) to 0.14x, below query@0.25's 0.17x; sink tokens, a
# minimum per chunk, value-weighted scores, max fusion and pooling did not move it beyond noise.
LAYER_DEPTHS = ((0.4,), (0.25, 0.5, 0.75), (0.17, 0.33, 0.5, 0.67, 0.83))
HISTORY_RATIO = 1.0  # a conversation's earlier turns recomputed whole (docs/benchmarks.md, conversations)
# The stale-key bias tried beside none at every ratio and scoring choice. It costs no prompt time, so where it
# measures better at a ratio it wins there; on held-out nq6 0.5 cut SmolLM2's first-token KL by a third at
# 0.15 (docs/benchmarks.md, "Stale keys").
STALE_KEY_BIASES = (0.0, 0.5)
# Calibration-set KL ÷ reuse's within this of the best is a tie, and the candidate scoring at more layers goes
# first. Twice the best KL chose three scoring layers over a five-layer candidate 0.002-0.004 behind it, and the
# three-layer choice then missed a check part the five-layer one met (Qwen2.5-Coder-0.5B bfloat16 at 0.15, the
# 1.5B's at 0.2: docs/benchmarks.md, "Near-ties"); the set's 8-case parts cannot tell such gaps from noise.
KL_NEAR_TIE = 0.01


class CalibrationStopped(RuntimeError):
    """The calibration was asked to stop (the server is shutting down)."""


@dataclass(frozen=True)
class Targets:
    kl_x_reuse_max: float = 0.35  # first-token KL ÷ reuse's
    benefit_min: float = 0.95  # context benefit retained
    right_within: int = 1  # right answers per kind at most this many fewer than full prefill's

    def shortfall(self, fig: CandidateFigures) -> int:
        """Right answers short of full prefill's beyond the tolerance, summed over kinds (0: every kind holds)."""
        return sum(max(0, fig.full_right[kind] - self.right_within - right) for kind, right in fig.right.items())

    def misses(self, fig: CandidateFigures) -> list[str]:
        out = []
        if fig.kl_x_reuse > self.kl_x_reuse_max:
            out.append(f"KL {fig.kl_x_reuse:.2f}x reuse > {self.kl_x_reuse_max}")
        if fig.benefit < self.benefit_min:
            out.append(f"benefit {fig.benefit:.2f} < {self.benefit_min}")
        for kind, right in fig.right.items():
            if right < fig.full_right[kind] - self.right_within:
                out.append(f"{kind} {right} vs full {fig.full_right[kind]}")
        return out


def score_layers_at(depths: tuple[float, ...], num_layers: int) -> list[int]:
    """Layer indices at these shares of the depth (distinct, ascending, at least layer 1)."""
    return sorted({min(num_layers - 1, max(1, round(d * num_layers))) for d in depths})


def candidates(num_layers: int, ratios: tuple[float, ...] = RATIOS) -> list[dict[str, Any]]:
    """The blend settings tried, cheapest first (each scoring choice without, then with the stale-key bias);
    on a shallow model two depth choices can fall on the same layers, and those are tried once."""
    layer_choices: list[list[int]] = []
    for depths in LAYER_DEPTHS:
        layers = score_layers_at(depths, num_layers)
        if layers not in layer_choices:
            layer_choices.append(layers)
    return [
        {
            "selector": "query",
            "recompute_ratio": ratio,
            "score_layers": layers,
            "history_ratio": HISTORY_RATIO,
            "stale_key_bias": bias,
        }
        for ratio in ratios
        for layers in layer_choices
        for bias in STALE_KEY_BIASES
    ]


def calibrate(
    engine: Engine,
    engine_settings: EngineSettings,
    kv_settings: KVCacheSettings,
    model: str,
    *,
    ratios: tuple[float, ...] = RATIOS,
    targets: Targets | None = None,
    cases_per_kind: tuple[int, int, int] = CASES_PER_KIND,
    execute: Execute | None = None,
    stop: threading.Event | None = None,
    on_candidate: Callable[[dict[str, Any], CandidateFigures, list[str]], None] | None = None,
    tried_values: list[dict[str, Any]] | None = None,
    fixed: dict[str, Any] | None = None,
) -> BlendSettingsRecord:
    """Measure the candidates on the generated set and return the record of the chosen settings.

    `engine_settings` gives everything but the candidate's fields (sampling, the non-blend settings).
    `execute` runs each case's engine work (the server's engine worker); `stop` aborts between cases.
    `tried_values` replaces the search's candidates (a study of other selectors or options: each one is
    measured, in the order given, none skipped; `choose` picks among those meeting the targets, or among all
    when none does). `fixed`: blend settings every candidate carries (`fixed_values`), so the record
    ships them beside what the search chose.
    """
    targets = targets or Targets()
    cases = make_cases(*cases_per_kind)
    calset = CalibrationSet(engine, cases, kv_settings, execute=_stoppable(execute, stop))
    started = datetime.now(UTC)
    calset.prepare()
    tried: list[dict[str, Any]] = []
    passing: list[tuple[dict[str, Any], CandidateFigures]] = []
    last_ratio: list[tuple[dict[str, Any], CandidateFigures]] = []
    current_ratio = None
    study = tried_values is not None
    for values in tried_values if study else candidates(engine.config.num_layers, ratios):
        if not study and current_ratio is not None and values["recompute_ratio"] != current_ratio:
            if passing:
                break
            last_ratio = []
        current_ratio = values.get("recompute_ratio")
        values = values | (fixed or {})
        blend = engine_settings.blend.replace(**values)
        fig = calset.measure(blend)
        misses = targets.misses(fig)
        tried.append({"values": values, "figures": fig.to_dict(), "misses": misses})
        logger.info("calibration: %s → %s %s", values, fig.to_dict(), misses or "meets the targets")
        if on_candidate is not None:
            on_candidate(values, fig, misses)
        last_ratio.append((values, fig))
        if not misses:
            passing.append((values, fig))
    chosen, fig = choose(passing, last_ratio, targets)
    return BlendSettingsRecord(
        model=model,
        fingerprint=engine.fingerprint,
        compute_dtype=str(engine.dtype).removeprefix("torch."),
        values=chosen,
        calibrated_at=started.isoformat(timespec="seconds"),
        calibration_set=describe(cases),
        measured={
            "targets_met": bool(passing),
            "targets": {
                "kl_x_reuse_max": targets.kl_x_reuse_max,
                "benefit_min": targets.benefit_min,
                "right_within": targets.right_within,
            },
            "kv_storage_dtype": kv_settings.storage_dtype,
            "chunk_lead_in": engine.settings.chunk_lead_in,  # the prompts' lead-in (engine/prompt.py)
            "chosen": fig.to_dict(),
            "tried": tried,
        },
    )


def preference_order(
    items: Sequence[T], kl_x_reuse: Callable[[T], float], values: Callable[[T], dict[str, Any]]
) -> list[T]:
    """Candidates that met the targets, the one to ship first: those within `KL_NEAR_TIE` of the best KL ahead
    of the rest, more scoring layers first among them, then by KL (the input order breaks exact ties)."""
    if not items:
        return []
    best = min(kl_x_reuse(item) for item in items)

    def key(item: T) -> tuple[bool, int, float]:
        near = kl_x_reuse(item) <= best + KL_NEAR_TIE
        return (not near, -len(values(item).get("score_layers") or []) if near else 0, kl_x_reuse(item))

    return sorted(items, key=key)


def order_tried(entries: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """A record's `measured.tried` entries (values, figures, misses) in `preference_order`."""
    return preference_order(entries, lambda t: t["figures"]["kl_x_reuse"], lambda t: t["values"])


def choose(
    passing: list[tuple[dict[str, Any], CandidateFigures]],
    last_ratio: list[tuple[dict[str, Any], CandidateFigures]],
    targets: Targets,
) -> tuple[dict[str, Any], CandidateFigures]:
    """The first of the candidates meeting every target by `preference_order`; when none does, the highest
    ratio's candidate whose answers fall least short of full prefill's (what a user sees), the best KL among
    those."""
    if passing:
        return preference_order(passing, lambda vf: vf[1].kl_x_reuse, lambda vf: vf[0])[0]
    return min(last_ratio, key=lambda vf: (targets.shortfall(vf[1]), vf[1].kl_x_reuse))


def _stoppable(execute: Execute | None, stop: threading.Event | None) -> Execute:
    run: Execute = execute or (lambda work: work())

    def guarded(work: Callable[[], Any]) -> Any:
        if stop is not None and stop.is_set():
            raise CalibrationStopped("calibration stopped")
        return run(work)

    return guarded


SEARCHED = tuple(candidates(num_layers=1, ratios=RATIOS[:1])[0])  # the keys every candidate sets


def fixed_values(items: list[str]) -> dict[str, Any]:
    """`KEY=VALUE` items (a blend setting and its value: JSON, or a bare word for a string) as the blend settings
    a calibration holds fixed; refused (ValueError) for a key that is no blend setting, one the search itself
    chooses, or a value the setting does not take."""
    from engine.blend.config import BlendConfig

    fixed: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or key not in BlendConfig.model_fields:
            raise ValueError(f"expected BLEND_SETTING=VALUE, got {item!r}")
        if key in SEARCHED:
            raise ValueError(f"{key} is what the calibration searches; it cannot be held fixed")
        try:
            fixed[key] = json.loads(text)
        except ValueError:
            fixed[key] = text
    BlendConfig(**fixed)  # a value the setting does not take is refused here, before any model loads
    return fixed


def parse_ratios(text: str) -> tuple[float, ...]:
    ratios = tuple(sorted({float(x) for x in text.split(",") if x.strip()}))
    if not ratios or any(not 0.0 < r <= 1.0 for r in ratios):
        raise ValueError(f"ratios must be a comma-separated list within (0, 1], got {text!r}")
    return ratios


def run_calibration(
    settings: Settings,
    *,
    ratios: tuple[float, ...] = RATIOS,
    cases_per_kind: tuple[int, int, int] = CASES_PER_KIND,
    save: bool = True,
    tried_values: list[dict[str, Any]] | None = None,
    fixed: dict[str, Any] | None = None,
) -> tuple[BlendSettingsRecord, Engine]:
    """`blendrag calibrate` and `python -m bench calibrate`: load the model of `settings`, calibrate it and
    (with `save`) keep the record under the data dir, where the server finds it at its next start."""
    from app.calibration.shipped import model_name
    from app.calibration.store import CalibrationStore
    from app.engine_loader import load_engine

    engine = load_engine(settings)  # as the server on this data dir loads it: the same compute dtype
    record = calibrate(
        engine,
        settings.engine,
        settings.kvcache,
        model_name(settings.engine.model),
        ratios=ratios,
        cases_per_kind=cases_per_kind,
        tried_values=tried_values,
        fixed=fixed,
    )
    if save:
        path = CalibrationStore(settings.data_dir).save(record)
        logger.info("calibration record written to %s", path)
    return record, engine
