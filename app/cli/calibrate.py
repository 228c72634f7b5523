"""`blendrag calibrate`: measure the blend settings of the configured model (registered by app/cli/__init__.py).

Runs the same code as `python -m bench calibrate` and as the server's background calibration
(app/calibration/search.py) and keeps the record under the data dir (`<data dir>/calibration/<fingerprint>.json`),
where a server on that data dir finds it at its next start. Settings the operator set still win over it.
"""

from __future__ import annotations

import argparse
import sys

from app.cli.common import EXIT_USAGE, add_data_dir
from app.settings import load_settings


def cmd_calibrate(args: argparse.Namespace) -> int:
    from app.calibration.search import CASES_PER_KIND, RATIOS, parse_ratios, run_calibration

    try:
        ratios = parse_ratios(args.ratios) if args.ratios else RATIOS
        cases = tuple(int(x) for x in args.cases.split(",")) if args.cases else CASES_PER_KIND
        if len(cases) != 3 or min(cases) < 0 or sum(cases) == 0:
            raise ValueError(f"--cases takes three counts (look-ups, two-hop, follow-ups), got {args.cases!r}")
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    settings = load_settings(data_dir=getattr(args, "data_dir", None))
    print(f"calibrating {settings.engine.model} at ratios {', '.join(map(str, ratios))} (minutes on a CPU) …")
    record, _ = run_calibration(settings, ratios=ratios, cases_per_kind=cases, save=not args.dry_run)  # type: ignore[arg-type]
    measured = record.measured
    for tried in measured["tried"]:
        fig = tried["figures"]
        print(
            f"  {tried['values']}: KL {fig['kl_x_reuse']:.2f}x reuse, benefit {fig['benefit']:.2f}, right "
            f"{fig['right']} (full {fig['full_right']}), {fig['speedup']:.2f}x faster than full"
            + (f" — misses: {'; '.join(tried['misses'])}" if tried["misses"] else " — meets the targets")
        )
    verdict = "meets the targets" if measured["targets_met"] else "NO candidate met the targets; the safest is kept"
    print(f"chosen: {record.values} ({verdict})")
    if args.dry_run:
        print("not saved (--dry-run)")
    else:
        print(f"saved for fingerprint {record.fingerprint[:12]} under {settings.data_dir / 'calibration'}")
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    from app.calibration.search import CASES_PER_KIND, RATIOS

    p = sub.add_parser("calibrate", help="measure the blend settings of the configured model and keep them")
    ratios, cases = ",".join(map(str, RATIOS)), ",".join(map(str, CASES_PER_KIND))
    p.add_argument("--ratios", default=None, help=f"recompute ratios to try, comma-separated (default {ratios})")
    p.add_argument("--cases", default=None, help=f"look-ups,two-hop,follow-ups in the set (default {cases})")
    p.add_argument("--dry-run", action="store_true", help="measure and print, keep nothing")
    add_data_dir(p)
    p.set_defaults(func=cmd_calibrate)
