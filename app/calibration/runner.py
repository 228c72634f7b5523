"""The background calibration of a model served for the first time (once per model fingerprint).

It runs when the data dir holds no record for the engine's fingerprint and no shipped record was measured on
that very fingerprint. Each case of the calibration set is one piece of engine work handed to the scheduler's
worker when it is otherwise idle (`Scheduler.run_when_idle`), so questions go first; until it finishes the
blend runs on the shipped or safe settings. The record is written atomically under the data dir and its
settings (operator-set fields still winning) are swapped in for the next request.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from app.calibration.in_force import BlendInForce, resolve
from app.calibration.search import CASES_PER_KIND, RATIOS, CalibrationStopped, calibrate
from app.calibration.shipped import model_name, shipped_records
from app.calibration.store import CalibrationStore

if TYPE_CHECKING:
    from app.settings import Settings
    from engine.engine import Engine
    from engine.scheduler import Scheduler

logger = logging.getLogger(__name__)

State = Literal["pending", "running", "done", "failed", "stopped"]


@dataclass
class _Status:
    state: State = "pending"
    detail: str = ""
    candidates_done: int = 0
    record_path: str | None = None


def needs_calibration(engine: Engine, settings: Settings) -> str | None:
    """Why the served model needs calibrating (None: it does not)."""
    if CalibrationStore(settings.data_dir).load(engine.fingerprint) is not None:
        return None
    if any(r.fingerprint == engine.fingerprint for r in shipped_records(model_name(settings.engine.model))):
        return None
    return f"no calibration record for fingerprint {engine.fingerprint[:12]}"


class CalibrationRunner:
    def __init__(
        self,
        settings: Settings,
        engine: Engine,
        scheduler: Scheduler,
        *,
        adopt: Callable[[BlendInForce], None],
        ratios: tuple[float, ...] = RATIOS,
        cases_per_kind: tuple[int, int, int] = CASES_PER_KIND,
    ) -> None:
        """Calibrates `engine` on `scheduler`'s idle time; `adopt` puts the settings measured in force
        (`Services.adopt_blend`)."""
        self._settings, self._engine, self._scheduler, self._adopt = settings, engine, scheduler, adopt
        self._ratios, self._cases_per_kind = ratios, cases_per_kind
        self._status = _Status()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        reason = needs_calibration(self._engine, self._settings)
        if reason is None:
            self._set(state="done", detail="a calibration record of this model's fingerprint is in force")
            return
        logger.info("calibrating the blend settings in the background: %s", reason)
        self._set(state="running", detail=reason)
        self._thread = threading.Thread(target=self._run, name="blendrag-calibration", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def status(self) -> dict[str, Any]:
        with self._lock:
            return dict(vars(self._status))

    def _set(self, **changes: Any) -> None:
        with self._lock:
            for key, value in changes.items():
                setattr(self._status, key, value)

    def _run(self) -> None:
        from engine.scheduler import SchedulerStopped

        engine, settings = self._engine, self._settings
        done = 0

        def on_candidate(values: dict[str, Any], fig: Any, misses: list[str]) -> None:
            nonlocal done
            done += 1
            self._set(candidates_done=done, detail=f"measured {values}: {misses or 'meets the targets'}")

        try:
            record = calibrate(
                engine,
                settings.engine,
                settings.kvcache,
                model_name(settings.engine.model),
                ratios=self._ratios,
                cases_per_kind=self._cases_per_kind,
                execute=self._scheduler.run_when_idle,
                stop=self._stop,
                on_candidate=on_candidate,
            )
            path = CalibrationStore(settings.data_dir).save(record)
        except (CalibrationStopped, SchedulerStopped):
            self._set(state="stopped", detail="the server stopped before the calibration finished")
            return
        except Exception as exc:  # noqa: BLE001 - the server keeps serving on the settings it has
            logger.exception("calibration failed; the blend keeps its current settings")
            self._set(state="failed", detail=f"{type(exc).__name__}: {exc}")
            return
        in_force = resolve(settings.engine, engine.config.num_layers, calibrated=record)
        self._adopt(in_force)
        self._set(state="done", detail=in_force.label, record_path=str(path))
