"""`bench ship --resume`: an earlier run's steps put back in place instead of measured again.

A gate's calibration is its costliest step (the 1.5B's: about 40 minutes on two cores) and its result file holds
the whole record it wrote. With `--resume`, when that file (beside `--out`, the name the step would write) is one
this run would make, its record goes into the shipped record's place and the step is not run: the same model
weights and compute dtype (the fingerprint, which also changes with the engine's numerics version), the same
calibration set, this ratio alone, the held-fixed settings (`--with`) in every candidate, the server's KV storage
dtype and no lead-in. Anything else is measured again, the reason logged.

A check part (5-25 minutes each) is taken back the same way from its receipt: after each check part the gate writes
into its result file what it ran on (its command line, the record's fingerprint and blend settings) and what it
found (its exit code and, when it held, the entry it wrote into the record). With `--resume`, a check part whose
receipt names this step's command line and the record's fingerprint and settings as they are now is not run: a
pass puts its entry back into the record, a miss is a miss again. A pass is judged again by its part's target as it
is today, from the figures its entry holds (`entry_misses` of app/calibration/check_parts.py's part: the held-out
target gained the answers' gold F1 after such passes were written). Other code changes to the benches between the
two runs are not seen; run without `--resume` after one.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from app.calibration.record import BlendSettingsRecord

logger = logging.getLogger(__name__)

RECEIPT_KEY = "ship_receipt"  # the key of a check part's result file that holds the gate's receipt


def calibration_mismatch(
    result: dict[str, Any],
    *,
    model: str,
    compute_dtype: str,
    calibration_set: str,
    ratio: float,
    fixed: dict[str, Any],
    kv_dtype: str,
    fingerprint: Callable[[], str],
) -> str | None:
    """Why a `bench calibrate` result cannot stand for the calibration this run would measure; None when it can.
    `fingerprint` is asked last (it loads the model's weights)."""
    record = result.get("record")
    if result.get("benchmark") != "calibrate" or not isinstance(record, dict):
        return "not a calibration result"
    measured = record.get("measured", {})
    checks = [
        ("model", record.get("model"), model),
        ("compute dtype", record.get("compute_dtype"), compute_dtype),
        ("calibration set", record.get("calibration_set"), calibration_set),
        ("KV storage dtype", measured.get("kv_storage_dtype"), kv_dtype),
        ("lead-in", measured.get("chunk_lead_in"), False),
    ]
    for what, found, wanted in checks:
        if found != wanted:
            return f"{what} {found!r}, this run's is {wanted!r}"
    tried = measured.get("tried") or []
    if not tried:
        return "no candidate measured"
    ratios = sorted({t["values"].get("recompute_ratio") for t in tried})
    if ratios != [ratio]:
        return f"measured ratios {ratios}, this step's is {ratio:g} alone"
    for key, value in fixed.items():
        if any(t["values"].get(key) != value for t in tried):
            return f"candidates without {key}={value!r} (held fixed in this run)"
    if record.get("fingerprint") != (now := fingerprint()):
        return f"measured on fingerprint {str(record.get('fingerprint'))[:12]}, these weights are {now[:12]}"
    return None


def rechoose(record: BlendSettingsRecord) -> BlendSettingsRecord:
    """The record with the candidate today's rule (`preference_order`) puts first among those that met the
    targets: a calibration from before a change of the rule is taken back as the calibration would make it now."""
    from app.calibration.search import order_tried

    tried = record.measured.get("tried") or []
    # Its own choice listed first: the order is stable, so a tie on the record's rounded figures keeps it.
    passing = sorted((t for t in tried if not t["misses"]), key=lambda t: t["values"] != record.values)
    if not passing:
        return record  # none met the targets: the fallback choice's rule has not changed
    first = order_tried(passing)[0]
    if first["values"] == record.values:
        return record
    logger.info(
        "--resume: today's choice among the calibration's candidates is %s (it chose %s)",
        first["values"],
        record.values,
    )
    measured = record.measured | {"chosen": first["figures"]}
    return dataclasses.replace(record, values=first["values"], measured=measured)


def model_fingerprint(args: argparse.Namespace) -> str:
    """The engine's fingerprint for `--model` in `--dtype` (weights and numerics version), loading the weights
    once without building an engine."""
    from bench.harness import default_models_dir
    from engine.model import load_model
    from engine.models.resolve import resolve_model

    resolved = resolve_model(str(args.model), Path(args.models_dir or default_models_dir()))
    return load_model(resolved.path, dtype=args.dtype).fingerprint


def reuse_calibration(
    args: argparse.Namespace, result_file: Path, record_path: Path, ratio: float, fingerprint: Callable[[], str]
) -> bool:
    """Put the record of the calibration result at `result_file` where the check parts read it (`record_path`)
    when it stands for this run's calibration at `ratio`; False (the reason logged) when it does not."""
    from app.calibration.calset import describe, make_cases
    from app.calibration.record import BlendSettingsRecord
    from app.calibration.search import fixed_values
    from app.calibration.shipped import model_name
    from bench.calibrate import parse_cases
    from bench.harness import server_kv_dtype
    from fsio.atomic import write_text_atomic

    if not result_file.is_file():
        return False
    try:
        result = json.loads(result_file.read_text(encoding="utf-8"))
    except ValueError as exc:
        logger.warning("--resume: %s is no JSON (%s): calibrating again", result_file.name, exc)
        return False
    why = calibration_mismatch(
        result,
        model=model_name(str(args.model)),
        compute_dtype=args.dtype,
        calibration_set=describe(make_cases(*parse_cases(args.cases))),
        ratio=ratio,
        fixed=fixed_values(args.fixed),
        kv_dtype=server_kv_dtype(),
        fingerprint=fingerprint,
    )
    if why is not None:
        logger.warning("--resume: %s is not this run's calibration (%s): calibrating again", result_file.name, why)
        return False
    record = rechoose(BlendSettingsRecord.from_json(json.dumps(result["record"])))
    write_text_atomic(record_path, record.to_json())
    logger.info("--resume: the calibration at %g from %s (%s) is in the record", ratio, result_file.name, record.values)
    return True


def write_receipt(step_name: str, argv: list[str], rc: int, result_file: Path, record_path: Path) -> bool:
    """Write into a check part's result file what it ran on and found (`RECEIPT_KEY`); False when there is no
    result or record to read (a step that failed before writing one is run again by `--resume`)."""
    from app.calibration.record import BlendSettingsRecord
    from bench.harness import write_json

    try:
        result = json.loads(result_file.read_text(encoding="utf-8"))
        record = BlendSettingsRecord.from_json(record_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    entry = record.measured.get(step_name) if rc == 0 else None
    if not isinstance(result, dict) or (rc == 0 and entry is None):
        return False  # a pass that wrote no entry: nothing --resume could put back
    result[RECEIPT_KEY] = {
        "argv": argv,
        "rc": rc,
        "fingerprint": record.fingerprint,
        "values": record.values,
        "entry": entry,
    }
    write_json(result_file, result)  # as the bench wrote it, the receipt added
    return True


def check_mismatch(receipt: Any, argv: list[str], record: BlendSettingsRecord) -> str | None:
    """Why a check part's receipt cannot stand for this step on the record as it is now; None when it can."""
    if not isinstance(receipt, dict):
        return "no receipt"
    if receipt.get("argv") != argv:
        return "another command line"
    if receipt.get("fingerprint") != record.fingerprint:
        found = str(receipt.get("fingerprint"))[:12]
        return f"measured on fingerprint {found}, the record's is {record.fingerprint[:12]}"
    if receipt.get("values") != record.values:
        return f"ran on {receipt.get('values')}, the record holds {record.values}"
    if receipt.get("rc") != 0 and receipt.get("entry") is not None:
        return "a miss with an entry"
    return None


def todays_misses(step_name: str, entry: Any) -> list[str]:
    """What a passing check part's entry misses by its part's target as it is today, in words (empty when it meets
    it). A step that is no check part, or an entry that is no mapping, cannot be judged: it misses."""
    from app.calibration.check_parts import find_part

    part = find_part(step_name)
    if part is None:
        return [f"{step_name} is no check part"]
    if not isinstance(entry, dict):
        return ["its entry is no mapping"]
    return part.judge(entry)


def reuse_check(step_name: str, argv: list[str], result_file: Path, record_path: Path) -> int | None:
    """The exit code of this check part's earlier run when its receipt stands for this step (a pass's entry put
    back into the record at `record_path`); None, the reason logged, when the step has to run."""
    from app.calibration.check_record import write_check
    from app.calibration.record import BlendSettingsRecord

    if not result_file.is_file():
        return None
    try:
        receipt = json.loads(result_file.read_text(encoding="utf-8")).get(RECEIPT_KEY)
        record = BlendSettingsRecord.from_json(record_path.read_text(encoding="utf-8"))
    except (OSError, ValueError, AttributeError) as exc:
        logger.warning("--resume: %s cannot be read back (%s): running it again", result_file.name, exc)
        return None
    why = check_mismatch(receipt, argv, record)
    if why is not None:
        logger.warning("--resume: %s is not this step's result (%s): running it again", result_file.name, why)
        return None
    if receipt["rc"] == 0 and (misses := todays_misses(step_name, receipt["entry"])):
        logger.warning(
            "--resume: %s from %s met the target of its time and misses today's (%s): missed",
            step_name,
            result_file.name,
            "; ".join(misses),
        )
        return 1
    if receipt["rc"] == 0:
        write_check(step_name, receipt["entry"], record.model, record.compute_dtype, record.fingerprint, ValueError)
    logger.info("--resume: %s from %s (%s)", step_name, result_file.name, "met" if receipt["rc"] == 0 else "missed")
    return int(receipt["rc"])
