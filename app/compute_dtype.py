"""The compute dtype a data dir was built with, kept across restarts.

The compute dtype is part of the model fingerprint, so of every KV entry's key: a start that computes in
another dtype than the one before finds every stored chunk without fresh KV. `engine.dtype: auto` therefore
resolves once per data dir (from the device's capabilities, engine/dtype_choice.py) and the result is written
to `<data_dir>/compute_dtype.json`; later starts with `auto` on the same kind of device keep it. Only an
operator's explicit `engine.dtype` (or a move to another device kind) changes it, and that is logged, with
what it means for the stored KV.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from engine.dtype_choice import DtypeChoice, choose_compute_dtype
from fsio.atomic import write_text_atomic

logger = logging.getLogger(__name__)

RECORD_FILE = "compute_dtype.json"


@dataclass(frozen=True)
class DtypeRecord:
    """What `compute_dtype.json` holds: the dtype, and the device kind ("cpu", "cuda") it was chosen for."""

    dtype: str
    device: str

    @classmethod
    def read(cls, path: Path) -> DtypeRecord | None:
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
            return cls(dtype=str(raw["dtype"]), device=str(raw["device"]))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            logger.warning("ignoring unreadable %s (%s); the compute dtype is chosen again", path, exc)
            return None

    def write(self, path: Path) -> None:
        """Atomically (a temp file, then rename); a failure (a full disk) is logged, never fatal."""
        try:
            write_text_atomic(path, json.dumps({"dtype": self.dtype, "device": self.device}) + "\n")
        except OSError as exc:
            logger.warning("could not record the compute dtype in %s: %s", path, exc)


def _device_kind(device: str) -> str:
    return device.split(":", 1)[0]


def data_dir_dtype(data_dir: Path, requested: str, device: str) -> DtypeChoice:
    """The compute dtype for a server on `data_dir`: `requested` when explicit, else the recorded one on the
    same device kind, else the device's (then recorded)."""
    path = data_dir / RECORD_FILE
    recorded = DtypeRecord.read(path)
    kind = _device_kind(device)
    if requested == "auto" and recorded is not None and recorded.device == kind:
        return DtypeChoice(
            recorded.dtype,
            f"kept from the data dir ({RECORD_FILE}: built in {recorded.dtype} on {kind}; "
            "set engine.dtype to change it)",
            requested,
        )
    choice = choose_compute_dtype(requested, device)
    if recorded is not None and recorded.dtype != choice.dtype:
        logger.warning(
            "the data dir was built computing in %s on %s; now %s (%s): KV entries stored in the old dtype no "
            "longer match (a chunk without fresh KV is recomputed)",
            recorded.dtype,
            recorded.device,
            choice.dtype,
            choice.reason,
        )
    if recorded != DtypeRecord(choice.dtype, kind):
        DtypeRecord(choice.dtype, kind).write(path)
    return choice
